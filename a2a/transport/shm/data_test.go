package shm

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

// frameSizes cover empty frames, frames smaller and equal to a header, a page,
// a frame just larger than the ring (its header and payload wrap), and one
// that streams through the ring many times (largestFrame).
var frameSizes = []int{0, 1, 48, 4096, testRing + 3, largestFrame()}

// largestFrame is 8 MiB, 128 rings and 8 CMA calls. Under the race detector
// it is 2 MiB and 5 bytes, still 32 rings and 3 CMA calls: the 8 MiB frames
// made TestExchange 31 s of the race run on 2 cores, 10 s at 2 MiB.
func largestFrame() int {
	if raceEnabled {
		return 2<<20 + 5
	}
	return 8 << 20
}

// clusterOf is newCluster in one ZCopy mode, for transporttest's checks.
func clusterOf(zcopy int) func(t testing.TB, n, streams int) []*Transport {
	return func(t testing.TB, n, streams int) []*Transport { return newCluster(t, n, streams, zcopy) }
}

// TestExchange sends every frame size from every rank to every peer on every
// stream, all at once, through the rings and by CMA, and checks every byte
// and the byte counters.
func TestExchange(t *testing.T) {
	for _, tc := range []struct{ n, streams, zcopy int }{
		{2, 1, ringOnly}, {2, 2, ringOnly}, {3, 1, ringOnly}, {3, 2, ringOnly}, {4, 1, ringOnly}, {4, 2, ringOnly},
		{2, 1, cmaAll}, {2, 2, cmaAll}, {3, 1, cmaAll}, {3, 2, cmaAll}, {4, 1, cmaAll}, {4, 2, cmaAll},
	} {
		t.Run(fmt.Sprintf("%s_ranks%d_streams%d", modeName(tc.zcopy), tc.n, tc.streams), func(t *testing.T) {
			ts := newCluster(t, tc.n, tc.streams, tc.zcopy)
			transporttest.Exchange(t, ts, frameSizes)
			for r, tr := range ts {
				if z := tr.ZCopy((r + 1) % tc.n); z != (tc.zcopy == cmaAll) {
					t.Errorf("rank %d: ZCopy(%d) = %v in %s mode", r, (r+1)%tc.n, z, modeName(tc.zcopy))
				}
			}
		})
	}
}

// TestRingSizes streams messages around and across the ring's size through
// rings from the smallest allowed to larger than the messages, both ways at
// once, and checks every byte.
func TestRingSizes(t *testing.T) {
	for _, ring := range []int{minRingBytes, testRing, DefaultRingBytes, 1 << 20} {
		t.Run(fmt.Sprintf("ring%d", ring), func(t *testing.T) {
			ts := newCluster(t, 2, 1, ringOnly, func(c *Config) { c.RingBytes = ring })
			sizes := []int{1, ring - 100, ring - 56, ring + 3, 3*ring + 17, 1<<20 + 5}
			var jobs [2][]job
			var want, got [2][][]byte
			for r := range 2 {
				c := ts[r].Conn(1-r, 0)
				for k, size := range sizes {
					msg := pattern(uint64(100*r+k), size)
					buf := make([]byte, size)
					want[1-r] = append(want[1-r], msg)
					got[r] = append(got[r], buf)
					jobs[r] = append(jobs[r], sendJob(c, hdr(r, 0, k, 1), msg), recvJob(c, hdr(1-r, 0, k, 1), buf))
				}
			}
			if err := firstErr(driveAll(ts, jobs[:], 10*time.Second)); err != nil {
				t.Fatal(err)
			}
			for r := range 2 {
				for k := range sizes {
					if !bytes.Equal(got[r][k], want[r][k]) {
						t.Fatalf("rank %d: message %d (%d bytes) corrupted", r, k, sizes[k])
					}
				}
			}
		})
	}
}

// TestHeaderMismatch checks that a frame whose header differs from the
// expected one fails the receive with ErrMismatch naming the sender. A
// sender whose CMA descriptor is rejected fails too, instead of waiting for
// an acknowledgment forever.
func TestHeaderMismatch(t *testing.T) {
	for _, zcopy := range []int{ringOnly, cmaAll} {
		t.Run(modeName(zcopy), func(t *testing.T) {
			transporttest.HeaderMismatch(t, clusterOf(zcopy), zcopy == cmaAll)
		})
	}
}

