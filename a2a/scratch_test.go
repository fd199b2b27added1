package a2a

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/a2a-moe/a2a/a2a/transport"
)

// sharedFDs counts this process's descriptors of shareable mappings
// (memfds named transport.SharedPrefix).
func sharedFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		link, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err == nil && strings.HasPrefix(link, "/memfd:"+transport.SharedPrefix) {
			n++
		}
	}
	return n
}

// TestSharedScratchFreed checks that a ReduceScatter ring above 2 ranks
// gets shareable scratch (its partial sums are then reduced in place by
// the peers, counted by TestRegisteredCollectives), that a larger one
// replaces it without keeping the old, and that Close frees it: no
// shareable mapping outlives the communicators.
func TestSharedScratchFreed(t *testing.T) {
	url := startNATS(t)
	ctx := context.Background()
	base := sharedFDs(t)
	const n = 3
	comms := group(t, url, n, nil)
	for _, block := range []int{128 << 10, 1 << 20} { // the second grows the scratch
		mustAll(t, onAll(comms, func(c *Comm) error {
			send := make([]byte, n*block)
			for i := range send {
				send[i] = byte(c.Rank() + 1)
			}
			recv := make([]byte, block)
			if err := c.ReduceScatter(ctx, send, recv, Uint8, Sum); err != nil {
				return err
			}
			for i, b := range recv {
				if b != 1+2+3 {
					t.Errorf("rank %d, byte %d: %d, want 6", c.Rank(), i, b)
					break
				}
			}
			return nil
		}))
		if got := sharedFDs(t) - base; got != n {
			t.Errorf("block %d: %d shareable mappings open, want %d (one scratch a rank)", block, got, n)
		}
	}
	for _, c := range comms {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}
	if got := sharedFDs(t) - base; got != 0 {
		t.Errorf("%d shareable mappings left after Close", got)
	}
}
