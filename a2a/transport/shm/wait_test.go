package shm

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

// TestWaitWakes parks rank 0 in Wait on a stalled op and checks that the
// futex wake-up ends the park when rank 1 does what the op waits for: sends
// data, frees ring space, acknowledges a CMA descriptor, or closes.
func TestWaitWakes(t *testing.T) {
	const delay = 30 * time.Millisecond
	// scene is rank 0's stalled op, what rank 1 does about it, and how the
	// two finish after the wake-up.
	type scene struct {
		stalled job    // rank 0's op
		act     func() // rank 1's move
		peer    []job  // rank 1's ops still to finish
		msg     []byte // the message, checked at the receiver
		recv    *transport.RecvOp
		lost    bool // the op fails with ErrPeerLost
	}
	for _, tc := range []struct {
		name  string
		zcopy int
		setup func(ts []*Transport) scene
	}{
		{"data arrives", ringOnly, func(ts []*Transport) scene {
			msg := pattern(1, 100)
			r := recvJob(ts[0].Conn(1, 0), hdr(1, 0, 0, 1), make([]byte, len(msg)))
			p := []job{sendJob(ts[1].Conn(0, 0), hdr(1, 0, 0, 1), msg)}
			return scene{stalled: r, act: func() { p[0].Done, _ = p[0].C.TrySend(p[0].Send) }, peer: p, msg: msg, recv: r.Recv}
		}},
		{"ring space frees", ringOnly, func(ts []*Transport) scene {
			msg := pattern(2, 4*testRing)
			s := sendJob(ts[0].Conn(1, 0), hdr(0, 0, 0, 1), msg)
			p := []job{recvJob(ts[1].Conn(0, 0), hdr(0, 0, 0, 1), make([]byte, len(msg)))}
			s.C.TrySend(s.Send) // fills the ring
			return scene{stalled: s, act: func() { p[0].Done, _ = p[0].C.TryRecv(p[0].Recv) }, peer: p, msg: msg, recv: p[0].Recv}
		}},
		{"CMA acknowledged", cmaAll, func(ts []*Transport) scene {
			msg := pattern(3, 1<<20)
			s := sendJob(ts[0].Conn(1, 0), hdr(0, 0, 0, 1), msg)
			p := []job{recvJob(ts[1].Conn(0, 0), hdr(0, 0, 0, 1), make([]byte, len(msg)))}
			s.C.TrySend(s.Send) // posts the descriptor
			return scene{stalled: s, act: func() { p[0].Done, _ = p[0].C.TryRecv(p[0].Recv) }, peer: p, msg: msg, recv: p[0].Recv}
		}},
		{"peer closes", ringOnly, func(ts []*Transport) scene {
			r := recvJob(ts[0].Conn(1, 0), hdr(1, 0, 0, 1), make([]byte, 8))
			return scene{stalled: r, act: func() { ts[1].Close() }, lost: true}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newCluster(t, 2, 1, tc.zcopy)
			sc := tc.setup(ts)
			if err := tryOnce(sc.stalled)(); err != nil {
				t.Fatal(err)
			}
			woke := make(chan time.Duration, 1)
			go func() {
				start := time.Now()
				ts[0].Wait(10 * time.Second)
				woke <- time.Since(start)
			}()
			time.Sleep(delay)
			sc.act()
			select {
			case took := <-woke:
				if took < delay*3/4 {
					t.Fatalf("Wait returned after %v, before rank 1 acted", took)
				}
				t.Logf("woke %v after rank 1 acted", took-delay)
			case <-time.After(5 * time.Second):
				t.Fatal("parked Wait not woken within 5s")
			}
			errs := driveAll(ts, [][]job{{sc.stalled}, sc.peer}, 5*time.Second)
			if sc.lost {
				if !errors.Is(errs[0], fault.ErrPeerLost) {
					t.Fatalf("stalled op after the peer closed: %v, want ErrPeerLost", errs[0])
				}
				return
			}
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(sc.recv.Dst, sc.msg) {
				t.Fatal("message corrupted")
			}
		})
	}
}

// tryOnce returns a function that tries j once and requires it not to
// finish, so that Wait has something to wait for.
func tryOnce(j job) func() error {
	return func() error {
		var done bool
		var err error
		if j.Send != nil {
			done, err = j.C.TrySend(j.Send)
		} else {
			done, err = j.C.TryRecv(j.Recv)
		}
		if done || err != nil {
			return errors.Join(err, errors.New("op finished; it should wait for the peer"))
		}
		return nil
	}
}

