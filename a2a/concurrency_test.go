package a2a

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// patient keeps heartbeat timeouts out of tests about something else: on
// a 2-core machine running other jobs a rank may miss 1 s of heartbeats.
func patient(c *Config) { c.HeartbeatInterval, c.PeerTimeout = 250*time.Millisecond, 10*time.Second }

// p2pMessage is the verifiable message from src to dst in round k.
func p2pMessage(src, dst, k, size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = pat(src, dst, k+i)
	}
	return b
}

// p2pSizes are the message sizes the concurrency tests cycle through: 8 B
// to 300 KB, small and frame-sized, the large ones less often (the race
// detector makes every byte copied slow).
func p2pSize(k int) int {
	sizes := []int{8, 1000, 64 << 10, 8, 4096}
	if k%20 == 19 {
		return 300_000
	}
	return sizes[k%len(sizes)]
}

// TestP2PRingSendInGoroutine is failure 1 of issue 11: ranks in a ring each
// run `go Send(next)` and then Recv(prev). With one lock around whole calls
// the Send waiting for its peer blocked the Recv that would let the peer go
// on, and every ring of 3 or more timed out in the first round. Hundreds of
// rounds at 2 to 8 ranks, 8 B to 300 KB, every byte checked.
func TestP2PRingSendInGoroutine(t *testing.T) {
	url := startNATS(t)
	for _, tc := range []struct{ ranks, rounds int }{{2, 300}, {3, 300}, {5, 200}, {8, 100}} {
		t.Run(fmt.Sprintf("ranks=%d", tc.ranks), func(t *testing.T) {
			comms := group(t, url, tc.ranks, patient)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			mustAll(t, onAll(comms, func(c *Comm) error {
				n, r := c.Size(), c.Rank()
				next, prev := (r+1)%n, (r+n-1)%n
				buf := make([]byte, 300_000)
				for k := range tc.rounds {
					size := p2pSize(k)
					sent := make(chan error, 1)
					go func() { sent <- c.Send(ctx, p2pMessage(r, next, k, size), next, k) }()
					got, err := c.Recv(ctx, buf, prev, k)
					if err != nil {
						return fmt.Errorf("round %d recv: %w", k, err)
					}
					if !bytes.Equal(buf[:got], p2pMessage(prev, r, k, size)) {
						return fmt.Errorf("round %d: wrong %d bytes from rank %d", k, got, prev)
					}
					if err := <-sent; err != nil {
						return fmt.Errorf("round %d send: %w", k, err)
					}
				}
				return nil
			}))
		})
	}
}

// TestP2PAllPairsAtOnce posts every pair's messages at once from 2(P-1)
// goroutines per rank: one sender and one receiver per peer, each making
// blocking calls in a loop, all progressing together in the one engine.
func TestP2PAllPairsAtOnce(t *testing.T) {
	url := startNATS(t)
	const ranks, msgs = 5, 40
	comms := group(t, url, ranks, patient)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mustAll(t, onAll(comms, func(c *Comm) error {
		r := c.Rank()
		errs := make(chan error, 2*(ranks-1))
		for peer := range ranks {
			if peer == r {
				continue
			}
			go func() {
				for k := range msgs {
					if err := c.Send(ctx, p2pMessage(r, peer, k, p2pSize(k+peer)), peer, k); err != nil {
						errs <- fmt.Errorf("send %d to %d: %w", k, peer, err)
						return
					}
				}
				errs <- nil
			}()
			go func() {
				buf := make([]byte, 300_000)
				for k := range msgs {
					n, err := c.Recv(ctx, buf, peer, k)
					if err != nil {
						errs <- fmt.Errorf("recv %d from %d: %w", k, peer, err)
						return
					}
					if !bytes.Equal(buf[:n], p2pMessage(peer, r, k, p2pSize(k+r))) {
						errs <- fmt.Errorf("recv %d from %d: wrong %d bytes", k, peer, n)
						return
					}
				}
				errs <- nil
			}()
		}
		var first error
		for range 2 * (ranks - 1) {
			if err := <-errs; err != nil && first == nil {
				first = err
			}
		}
		return first
	}))
}

