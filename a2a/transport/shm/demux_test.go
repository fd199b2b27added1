package shm

import (
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

func asTransports(ts []*Transport) []transport.Transport {
	out := make([]transport.Transport, len(ts))
	for i, t := range ts {
		out[i] = t
	}
	return out
}

// TestSharedConns runs a root communicator and a child over the same rings
// at once (transport.Demux), in every transfer mode, with frames larger
// than a ring, and checks every byte.
func TestSharedConns(t *testing.T) {
	for _, tc := range []struct{ n, streams, zcopy int }{{2, 1, ringOnly}, {3, 2, cmaAll}, {3, 1, 4096}} {
		ts := newCluster(t, tc.n, tc.streams, tc.zcopy)
		if err := transporttest.SharedExchange(asTransports(ts), 10, 20*time.Second); err != nil {
			t.Fatalf("%s, %d ranks, %d streams: %v", modeName(tc.zcopy), tc.n, tc.streams, err)
		}
	}
}

// TestSharedMismatch: a child's mismatch fails the child, not the root.
func TestSharedMismatch(t *testing.T) {
	if err := transporttest.SharedMismatch(asTransports(newCluster(t, 2, 1, ringOnly)), 10*time.Second); err != nil {
		t.Fatal(err)
	}
}