// TestAnyLenAndWindow checks receives whose length or place the header
// decides: AnyLen receives into a larger buffer, and puts into a window at
// their Aux offset, through the ring and by CMA.
func TestAnyLenAndWindow(t *testing.T) {
	for _, zcopy := range []int{ringOnly, cmaAll} {
		t.Run(modeName(zcopy), func(t *testing.T) {
			// Puts larger than the ring stream through it; a CMA sender
			// hears the receiver refuse a put outside the window.
			transporttest.AnyLenAndWindow(t, clusterOf(zcopy), testRing, zcopy == cmaAll)
		})
	}
}

// TestOneOpPerDirection checks that a conn leaves a second op untouched while
// the first one owns the direction. The first tries must move bytes: an
// idle ring always has room for the first fragment, and it is there for the
// receiver as soon as TrySend returns.
func TestOneOpPerDirection(t *testing.T) {
	for _, zcopy := range []int{ringOnly, cmaAll} {
		t.Run(modeName(zcopy), func(t *testing.T) {
			big := pattern(7, 2*cmaCallBytes+4*testRing) // larger than the ring and one CMA call
			transporttest.OneOpPerDirection(t, newCluster(t, 2, 1, zcopy), big, true)
		})
	}
}

// TestPeerClose closes one in-process rank in the middle of a transfer and
// checks that the other side fails with ErrPeerLost naming it, promptly,
// and that the closed side fails its own ops with ErrClosed.
func TestPeerClose(t *testing.T) {
	const size = 8 << 20 // far more than the ring
	data := pattern(9, size)
	for _, tc := range []struct {
		name  string
		zcopy int
		dies  int // 0 is the sender, 1 the receiver
	}{
		{"ring receiver closes", ringOnly, 1},
		{"ring sender closes", ringOnly, 0},
		{"cma receiver closes", cmaAll, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newCluster(t, 2, 1, tc.zcopy)
			jobs := [][]job{
				{sendJob(ts[0].Conn(1, 0), hdr(0, 0, 0, 1), data)},
				{recvJob(ts[1].Conn(0, 0), hdr(0, 0, 0, 1), make([]byte, size))},
			}
			s, r := jobs[0][0], jobs[1][0]
			if done, err := s.C.TrySend(s.Send); done || err != nil || s.Send.Progress == 0 {
				t.Fatalf("filling the ring: done %v, err %v, progress %d", done, err, s.Send.Progress)
			}
			if tc.zcopy == ringOnly {
				if done, err := r.C.TryRecv(r.Recv); done || err != nil || r.Recv.Progress == 0 {
					t.Fatalf("draining part of the ring: done %v, err %v, progress %d", done, err, r.Recv.Progress)
				}
			}
			survivor := 1 - tc.dies
			errc := make(chan error, 1)
			go func() { errc <- drive(ts[survivor], jobs[survivor], 10*time.Second) }()
			time.Sleep(5 * time.Millisecond)
			closedAt := time.Now()
			ts[tc.dies].Close()
			var err error
			select {
			case err = <-errc:
			case <-time.After(5 * time.Second):
				t.Fatal("survivor did not notice the closed peer within 5s")
			}
			elapsed := time.Since(closedAt)
			var fe *fault.Error
			if !errors.Is(err, fault.ErrPeerLost) || !errors.As(err, &fe) || fe.Rank != tc.dies {
				t.Fatalf("survivor: %v, want ErrPeerLost naming rank %d", err, tc.dies)
			}
			if elapsed > time.Second {
				t.Fatalf("survivor took %v to notice", elapsed)
			}
			t.Logf("survivor noticed after %v: %v", elapsed, err)
			if tc.dies == 0 {
				_, err = s.C.TrySend(s.Send)
			} else {
				_, err = r.C.TryRecv(r.Recv)
			}
			if !errors.Is(err, fault.ErrClosed) {
				t.Fatalf("op on the closed transport: %v, want ErrClosed", err)
			}
		})
	}
}

