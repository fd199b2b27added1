package a2a

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestLLErrorsSayWhatLLIs: the errors of the small-message exchange (LL)
// that reach users name the rank, say what LL is and what to fix.
func TestLLErrorsSayWhatLLIs(t *testing.T) {
	url := startNATS(t)
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, c *Comm) error
		want []string
	}{
		{"counts disagree", func(ctx context.Context, c *Comm) error {
			send, recv := []int{4, 4}, []int{4, 4}
			if c.Rank() == 0 {
				recv[1] = 3
			}
			return c.AllToAllV(ctx, make([]byte, 8), send, make([]byte, 7+c.Rank()), recv)
		}, []string{"(rank 1)", "small-message exchange (LL) from rank 1: it sends 4 bytes, this rank expects 3: recvCounts must equal what the sender passes in sendCounts"}},
		{"different collectives", func(ctx context.Context, c *Comm) error {
			if c.Rank() == 0 {
				return c.AllToAll(ctx, make([]byte, 2), make([]byte, 2))
			}
			return c.Barrier(ctx)
		}, []string{"small-message exchange (LL) from rank ", ": the ranks call different collectives, or in a different order"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := group(t, url, 2, func(c *Config) { c.Algo = "ll" })
			errs := onAll(comms, func(c *Comm) error {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				return tc.call(ctx, c)
			})
			// The rank that saw the mismatch itself (the other is aborted
			// by it) explains it.
			r := 0
			if errors.Is(errs[0], ErrAborted) {
				r = 1
			}
			err := errs[r]
			if !errors.Is(err, ErrMismatch) || errors.Is(err, ErrAborted) {
				t.Fatalf("rank %d: %v, want ErrMismatch", r, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("rank %d: %q lacks %q", r, err, w)
				}
			}
		})
	}
}