// TestWaitNoLostWakeup checks that data arriving between a stalled try and
// Wait ends the Wait at once, and that Wait otherwise sleeps its timeout.
func TestWaitNoLostWakeup(t *testing.T) {
	ts := newCluster(t, 2, 1, ringOnly)
	r := recvJob(ts[0].Conn(1, 0), hdr(1, 0, 0, 1), make([]byte, 8))
	if err := tryOnce(r)(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ts[0].Wait(30 * time.Millisecond)
	if took := time.Since(start); took < 30*time.Millisecond || took > time.Second {
		t.Fatalf("idle Wait(30ms) returned after %v", took)
	}
	s := sendJob(ts[1].Conn(0, 0), hdr(1, 0, 0, 1), pattern(4, 8))
	if done, err := s.C.TrySend(s.Send); !done || err != nil {
		t.Fatalf("send: %v %v", done, err)
	}
	start = time.Now()
	ts[0].Wait(10 * time.Second)
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Wait with data already there returned after %v", took)
	}
	if done, err := r.C.TryRecv(r.Recv); !done || err != nil || !bytes.Equal(r.Recv.Dst, s.Send.Data) {
		t.Fatalf("receive: %v %v", done, err)
	}
	// Nothing is pending any more: Wait sleeps again.
	start = time.Now()
	ts[0].Wait(20 * time.Millisecond)
	if took := time.Since(start); took < 20*time.Millisecond {
		t.Fatalf("Wait with nothing pending returned after %v", took)
	}
}

// TestSizeOneAndWake checks a transport with no peers (a world of one, and a
// rank alone on its host) and the Wait/Wake/Close contract.
func TestSizeOneAndWake(t *testing.T) {
	for _, tc := range []struct {
		name        string
		rank, size  int
		local       []int
		wantStreams int
	}{{"world of one", 0, 1, nil, 1}, {"alone on its host", 2, 4, []int{2}, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			group := testGroup(t)
			tr, err := Open(context.Background(), Config{Group: group, Rank: tc.rank, Size: tc.size, Local: tc.local})
			if err != nil {
				t.Fatal(err)
			}
			defer checkNoFiles(t, DefaultDir, group)
			if tr.Name() != "shm" || tr.Streams() != tc.wantStreams {
				t.Errorf("Name %q Streams %d", tr.Name(), tr.Streams())
			}
			if st := tr.Stats(); len(st.BytesSent) != tc.size || len(st.BytesReceived) != tc.size {
				t.Errorf("stats %+v", st)
			}
			start := time.Now()
			if err := tr.Wait(1500 * time.Microsecond); err != nil || time.Since(start) < 1500*time.Microsecond {
				t.Errorf("idle Wait(1.5ms): %v after %v, want nil after at least 1.5ms", err, time.Since(start))
			}
			tr.Wake()
			start = time.Now()
			if err := tr.Wait(10 * time.Second); err != nil || time.Since(start) > time.Second {
				t.Errorf("Wait after Wake: %v after %v, want at once", err, time.Since(start))
			}
			start = time.Now()
			if err := tr.Wait(5 * time.Millisecond); err != nil || time.Since(start) < 5*time.Millisecond {
				t.Errorf("second Wait after one Wake: %v after %v, want a full park", err, time.Since(start))
			}
			transporttest.WakeAndClose(t, tr)
		})
	}
}

// TestLocalSubset checks a transport serving some of the world's ranks:
// conns to the local ones work, the others panic.
func TestLocalSubset(t *testing.T) {
	local := []int{3, 1} // any order
	group := testGroup(t)
	cfgs := make([]Config, 2)
	for i, r := range []int{1, 3} {
		cfgs[i] = testConfig(t, group, r, 5, 2, ringOnly)
		cfgs[i].Local = local
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ts, errs := openAll(ctx, cfgs)
	defer checkNoFiles(t, DefaultDir, group)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Open rank %d: %v", cfgs[i].Rank, err)
		}
		defer ts[i].Close()
	}
	for _, peer := range []int{0, 1, 2, 4, 5, -1} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Conn from rank 1 to rank %d did not panic", peer)
				}
			}()
			ts[0].Conn(peer, 0)
		}()
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Conn on stream 2 of 2 did not panic")
			}
		}()
		ts[0].Conn(3, 2)
	}()
	a, b := pattern(40, 300), pattern(41, 300)
	ra, rb := make([]byte, 300), make([]byte, 300)
	jobs := [][]job{
		{sendJob(ts[0].Conn(3, 1), hdr(1, 1, 0, 1), a), recvJob(ts[0].Conn(3, 1), hdr(3, 1, 0, 1), ra)},
		{sendJob(ts[1].Conn(1, 1), hdr(3, 1, 0, 1), b), recvJob(ts[1].Conn(1, 1), hdr(1, 1, 0, 1), rb)},
	}
	if err := firstErr(driveAll(ts, jobs, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ra, b) || !bytes.Equal(rb, a) {
		t.Fatal("exchange corrupted")
	}
	if st := ts[0].Stats(); st.BytesSent[3] != 348 || st.BytesReceived[3] != 348 || st.BytesSent[0] != 0 {
		t.Errorf("rank 1 stats %+v", st)
	}
}
