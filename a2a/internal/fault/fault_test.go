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

func TestErrorNamesRanks(t *testing.T) {
	for _, tc := range []struct {
		err  *Error
		want string
	}{
		{New(ErrPeerLost, -1, "gone"), "a2a: peer lost: gone"},
		{New(ErrPeerLost, 2, "gone"), "a2a: peer lost (rank 2): gone"},
		{&Error{Kind: ErrTimeout, Rank: 2, Ranks: []int{2, 5}, Detail: "late"}, "a2a: timeout (ranks 2, 5): late"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
	if got := RanksText(nil) + "/" + RanksText([]int{3}) + "/" + RanksText([]int{1, 4, 6}); got != "no rank/rank 3/ranks 1, 4, 6" {
		t.Errorf("RanksText: %q", got)
	}
}
