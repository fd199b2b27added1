package transporttest

import (
	"errors"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// HeaderMismatch checks that a frame whose header differs from the expected
// one (any field, a length other than expected, an AnyLen message longer
// than its buffer) fails the receive with ErrMismatch naming the sender, and
// that the stream keeps failing afterwards instead of reading payload bytes
// as a header. cluster and senderRejected are as for AnyLenAndWindow.
func HeaderMismatch[T transport.Transport](t *testing.T, cluster func(t testing.TB, n, streams int) []T, senderRejected bool) {
	const want = 100
	for _, tc := range []struct {
		name   string
		mutate func(h *transport.Header)
		size   int
		anyLen bool
	}{
		{"seq", func(h *transport.Header) { h.Seq++ }, want, false},
		{"kind", func(h *transport.Header) { h.Kind = transport.OpAllReduce }, want, false},
		{"flags", func(h *transport.Header) { h.Flags = 0 }, want, false},
		{"epoch", func(h *transport.Header) { h.Epoch++ }, want, false},
		{"round", func(h *transport.Header) { h.Round++ }, want, false},
		{"shorter", nil, want / 2, false},
		{"longer", nil, want * 2, false},
		{"empty", nil, 0, false},
		{"anylen longer than buffer", nil, want + 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := cluster(t, 2, 1)
			h := Hdr(0, 0, 0, 5)
			if tc.mutate != nil {
				tc.mutate(&h)
			}
			recv := RecvJob(ts[1].Conn(0, 0), Hdr(0, 0, 0, 5), make([]byte, want))
			recv.Recv.AnyLen = tc.anyLen
			errs := DriveAll(ts, [][]Job{
				{SendJob(ts[0].Conn(1, 0), h, make([]byte, tc.size))},
				{recv},
			}, 5*time.Second)
			var fe *fault.Error
			if !errors.Is(errs[1], fault.ErrMismatch) || !errors.As(errs[1], &fe) || fe.Rank != 0 {
				t.Fatalf("receiver: got %v, want ErrMismatch naming rank 0", errs[1])
			}
			if senderRejected && tc.size > 0 {
				if !errors.Is(errs[0], fault.ErrMismatch) || !errors.As(errs[0], &fe) || fe.Rank != 1 {
					t.Fatalf("sender: got %v, want ErrMismatch naming rank 1", errs[0])
				}
			} else if errs[0] != nil {
				t.Fatalf("sender: %v", errs[0])
			}
			again := RecvJob(ts[1].Conn(0, 0), Hdr(0, 0, 1, 5), make([]byte, want))
			if _, err := again.C.TryRecv(again.Recv); !errors.Is(err, fault.ErrMismatch) {
				t.Fatalf("next receive on the broken stream: %v, want ErrMismatch", err)
			}
		})
	}
}