// TestNonblockingP2P covers Isend/Irecv with Wait and Test, SendRecv and a
// Group posted as one step, every result checked.
func TestNonblockingP2P(t *testing.T) {
	url := startNATS(t)
	const ranks = 4
	comms := group(t, url, ranks, patient)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mustAll(t, onAll(comms, func(c *Comm) error {
		r := c.Rank()
		next, prev := (r+1)%ranks, (r+ranks-1)%ranks
		// Receives posted before the sends, polled with Test.
		buf := make([]byte, 300_000)
		rr := c.Irecv(ctx, buf, prev, 1)
		sr := c.Isend(ctx, p2pMessage(r, next, 1, 5000), next, 1)
		for {
			done, n, err := rr.Test()
			if err != nil {
				return fmt.Errorf("Test: %w", err)
			}
			if done {
				if !bytes.Equal(buf[:n], p2pMessage(prev, r, 1, 5000)) {
					return fmt.Errorf("Irecv: wrong %d bytes", n)
				}
				break
			}
			time.Sleep(10 * time.Microsecond)
		}
		if n, err := sr.Wait(ctx); err != nil || n != 5000 {
			return fmt.Errorf("Isend: %d, %v", n, err)
		}
		// SendRecv in both directions of the ring.
		for k := range 50 {
			n, err := c.SendRecv(ctx, p2pMessage(r, next, k, p2pSize(k)), next, 2, buf[:cap(buf)], prev, 2)
			if err != nil {
				return fmt.Errorf("SendRecv %d: %w", k, err)
			}
			if !bytes.Equal(buf[:n], p2pMessage(prev, r, k, p2pSize(k))) {
				return fmt.Errorf("SendRecv %d: wrong %d bytes", k, n)
			}
		}
		// A Group: every peer's send and receive as one step.
		g := c.NewGroup()
		recvs := make([]*Request, ranks)
		bufs := make([][]byte, ranks)
		for p := range ranks {
			if p == r {
				continue
			}
			g.Send(p2pMessage(r, p, 3, 100*(r+1)), p, 3)
			bufs[p] = make([]byte, 1000)
			recvs[p] = g.Recv(bufs[p], p, 3)
		}
		if err := g.Wait(ctx); err != nil {
			return fmt.Errorf("group: %w", err)
		}
		for p, rq := range recvs {
			if rq == nil {
				continue
			}
			n, err := rq.Wait(ctx)
			if err != nil || !bytes.Equal(bufs[p][:n], p2pMessage(p, r, 3, 100*(p+1))) {
				return fmt.Errorf("group recv from %d: %d bytes, %v", p, n, err)
			}
		}
		// A bad argument is a typed error from Wait, and aborts from there.
		// The barrier first: a rank's group step may finish (its sends are
		// eager) while a peer still receives from it, and this abort would
		// end the peer's step.
		if err := c.Barrier(ctx); err != nil {
			return fmt.Errorf("barrier: %w", err)
		}
		if _, err := c.Isend(ctx, buf, r, 1).Wait(ctx); !errors.Is(err, ErrInvalidArgument) {
			return fmt.Errorf("Isend to self: %v, want ErrInvalidArgument", err)
		}
		return nil
	}))
}

