package transport_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/tcp"
	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

// pair connects ranks 0 and peer of a 3-rank world over their own TCP
// listeners and returns both ends.
func pair(t *testing.T, group string, peer int) (*tcp.Transport, *tcp.Transport) {
	t.Helper()
	ls := make([]*tcp.Listener, 2)
	for i, r := range []int{0, peer} {
		l, err := tcp.Listen(tcp.Config{Group: group, Rank: r, Size: 3, Streams: 1, Secret: []byte("k"), Logger: transporttest.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		ls[i] = l
	}
	addrs0, addrsPeer := make([]string, 3), make([]string, 3)
	addrs0[peer], addrsPeer[0] = ls[1].Addr(), ls[0].Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var a, b *tcp.Transport
	var errA, errB error
	var wg sync.WaitGroup
	wg.Go(func() { a, errA = ls[0].Connect(ctx, 1, addrs0) })
	wg.Go(func() { b, errB = ls[1].Connect(ctx, 1, addrsPeer) })
	wg.Wait()
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// sleeps reports whether one of up to three Waits of 20 ms on tr lasted
// 15 ms or more, and how long each took. A Wait may return early (a signal
// ends epoll_wait with EINTR: the runtime's preemption, the race
// detector's), so one must sleep; a wake-up left pending ends all three.
func sleeps(tr transport.Transport) (bool, []time.Duration) {
	var waits []time.Duration
	for range 3 {
		start := time.Now()
		tr.Wait(20 * time.Millisecond)
		if waits = append(waits, time.Since(start)); waits[len(waits)-1] >= 15*time.Millisecond {
			return true, waits
		}
	}
	return false, waits
}

// TestMixedPollers composes two parts that are both Pollers, so a Wait
// sleeps on one epoll set of both: data arriving on either part, and Wake,
// end it long before its timeout, and frames route to the right part.
func TestMixedPollers(t *testing.T) {
	a1, peer1 := pair(t, "mixA", 1)
	a2, peer2 := pair(t, "mixB", 2)
	m, err := transport.NewMixed([]transport.Transport{a1, a2}, []transport.Transport{nil, a1, a2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Name() != "tcp+tcp" || m.PeerTransport(2) != transport.Transport(a2) {
		t.Fatalf("name %q, peer 2 part %v", m.Name(), m.PeerTransport(2))
	}

	// Fresh sockets report writable once: a Wait may return early for
	// that (Waits may), and must then sleep.
	m.Wait(0)
	if ok, waits := sleeps(m); !ok {
		t.Errorf("idle Waits returned after %v, want one to last its timeout", waits)
	}

	m.Wake()
	start := time.Now()
	if err := m.Wait(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Wait after Wake took %v", d)
	}
	// The Wake is consumed: the next Wait sleeps again.
	if ok, waits := sleeps(m); !ok {
		t.Errorf("Waits after the woken one returned after %v: the wake-up was not consumed", waits)
	}

	for _, tc := range []struct {
		peer int
		from *tcp.Transport
	}{{1, peer1}, {2, peer2}} {
		data := transporttest.Pattern(uint64(tc.peer), 1000)
		go func() {
			time.Sleep(50 * time.Millisecond)
			transporttest.Drive(tc.from, []transporttest.Job{transporttest.SendJob(tc.from.Conn(0, 0), transporttest.Hdr(tc.peer, 0, 0, 1), data)}, 5*time.Second)
		}()
		start = time.Now()
		if err := m.Wait(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Wait for data from rank %d took %v", tc.peer, d)
		}
		got := make([]byte, len(data))
		if err := transporttest.Drive(m, []transporttest.Job{transporttest.RecvJob(m.Conn(tc.peer, 0), transporttest.Hdr(tc.peer, 0, 0, 1), got)}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Errorf("payload from rank %d differs", tc.peer)
		}
	}
}
