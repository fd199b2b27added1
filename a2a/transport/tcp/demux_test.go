package tcp

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

// TestSharedConns runs a root communicator and a child over the same TCP
// streams at once (transport.Demux), with frames larger than the socket
// buffers, and checks every byte.
func TestSharedConns(t *testing.T) {
	for _, tc := range []struct{ n, streams int }{{2, 1}, {3, 2}} {
		ts := newCluster(t, tc.n, tc.streams)
		if err := transporttest.SharedExchange(asTransports(ts), 10, 20*time.Second); err != nil {
			t.Fatalf("%d ranks, %d streams: %v", tc.n, tc.streams, err)
		}
	}
}

// TestSharedMismatch: a child's mismatch fails the child, not the root.
func TestSharedMismatch(t *testing.T) {
	if err := transporttest.SharedMismatch(asTransports(newCluster(t, 2, 1)), 10*time.Second); err != nil {
		t.Fatal(err)
	}
}
