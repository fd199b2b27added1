package tcp

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
// and frames larger than the socket buffers (8 MiB once the kernel doubles
// SocketBuffer), which need many partial syscalls.
var frameSizes = []int{0, 1, 48, 4096, 1<<20 + 3, 8 << 20}

// TestExchange sends every frame size from every rank to every peer on every
// stream, all at once, and checks every byte and the byte counters.
func TestExchange(t *testing.T) {
	for _, tc := range []struct{ n, streams int }{{2, 1}, {2, 3}, {3, 1}, {3, 3}, {4, 1}, {4, 3}} {
		t.Run(fmt.Sprintf("ranks%d_streams%d", tc.n, tc.streams), func(t *testing.T) {
			transporttest.Exchange(t, newCluster(t, tc.n, tc.streams), frameSizes)
		})
	}
}

// TestHeaderMismatch checks that a frame whose header differs from the
// expected one fails the receive with ErrMismatch naming the sender.
func TestHeaderMismatch(t *testing.T) {
	transporttest.HeaderMismatch(t, func(t testing.TB, n, streams int) []*Transport { return newCluster(t, n, streams) }, false)
}

// TestAnyLenAndWindow checks receives whose length or place the header
// decides: AnyLen receives into a larger buffer, and puts into a window at
// their Aux offset.
func TestAnyLenAndWindow(t *testing.T) {
	transporttest.AnyLenAndWindow(t, func(t testing.TB, n, streams int) []*Transport { return newCluster(t, n, streams) }, 0, false)
}

// TestOneOpPerDirection checks that a conn leaves a second op untouched while
// the first one owns the direction. The first tries are not required to
// move bytes: what a socket takes or holds at a given moment is the kernel's
// business.
func TestOneOpPerDirection(t *testing.T) {
	big := pattern(7, 32<<20) // larger than both socket buffers together
	transporttest.OneOpPerDirection(t, newCluster(t, 2, 1), big, false)
}

// TestPeerDeath closes one rank in the middle of a large transfer and checks
// that the other side fails with ErrPeerLost naming it, promptly.
func TestPeerDeath(t *testing.T) {
	const size = 64 << 20 // far more than the sockets buffer
	data := pattern(9, size)
	for _, tc := range []struct {
		name string
		dies int // 0 is the sender, 1 the receiver
	}{{"receiver dies", 1}, {"sender dies", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newCluster(t, 2, 1)
			jobs := [][]job{
				{sendJob(ts[0].Conn(1, 0), hdr(0, 0, 0, 1), data)},
				{recvJob(ts[1].Conn(0, 0), hdr(0, 0, 0, 1), make([]byte, size))},
			}
			// Fill the pipe, then take part of it out, from this goroutine
			// alone: a side running concurrently could chase the other to the
			// end of the message. Both sides are then in mid-message.
			s, r := jobs[0][0], jobs[1][0]
			if done, err := s.C.TrySend(s.Send); done || err != nil || s.Send.Progress == 0 {
				t.Fatalf("filling the pipe: done %v, err %v, progress %d", done, err, s.Send.Progress)
			}
			if done, err := r.C.TryRecv(r.Recv); done || err != nil || r.Recv.Progress == 0 {
				t.Fatalf("draining part of the pipe: done %v, err %v, progress %d", done, err, r.Recv.Progress)
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
			if elapsed > 2*time.Second {
				t.Fatalf("survivor took %v to notice", elapsed)
			}
			t.Logf("survivor noticed after %v: %v", elapsed, err)
			// The closed side fails its own ops with ErrClosed.
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

// TestZeroAllocs checks that a warmed-up send+receive round trip allocates
// nothing, for a one-syscall message and one that takes several.
func TestZeroAllocs(t *testing.T) {
	ts := newCluster(t, 2, 1)
	for _, size := range []int{8, 256 << 10} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			a, b := ts[0].Conn(1, 0), ts[1].Conn(0, 0)
			out, back := pattern(1, size), make([]byte, size)
			var s0, s1 transport.SendOp
			var r0, r1 transport.RecvOp
			h0, h1 := hdr(0, 0, 0, 1), hdr(1, 0, 0, 1)
			one := func() {
				h0.Seq++
				h1.Seq++
				s0.Reset(h0, out)
				r1.Reset(h0, back, false)
				s1.Reset(h1, back)
				r0.Reset(h1, back, false)
				pingPong(ts, a, b, &s0, &r1, &s1, &r0)
			}
			for range 20 {
				one()
			}
			if allocs := testing.AllocsPerRun(200, one); allocs != 0 {
				t.Fatalf("%v allocations per round trip, want 0", allocs)
			}
			if !bytes.Equal(back, out) {
				t.Fatal("payload corrupted")
			}
		})
	}
}

// pingPong drives a round trip from one goroutine: a sends s0 to b, b
// receives it with r1 and sends s1 back, a receives it with r0.
func pingPong(ts []*Transport, a, b transport.Conn, s0 *transport.SendOp, r1 *transport.RecvOp, s1 *transport.SendOp, r0 *transport.RecvOp) {
	stage := 0
	for stage < 4 {
		var done bool
		var err error
		switch stage {
		case 0:
			done, err = a.TrySend(s0)
		case 1:
			done, err = b.TryRecv(r1)
		case 2:
			done, err = b.TrySend(s1)
		case 3:
			done, err = a.TryRecv(r0)
		}
		if err != nil {
			panic(err)
		}
		if done {
			stage++
		} else if stage == 1 || stage == 2 {
			ts[1].Wait(0)
		} else {
			ts[0].Wait(0)
		}
	}
}