// TestP2PWithCollectives interleaves collectives with point-to-point calls
// of other goroutines: receives posted before a collective complete before
// it on both ranks, and no call stalls another.
func TestP2PWithCollectives(t *testing.T) {
	url := startNATS(t)
	const ranks, rounds = 3, 100
	comms := group(t, url, ranks, patient)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mustAll(t, onAll(comms, func(c *Comm) error {
		r := c.Rank()
		next, prev := (r+1)%ranks, (r+ranks-1)%ranks
		in := make([]byte, 4096)
		sum := make([]byte, 64)
		for k := range rounds {
			rr := c.Irecv(ctx, in, prev, k)
			sr := c.Isend(ctx, p2pMessage(r, next, k, 4096), next, k)
			if err := c.AllReduce(ctx, make([]byte, 64), sum, Float32, Sum); err != nil {
				return fmt.Errorf("round %d allreduce: %w", k, err)
			}
			if err := WaitAll(ctx, rr, sr); err != nil {
				return fmt.Errorf("round %d p2p: %w", k, err)
			}
			if !bytes.Equal(in, p2pMessage(prev, r, k, 4096)) {
				return fmt.Errorf("round %d: wrong bytes from %d", k, prev)
			}
		}
		return nil
	}))
}

// collectiveRuns reports whether a collective runs on c: collBusy alone may
// be an idle lease's (lease.go).
func collectiveRuns(c *Comm) bool {
	state := c.queue.lease.word.Load() & leaseState
	return c.life.collBusy.Load() && state != leaseIdle && state != leaseStarted
}

// TestConcurrentCollectivesRejected: a collective called while another runs
// on the same Comm is rejected at once with ErrInvalidArgument; the running
// one completes on every rank and the next call fails everywhere, so nobody
// waits for an order the ranks could not agree on.
func TestConcurrentCollectivesRejected(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 2, patient)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	first := make(chan error, 1)
	go func() { first <- comms[0].Barrier(ctx) }() // waits for rank 1
	for !collectiveRuns(comms[0]) {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	err := comms[0].AllReduce(ctx, make([]byte, 8), make([]byte, 8), Float32, Sum)
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("concurrent collective: %v, want ErrInvalidArgument", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("rejection took %v", d)
	}
	if err := comms[1].Barrier(ctx); err != nil {
		t.Fatalf("rank 1 barrier (before the rejected call): %v", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("rank 0 barrier (running when the other was rejected): %v", err)
	}
	for _, c := range comms {
		if err := c.Barrier(ctx); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("rank %d next call: %v, want the abort wrapping ErrInvalidArgument", c.Rank(), err)
		}
	}
}