// TestDeliveredBeforeClose checks that a message published before its
// sender closed is still received in full.
func TestDeliveredBeforeClose(t *testing.T) {
	ts := newCluster(t, 2, 1, ringOnly)
	msg := pattern(10, 1000)
	s := sendJob(ts[0].Conn(1, 0), hdr(0, 0, 0, 1), msg)
	if done, err := s.C.TrySend(s.Send); !done || err != nil {
		t.Fatalf("send: done %v err %v", done, err)
	}
	ts[0].Close()
	r := recvJob(ts[1].Conn(0, 0), hdr(0, 0, 0, 1), make([]byte, len(msg)))
	if err := drive(ts[1], []job{r}, 5*time.Second); err != nil || !bytes.Equal(r.Recv.Dst, msg) {
		t.Fatalf("receive after the sender closed: %v (bytes equal: %v)", err, bytes.Equal(r.Recv.Dst, msg))
	}
	next := recvJob(ts[1].Conn(0, 0), hdr(0, 0, 1, 1), make([]byte, 1))
	if err := drive(ts[1], []job{next}, 5*time.Second); !errors.Is(err, fault.ErrPeerLost) {
		t.Fatalf("receive of a message never sent: %v, want ErrPeerLost", err)
	}
}

// TestZeroAllocs checks that a warmed-up send+receive round trip allocates
// nothing: a small message, one larger than the ring, one by CMA, and one
// from a shareable buffer copied from a mapping.
func TestZeroAllocs(t *testing.T) {
	for _, tc := range []struct {
		zcopy, size int
		mapped      bool // from shareable buffers, copied from mappings
	}{{ringOnly, 8, false}, {ringOnly, 4 * testRing, false}, {cmaAll, 8, false}, {cmaAll, 4 * testRing, false}, {cmaAll, 4 * testRing, true}} {
		t.Run(fmt.Sprintf("%s_%d_mapped%v", modeName(tc.zcopy), tc.size, tc.mapped), func(t *testing.T) {
			ts := newCluster(t, 2, 1, tc.zcopy)
			a, b := ts[0].Conn(1, 0), ts[1].Conn(0, 0)
			out, back, ret := pattern(1, tc.size), make([]byte, tc.size), make([]byte, tc.size)
			if tc.mapped {
				out, back = sharedBuf(t, tc.size, 1), sharedBuf(t, tc.size, 0)
			}
			var s0, s1 transport.SendOp
			var r0, r1 transport.RecvOp
			h0, h1 := hdr(0, 0, 0, 1), hdr(1, 0, 0, 1)
			one := func() {
				h0.Seq++
				h1.Seq++
				s0.Reset(h0, out)
				r1.Reset(h0, back, false)
				s1.Reset(h1, back)
				r0.Reset(h1, ret, false)
				pingPong(a, b, &s0, &r1, &s1, &r0)
			}
			for range 20 {
				one()
			}
			if allocs := testing.AllocsPerRun(200, one); allocs != 0 {
				t.Fatalf("%v allocations per round trip, want 0", allocs)
			}
			if !bytes.Equal(back, out) || !bytes.Equal(ret, out) {
				t.Fatal("payload corrupted")
			}
			if msgs, _ := mappedCount(ts[1]); tc.mapped != (msgs > 0) {
				t.Fatalf("%d messages from mappings", msgs)
			}
		})
	}
}

// pingPong drives a round trip from one goroutine, interleaving both sides so
// that messages larger than the ring progress: a sends s0 to b, b receives it
// with r1 and sends s1 back, a receives it with r0.
func pingPong(a, b transport.Conn, s0 *transport.SendOp, r1 *transport.RecvOp, s1 *transport.SendOp, r0 *transport.RecvOp) {
	d := [4]bool{}
	for !d[0] || !d[1] || !d[2] || !d[3] {
		var err error
		if !d[0] {
			d[0], err = a.TrySend(s0)
		}
		if err == nil && !d[1] {
			d[1], err = b.TryRecv(r1)
		}
		if err == nil && d[1] && !d[2] {
			d[2], err = b.TrySend(s1)
		}
		if err == nil && d[1] && !d[3] {
			d[3], err = a.TryRecv(r0)
		}
		if err != nil {
			panic(err)
		}
	}
}
