package launch

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// lineSignal sends on ch for every line written that contains word.
type lineSignal struct {
	word string
	ch   chan struct{}
}

func (w lineSignal) Write(p []byte) (int, error) {
	if strings.Contains(string(p), w.word) {
		w.ch <- struct{}{}
	}
	return len(p), nil
}

// TestRunInterrupted cancels the context of a running job: Run stops the
// ranks and says the job was interrupted, not that a rank failed, whether
// the ranks die of the SIGTERM or exit 0 on it.
func TestRunInterrupted(t *testing.T) {
	for _, tc := range []struct{ name, script string }{
		{"killed by SIGTERM", "echo up; exec sleep 20"},
		{"exits 0 on SIGTERM", "trap 'exit 0' TERM; echo up; sleep 20 & wait"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 2
			up := lineSignal{"up", make(chan struct{}, n)}
			cause := errors.New("test cancelled the job")
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			done := make(chan error, 1)
			go func() {
				done <- Run(ctx, Spec{N: n, Prog: "sh", Args: []string{"-c", tc.script}, Prefix: true,
					Stdout: up, Stderr: io.Discard, Grace: 5 * time.Second})
			}()
			for range n {
				select {
				case <-up.ch:
				case err := <-done:
					t.Fatalf("Run returned before the ranks were up: %v", err)
				case <-time.After(10 * time.Second):
					t.Fatal("ranks not up within 10s")
				}
			}
			cancel(cause)
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return within 10s of the cancel")
			}
			var re *RankError
			if !errors.Is(err, ErrInterrupted) || !errors.Is(err, cause) || errors.As(err, &re) {
				t.Errorf("Run: %v, want ErrInterrupted wrapping the cause and no RankError", err)
			}
		})
	}
}

// TestRunRankFailure: a rank that fails on its own is reported by rank and
// exit status.
func TestRunRankFailure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := Run(ctx, Spec{N: 2, Prog: "sh", Args: []string{"-c", `[ "$A2A_RANK" = 1 ] && exit 3; exec sleep 20`},
		Stdout: io.Discard, Stderr: io.Discard})
	var re *RankError
	if !errors.As(err, &re) || re.Rank != 1 || re.State != "exit status 3" || errors.Is(err, ErrInterrupted) {
		t.Errorf("Run: %v, want rank 1 failed with exit status 3", err)
	}
}

// TestRunExpendable: with Expendable, a rank killed by a signal lets the
// others finish and Run succeed; a second death, or an error exit, still
// fails the job.
func TestRunExpendable(t *testing.T) {
	tests := []struct {
		name       string
		script     string
		expendable int
		wantRank   int // -1: Run succeeds
	}{
		{"one killed, one allowed", `[ "$A2A_RANK" = 1 ] && kill -9 $$; sleep 0.3`, 1, -1},
		{"one killed, none allowed", `[ "$A2A_RANK" = 1 ] && kill -9 $$; exec sleep 20`, 0, 1},
		{"two killed, one allowed", `[ "$A2A_RANK" != 0 ] && kill -9 $$; exec sleep 20`, 1, -2},
		{"error exit", `[ "$A2A_RANK" = 2 ] && exit 3; exec sleep 20`, 1, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var stderr strings.Builder
			err := Run(ctx, Spec{N: 3, Prog: "sh", Args: []string{"-c", tc.script}, Expendable: tc.expendable,
				Stdout: io.Discard, Stderr: &stderr})
			var re *RankError
			switch {
			case tc.wantRank == -1:
				if err != nil || !strings.Contains(stderr.String(), "rank 1 killed by signal killed; the others carry on") {
					t.Errorf("Run: %v, stderr %q; want success and the loss reported", err, stderr.String())
				}
			case tc.wantRank == -2:
				if !errors.As(err, &re) || (re.Rank != 1 && re.Rank != 2) {
					t.Errorf("Run: %v, want the second killed rank as the failure", err)
				}
			default:
				if !errors.As(err, &re) || re.Rank != tc.wantRank {
					t.Errorf("Run: %v, want rank %d failed", err, tc.wantRank)
				}
			}
		})
	}
}

// TestNewGroupAndSecret: fresh names and secrets have their documented
// shape and differ from call to call.
func TestNewGroupAndSecret(t *testing.T) {
	hexDigits := func(s string, n int) bool {
		if len(s) != n {
			return false
		}
		for _, c := range s {
			if !strings.ContainsRune("0123456789abcdef", c) {
				return false
			}
		}
		return true
	}
	g1, g2 := NewGroup("job"), NewGroup("job")
	if !strings.HasPrefix(g1, "job-") || !hexDigits(strings.TrimPrefix(g1, "job-"), 12) || g1 == g2 {
		t.Errorf("NewGroup(\"job\") = %q, then %q: want job- and 12 fresh hex digits", g1, g2)
	}
	s1, s2 := NewSecret(), NewSecret()
	if !hexDigits(s1, 32) || s1 == s2 {
		t.Errorf("NewSecret() = %q, then %q: want 32 fresh hex digits", s1, s2)
	}
}