// TestAbortSpareEarlierCall is failure 2 of issue 11: rank 0 finishes
// AllToAllV k-1 and fails call k with a short send buffer while ranks 1 and
// 2 are still busy in k-1 (they exchange 2 MiB each way, rank 0 a few
// bytes). Rank 0 had sent everything they need, so their k-1 must succeed;
// their call k fails with the abort. Before the abort carried its op
// sequence, rank 0's abort failed the peers' k-1 in some runs.
func TestAbortSpareEarlierCall(t *testing.T) {
	url := startNATS(t)
	// 100 trials, 5 groups at a time: a trial's time is mostly joining.
	const ranks, big, trials, parallel = 3, 2 << 20, 100, 5
	matrix := []int{ // bytes rank i sends rank j
		0, 16, 16,
		16, 0, big,
		16, big, 0,
	}
	row := func(r int) []int { return matrix[r*ranks : (r+1)*ranks] }
	col := func(r int) []int {
		c := make([]int, ranks)
		for i := range c {
			c[i] = matrix[i*ranks+r]
		}
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	trial := func(bufs [][2][]byte) error {
		comms := group(t, url, ranks, func(c *Config) { c.HeartbeatInterval, c.PeerTimeout = 50*time.Millisecond, 10*time.Second })
		defer func() {
			for _, c := range comms {
				c.Close()
			}
		}()
		errs := onAll(comms, func(c *Comm) error {
			r := c.Rank()
			send, recv := bufs[r][0], bufs[r][1]
			if err := c.AllToAllV(ctx, send, row(r), recv, col(r)); err != nil {
				return fmt.Errorf("call k-1: %w", err)
			}
			if r == 0 {
				send = send[:4] // too short for its counts: fails before any byte moves
			}
			err := c.AllToAllV(ctx, send, row(r), recv, col(r))
			switch {
			case r == 0 && !errors.Is(err, ErrInvalidArgument):
				return fmt.Errorf("call k: %v, want ErrInvalidArgument", err)
			case r != 0 && (!errors.Is(err, ErrAborted) || !errors.Is(err, ErrInvalidArgument)):
				return fmt.Errorf("call k: %v, want ErrAborted wrapping ErrInvalidArgument", err)
			}
			return nil
		})
		for r, err := range errs {
			if err != nil {
				return fmt.Errorf("rank %d: %w", r, err)
			}
		}
		return nil
	}
	failed := make(chan error, parallel)
	for w := range parallel {
		go func() {
			bufs := make([][2][]byte, ranks)
			for r := range bufs {
				bufs[r] = [2][]byte{make([]byte, big+16), make([]byte, big+16)}
			}
			for k := w; k < trials; k += parallel {
				if err := trial(bufs); err != nil {
					failed <- fmt.Errorf("trial %d: %w", k, err)
					return
				}
			}
			failed <- nil
		}()
	}
	for range parallel {
		if err := <-failed; err != nil {
			t.Error(err)
		}
	}
}

// TestLeaveFailsWaits is failure 3 of issue 11: a rank that Closes while
// the others wait for it (or before they start) fails their waits within
// 3 s with ErrPeerLost naming it, on the control plane (ExchangeCounts)
// and on the data plane (a collective, a receive), although their context
// allows a minute. Before, they waited for their whole deadline, or got
// "communicator closed" about their own open Comm.
func TestLeaveFailsWaits(t *testing.T) {
	url := startNATS(t)
	const ranks, leaver = 3, 2
	waits := []struct {
		name string
		wait func(ctx context.Context, c *Comm) error
	}{
		{"counts", func(ctx context.Context, c *Comm) error {
			_, err := c.ExchangeCounts(ctx, []int{1, 2, 3})
			return err
		}},
		{"allreduce", func(ctx context.Context, c *Comm) error {
			return c.AllReduce(ctx, make([]byte, 1024), make([]byte, 1024), Float32, Sum)
		}},
		{"recv", func(ctx context.Context, c *Comm) error {
			_, err := c.Recv(ctx, make([]byte, 8), leaver, 0)
			return err
		}},
	}
	for _, w := range waits {
		for _, during := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/during=%v", w.name, during), func(t *testing.T) {
				comms := group(t, url, ranks, patient)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				// Warm up: a collective every rank completes before the leave.
				mustAll(t, onAll(comms, func(c *Comm) error { return c.Barrier(ctx) }))
				if !during {
					if err := comms[leaver].Close(); err != nil {
						t.Fatal(err)
					}
					time.Sleep(200 * time.Millisecond) // the leave reaches the others
				}
				errs := make(chan error, ranks-1)
				start := time.Now()
				for _, c := range comms[:leaver] {
					go func() { errs <- w.wait(ctx, c) }()
				}
				if during {
					time.Sleep(300 * time.Millisecond)
					if err := comms[leaver].Close(); err != nil {
						t.Fatal(err)
					}
				}
				for range ranks - 1 {
					err := <-errs
					var fe *Error
					if !errors.Is(err, ErrPeerLost) || !errors.As(err, &fe) || !namesRank(err, leaver) {
						t.Errorf("wait: %v, want ErrPeerLost naming rank %d", err, leaver)
					}
				}
				if d := time.Since(start); d > 3*time.Second+300*time.Millisecond {
					t.Errorf("waits failed after %v, want within 3 s of the leave", d)
				}
			})
		}
	}
}

// namesRank reports whether some *Error in err's chain of kind
// ErrPeerLost names rank.
func namesRank(err error, rank int) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if fe, ok := e.(*Error); ok && fe.Kind == ErrPeerLost && fe.Rank == rank {
			return true
		}
	}
	return false
}
