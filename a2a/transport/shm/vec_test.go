package shm

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

// cutVec cuts b into random slices of at most max bytes, empty ones included.
func cutVec(rng *rand.Rand, b []byte, max int) [][]byte {
	var v [][]byte
	for len(b) > 0 || rng.IntN(4) == 0 {
		n := min(len(b), rng.IntN(max+1))
		v = append(v, b[:n:n])
		b = b[n:]
	}
	return v
}

// TestVectoredPayloads sends gather-send frames (SendOp.Vec) both ways at
// once and receives them contiguously or scattered (RecvOp.DstVec), through
// the rings and by CMA with iovec lists (tiny slices: more than one
// process_vm_readv's 1024 iovecs per frame, the sender's list read from its
// memory), and checks every byte, that nothing outside the slices changed,
// and that the CMA mode really took CMA.
func TestVectoredPayloads(t *testing.T) {
	sizes := []int{0, 1, 700, testRing + 3, 300 << 10}
	for _, tc := range []struct {
		zcopy, maxSlice int
	}{
		{ringOnly, 100}, {ringOnly, 20 << 10},
		{cmaAll, 8}, {cmaAll, 100}, {cmaAll, 20 << 10},
	} {
		t.Run(fmt.Sprintf("%s/slices%d", modeName(tc.zcopy), tc.maxSlice), func(t *testing.T) {
			ts := newCluster(t, 2, 1, tc.zcopy, func(c *Config) { c.ZCopyVecSlice = 1 })
			rng := rand.New(rand.NewPCG(uint64(tc.maxSlice), uint64(tc.zcopy)))
			jobs := make([][]transporttest.Job, 2)
			type check struct {
				want, buf []byte
			}
			var checks []check
			for r := range 2 {
				c := ts[r].Conn(1-r, 0)
				for k, size := range sizes {
					msg := transporttest.Pattern(uint64(100*r+k), size)
					s := new(transport.SendOp)
					s.ResetVec(transporttest.Hdr(r, 0, k, 1), cutVec(rng, msg, tc.maxSlice))
					jobs[r] = append(jobs[r], transporttest.Job{C: c, Send: s})
					buf := bytes.Repeat([]byte{0xEE}, size)
					rv := new(transport.RecvOp)
					if k%2 == 0 {
						rv.ResetVec(transporttest.Hdr(r, 0, k, 1), cutVec(rng, buf, tc.maxSlice))
					} else {
						rv.Reset(transporttest.Hdr(r, 0, k, 1), buf, false)
					}
					jobs[1-r] = append(jobs[1-r], transporttest.Job{C: ts[1-r].Conn(r, 0), Recv: rv})
					checks = append(checks, check{msg, buf})
				}
			}
			if err := transporttest.FirstErr(transporttest.DriveAll(ts, jobs, 20*time.Second)); err != nil {
				t.Fatal(err)
			}
			for i, c := range checks {
				if !bytes.Equal(c.want, c.buf) {
					t.Fatalf("message %d (%d bytes) differs", i, len(c.want))
				}
			}
			for r, tr := range ts {
				got := tr.conns[1-r].rcmas
				if want := tc.zcopy == cmaAll; (got > 0) != want {
					t.Errorf("rank %d: %d messages by CMA in %s mode", r, got, modeName(tc.zcopy))
				}
			}
		})
	}
}

// TestVectoredShortSlicesUseTheRing: by default a gather-send whose slices
// average less than DefaultZCopyVecSlice streams through the ring, and one
// with longer slices goes by CMA.
func TestVectoredShortSlicesUseTheRing(t *testing.T) {
	ts := newCluster(t, 2, 1, 0)
	const size = 512 << 10
	for _, tc := range []struct {
		slice int
		cma   bool
	}{{2 << 10, false}, {DefaultZCopyVecSlice, true}} {
		msg := transporttest.Pattern(uint64(tc.slice), size)
		var vec [][]byte
		for b := msg; len(b) > 0; b = b[tc.slice:] {
			vec = append(vec, b[:tc.slice])
		}
		s := new(transport.SendOp)
		s.ResetVec(transporttest.Hdr(0, 0, 0, 1), vec)
		buf := make([]byte, size)
		rv := new(transport.RecvOp)
		rv.Reset(transporttest.Hdr(0, 0, 0, 1), buf, false)
		before := ts[1].conns[0].rcmas
		jobs := [][]transporttest.Job{{{C: ts[0].Conn(1, 0), Send: s}}, {{C: ts[1].Conn(0, 0), Recv: rv}}}
		if err := transporttest.FirstErr(transporttest.DriveAll(ts, jobs, 20*time.Second)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(msg, buf) {
			t.Fatalf("%d-byte slices: message differs", tc.slice)
		}
		if byCMA := ts[1].conns[0].rcmas > before; byCMA != tc.cma {
			t.Errorf("%d-byte slices: by CMA %v, want %v", tc.slice, byCMA, tc.cma)
		}
	}
}
