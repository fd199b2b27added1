package fault

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
)

func TestLogLevel(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want slog.Level
	}{
		{Wrap(ErrAborted, -1, context.Canceled, "context canceled"), slog.LevelInfo},
		{fmt.Errorf("aborted: %w", Wrap(ErrAborted, 2, context.Canceled, "context canceled")), slog.LevelInfo},
		{Wrap(ErrTimeout, -1, context.DeadlineExceeded, "context deadline"), slog.LevelWarn},
		{New(ErrPeerLost, 1, "rank 1 exited"), slog.LevelWarn},
		{New(ErrAborted, 3, "aborted by the application"), slog.LevelWarn},
	} {
		if got := LogLevel(tc.err); got != tc.want {
			t.Errorf("LogLevel(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
