package transporttest

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Logger routes a transport's logs (Info and above) into t's log, so that a
// failing test shows what the transport saw, such as which connections it
// refused and why.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(LogWriter(t), &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// LogWriter returns a writer that logs each write to t, for a logger or a
// helper process's stderr.
func LogWriter(t testing.TB) io.Writer { return tWriter{t} }

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	// t.Log adds its own newline.
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// WaitFor polls cond until it holds or d passes, and reports whether it
// held. Tests use it for effects that land on another goroutine's schedule.
func WaitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}
