package a2a

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"
)

// dataPlanes are the data planes the nonblocking, persistent and split
// tests run over: one host by TCP, one host by shared memory, and two
// (fake) hosts of two ranks each, shm within and TCP across.
var dataPlanes = []struct {
	name string
	mod  func(c *Config)
}{
	{"tcp", func(c *Config) { c.Transport = "tcp" }},
	{"shm", func(c *Config) { c.Transport = "shm" }},
	{"mixed", func(c *Config) { c.Host = fmt.Sprintf("host%d", c.Rank/2) }},
}

// planeRanks is how many ranks a test runs on the data plane named name:
// two, or three for mixed (two hosts, one with two ranks).
func planeRanks(name string) int {
	if name == "mixed" {
		return 3
	}
	return 2
}

// planeGroup joins n ranks over data plane mod, with heartbeats slow
// enough for a loaded machine.
func planeGroup(t testing.TB, url string, n int, mod func(*Config)) []*Comm {
	return group(t, url, n, func(c *Config) {
		patient(c)
		mod(c)
	})
}

// vCounts4 is what rank src sends rank dst in round k: uneven, some empty.
func vCount(src, dst, k int) int { return (src*7 + dst*13 + k*5) % 23 * 97 }

// TestNonblockingCollectives starts every nonblocking collective mixed with
// point-to-point calls and a blocking collective, waits for them out of
// order, some from another goroutine, and checks every byte.
func TestNonblockingCollectives(t *testing.T) {
	url := startNATS(t)
	const ranks, rounds = 4, 20
	for _, dp := range dataPlanes {
		t.Run(dp.name, func(t *testing.T) {
			comms := planeGroup(t, url, ranks, dp.mod)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			mustAll(t, onAll(comms, func(c *Comm) error {
				for k := range rounds {
					if err := nonblockingRound(ctx, c, k); err != nil {
						return fmt.Errorf("round %d: %w", k, err)
					}
				}
				return nil
			}))
		})
	}
}

func nonblockingRound(ctx context.Context, c *Comm, k int) error {
	r, n := c.Rank(), c.Size()
	next, prev := (r+1)%n, (r+n-1)%n
	// AllToAllV with uneven counts.
	sc, rc := make([]int, n), make([]int, n)
	for j := range n {
		sc[j], rc[j] = vCount(r, j, k), vCount(j, r, k)
	}
	send, recv := make([]byte, sum(sc)), make([]byte, sum(rc))
	for j, off := 0, 0; j < n; off, j = off+sc[j], j+1 {
		for b := range sc[j] {
			send[off+b] = pat(r, j, b+k)
		}
	}
	// Point-to-point calls posted before the collective move before it,
	// those posted after it after it, on both ranks of a pair.
	p2pIn, p2pIn2 := make([]byte, 3000), make([]byte, 3000)
	rr := c.Irecv(ctx, p2pIn, prev, k)
	sr := c.Isend(ctx, p2pMessage(r, next, k, 3000), next, k)
	v := c.IAllToAllV(ctx, send, sc, recv, rc)
	sr2 := c.Isend(ctx, p2pMessage(r, next, k+1, 3000), next, k+1)
	rr2 := c.Irecv(ctx, p2pIn2, prev, k+1)
	// AllToAll, AllGather, AllReduce, Barrier.
	a2aSend, a2aRecv := make([]byte, 8*n), make([]byte, 8*n)
	for j := range n {
		binary.LittleEndian.PutUint64(a2aSend[8*j:], uint64(r*1000+j+k))
	}
	a := c.IAllToAll(ctx, a2aSend, a2aRecv)
	gIn, gOut := []byte{byte(r), byte(k)}, make([]byte, 2*n)
	g := c.IAllGather(ctx, gIn, gOut)
	red := make([]byte, 8*64)
	redIn := make([]byte, len(red))
	for i := range 64 {
		binary.LittleEndian.PutUint64(redIn[8*i:], math.Float64bits(float64(r+i+k)))
	}
	ar := c.IAllReduce(ctx, redIn, red, Float64, Sum)
	b := c.IBarrier(ctx)
	// A blocking collective after them runs after them.
	blocking := make([]byte, 8)
	if err := c.AllReduce(ctx, []byte{1, 0, 0, 0, 0, 0, 0, 0}, blocking, Int64, Sum); err != nil {
		return fmt.Errorf("blocking allreduce: %w", err)
	}
	if got := binary.LittleEndian.Uint64(blocking); got != uint64(n) {
		return fmt.Errorf("blocking allreduce: %d", got)
	}
	// Waits out of order, the barrier's from another goroutine.
	var wg sync.WaitGroup
	var berr error
	wg.Add(1)
	go func() { defer wg.Done(); _, berr = b.Wait(ctx) }()
	for name, q := range map[string]*Request{"allreduce": ar, "allgather": g, "alltoall": a, "alltoallv": v, "send": sr, "send after": sr2} {
		if _, err := q.Wait(ctx); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	// The receive posted after the collectives is waited for first: it runs
	// them before it moves.
	if m, err := rr2.Wait(ctx); err != nil || !bytes.Equal(p2pIn2[:m], p2pMessage(prev, r, k+1, 3000)) {
		return fmt.Errorf("irecv after: %d bytes, %v", m, err)
	}
	if m, err := rr.Wait(ctx); err != nil || !bytes.Equal(p2pIn[:m], p2pMessage(prev, r, k, 3000)) {
		return fmt.Errorf("irecv: %d bytes, %v", m, err)
	}
	wg.Wait()
	if berr != nil {
		return fmt.Errorf("barrier: %w", berr)
	}
	for j, off := 0, 0; j < n; off, j = off+rc[j], j+1 {
		for b := range rc[j] {
			if recv[off+b] != pat(j, r, b+k) {
				return fmt.Errorf("alltoallv: byte %d from %d", b, j)
			}
		}
	}
	for j := range n {
		if got := binary.LittleEndian.Uint64(a2aRecv[8*j:]); got != uint64(j*1000+r+k) {
			return fmt.Errorf("alltoall from %d: %d", j, got)
		}
		if gOut[2*j] != byte(j) || gOut[2*j+1] != byte(k) {
			return fmt.Errorf("allgather from %d: %v", j, gOut[2*j:2*j+2])
		}
	}
	for i := range 64 {
		want := float64(n*(i+k) + n*(n-1)/2)
		if got := math.Float64frombits(binary.LittleEndian.Uint64(red[8*i:])); got != want {
			return fmt.Errorf("allreduce [%d]: %v, want %v", i, got, want)
		}
	}
	return nil
}

// TestNonblockingTestAndErrors polls a nonblocking collective with Test and
// gets a bad argument from Wait as ErrInvalidArgument.
func TestNonblockingTestAndErrors(t *testing.T) {
	url := startNATS(t)
	comms := planeGroup(t, url, 2, dataPlanes[1].mod)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mustAll(t, onAll(comms, func(c *Comm) error {
		out := make([]byte, 8)
		q := c.IAllReduce(ctx, []byte{2, 0, 0, 0, 0, 0, 0, 0}, out, Int64, Sum)
		for {
			done, _, err := q.Test()
			if err != nil {
				return err
			}
			if done {
				break
			}
			runtime.Gosched()
		}
		if out[0] != 4 {
			return fmt.Errorf("allreduce: %v", out)
		}
		_, err := c.IAllToAll(ctx, make([]byte, 3), make([]byte, 3)).Wait(ctx)
		if !errors.Is(err, ErrInvalidArgument) {
			return fmt.Errorf("IAllToAll of 3 bytes on 2 ranks: %v, want ErrInvalidArgument", err)
		}
		return nil
	}))
}

// TestNonblockingClose: Close ends nonblocking collectives still waiting
// for a peer, and those queued behind them, with an error from Wait; a
// persistent use started before Close fails the same way.
func TestNonblockingClose(t *testing.T) {
	url := startNATS(t)
	comms := planeGroup(t, url, 2, dataPlanes[0].mod)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := comms[0] // rank 1 never joins the calls
	out := make([]byte, 8)
	first := c.IAllReduce(ctx, make([]byte, 8), out, Int64, Sum)
	queued := c.IBarrier(ctx)
	p, err := c.AllToAllVInit(make([]byte, 2), []int{1, 1}, make([]byte, 2), []int{1, 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // let the first one wait for its peer
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for name, q := range map[string]*Request{"running": first, "queued": queued} {
		if _, err := q.Wait(ctx); !errors.Is(err, ErrClosed) {
			t.Errorf("%s: %v, want ErrClosed", name, err)
		}
	}
	if err := p.Wait(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("persistent: %v, want ErrClosed", err)
	}
}

// TestNonblockingRandomMix runs one seeded random sequence of nonblocking
// collectives, blocking collectives and point-to-point rings on every rank,
// waits for the requests in a random order (some from other goroutines),
// and checks every result.
func TestNonblockingRandomMix(t *testing.T) {
	url := startNATS(t)
	const ranks, steps = 3, 300
	for _, dp := range dataPlanes {
		t.Run(dp.name, func(t *testing.T) {
			comms := planeGroup(t, url, ranks, dp.mod)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			mustAll(t, onAll(comms, func(c *Comm) error { return randomMix(ctx, c, steps) }))
		})
	}
}

// pendingCheck is a request and the check of its result.
type pendingCheck struct {
	what  string
	req   *Request
	check func(n int) error
}

func randomMix(ctx context.Context, c *Comm, steps int) error {
	rng := rand.New(rand.NewPCG(7, 7)) // the same sequence on every rank
	r, n := c.Rank(), c.Size()
	next, prev := (r+1)%n, (r+n-1)%n
	var pending []pendingCheck
	var async sync.WaitGroup
	asyncErr := make(chan error, steps)
	wait := func(p pendingCheck, k int) error {
		m, err := p.req.Wait(ctx)
		if err == nil {
			err = p.check(m)
		}
		if err != nil {
			return fmt.Errorf("step %d %s: %w", k, p.what, err)
		}
		return nil
	}
	for k := range steps {
		switch op := rng.IntN(8); op {
		case 0, 1, 2:
			pending = append(pending, startRandomColl(ctx, c, rng.IntN(5), k))
		case 3:
			out := make([]byte, 8)
			if err := c.AllReduce(ctx, []byte{byte(k), 0, 0, 0, 0, 0, 0, 0}, out, Int64, Sum); err != nil || out[0] != byte(n*k) {
				return fmt.Errorf("step %d allreduce: %v %v", k, out[0], err)
			}
		case 4, 5:
			in := make([]byte, 600)
			pending = append(pending,
				pendingCheck{"isend", c.Isend(ctx, p2pMessage(r, next, k, 500), next, k), func(int) error { return nil }},
				pendingCheck{"irecv", c.Irecv(ctx, in, prev, k), func(m int) error {
					if !bytes.Equal(in[:m], p2pMessage(prev, r, k, 500)) {
						return fmt.Errorf("wrong %d bytes", m)
					}
					return nil
				}})
		default:
			if len(pending) == 0 {
				continue
			}
			i := rng.IntN(len(pending))
			p := pending[i]
			pending = append(pending[:i], pending[i+1:]...)
			if op == 7 { // from another goroutine
				async.Add(1)
				go func() {
					defer async.Done()
					if err := wait(p, k); err != nil {
						asyncErr <- err
					}
				}()
				continue
			}
			if err := wait(p, k); err != nil {
				return err
			}
		}
	}
	for _, p := range pending {
		if err := wait(p, steps); err != nil {
			return err
		}
	}
	async.Wait()
	close(asyncErr)
	return <-asyncErr
}

// startRandomColl starts nonblocking collective kind (0-4) of step k.
func startRandomColl(ctx context.Context, c *Comm, kind, k int) pendingCheck {
	r, n := c.Rank(), c.Size()
	switch kind {
	case 0:
		sc, rc := make([]int, n), make([]int, n)
		for j := range n {
			sc[j], rc[j] = vCount(r, j, k), vCount(j, r, k)
		}
		send, recv := make([]byte, sum(sc)), make([]byte, sum(rc))
		for j, off := 0, 0; j < n; off, j = off+sc[j], j+1 {
			for b := range sc[j] {
				send[off+b] = pat(r, j, b+k)
			}
		}
		return pendingCheck{"ialltoallv", c.IAllToAllV(ctx, send, sc, recv, rc), func(int) error {
			for j, off := 0, 0; j < n; off, j = off+rc[j], j+1 {
				for b := range rc[j] {
					if recv[off+b] != pat(j, r, b+k) {
						return fmt.Errorf("byte %d from %d", b, j)
					}
				}
			}
			return nil
		}}
	case 1:
		send, recv := make([]byte, n), make([]byte, n)
		for j := range n {
			send[j] = byte(r*16 + j + k)
		}
		return pendingCheck{"ialltoall", c.IAllToAll(ctx, send, recv), func(int) error {
			for j := range n {
				if recv[j] != byte(j*16+r+k) {
					return fmt.Errorf("from %d: %d", j, recv[j])
				}
			}
			return nil
		}}
	case 2:
		out := make([]byte, 8)
		return pendingCheck{"iallreduce", c.IAllReduce(ctx, []byte{byte(r + k), 0, 0, 0, 0, 0, 0, 0}, out, Int64, Sum), func(int) error {
			if want := byte(n*k + n*(n-1)/2); out[0] != want {
				return fmt.Errorf("%d, want %d", out[0], want)
			}
			return nil
		}}
	case 3:
		out := make([]byte, n)
		return pendingCheck{"iallgather", c.IAllGather(ctx, []byte{byte(r + k)}, out), func(int) error {
			for j := range n {
				if out[j] != byte(j+k) {
					return fmt.Errorf("from %d: %d", j, out[j])
				}
			}
			return nil
		}}
	}
	return pendingCheck{"ibarrier", c.IBarrier(ctx), func(int) error { return nil }}
}

// TestNonblockingWaitTimeout: a Wait whose context ends first returns
// ErrTimeout and leaves the collective running; a later Wait gets its
// result.
func TestNonblockingWaitTimeout(t *testing.T) {
	url := startNATS(t)
	comms := planeGroup(t, url, 2, dataPlanes[0].mod)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	firstWaited := make(chan struct{})
	mustAll(t, onAll(comms, func(c *Comm) error {
		out := make([]byte, 8)
		if c.Rank() == 1 {
			<-firstWaited // rank 0's collective cannot complete before this
		}
		q := c.IAllReduce(ctx, []byte{5, 0, 0, 0, 0, 0, 0, 0}, out, Int64, Sum)
		if c.Rank() == 0 {
			short, stop := context.WithTimeout(ctx, 10*time.Millisecond)
			_, err := q.Wait(short)
			stop()
			close(firstWaited)
			if !errors.Is(err, ErrTimeout) {
				return fmt.Errorf("short Wait: %v, want ErrTimeout", err)
			}
		}
		if _, err := q.Wait(ctx); err != nil {
			return err
		}
		if out[0] != 10 {
			return fmt.Errorf("allreduce: %d", out[0])
		}
		return nil
	}))
}

// TestStartedBehindBlocking: a collective started while a blocking one of
// another goroutine runs waits for that call's turn to end, then runs; and
// when its own context ends first, it fails with ErrTimeout alone, the
// blocking call still completing on every rank. The last rank comes late to
// the blocking Barrier, so that the earlier ranks' started collective is
// sure to wait. The Barrier runs under the lease the calls before it left
// (the started collective waits for the running flag), or, after a
// point-to-point message revoked the lease, on its own turn (it waits for
// collBusy, takeTurn).
func TestStartedBehindBlocking(t *testing.T) {
	for _, dp := range dataPlanes {
		for _, tc := range []struct {
			name     string
			late     time.Duration // the last rank's delay before its Barrier
			timeout  time.Duration // the started collective's context on the early ranks (0: none)
			p2pFirst bool          // a message from the last rank first: no lease
		}{
			{"runs after the call", 20 * time.Millisecond, 0, false},
			{"its context ends first", 100 * time.Millisecond, 10 * time.Millisecond, false},
			{"runs after the call, no lease", 20 * time.Millisecond, 0, true},
			{"its context ends first, no lease", 100 * time.Millisecond, 10 * time.Millisecond, true},
		} {
			t.Run(dp.name+"/"+tc.name, func(t *testing.T) {
				n := planeRanks(dp.name)
				comms := planeGroup(t, startNATS(t), n, dp.mod)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				started := make(chan struct{}, n)
				mustAll(t, onAll(comms, func(c *Comm) error {
					r, last := c.Rank(), c.Rank() == n-1
					send, recv := make([]byte, 8*n), make([]byte, 8*n)
					for j := range n {
						binary.LittleEndian.PutUint64(send[8*j:], uint64(100*r+j))
					}
					barrier := make(chan error, 1)
					if tc.p2pFirst {
						if err := p2pToAll(ctx, c, n-1); err != nil {
							return err
						}
					}
					if last {
						for range n - 1 {
							<-started
						}
						time.Sleep(tc.late)
						barrier <- c.Barrier(ctx)
					} else {
						before := lastNumbered(c)
						go func() { barrier <- c.Barrier(ctx) }()
						// The started collective must come after the Barrier
						// in this rank's order, as on the last rank.
						for lastNumbered(c) == before {
							runtime.Gosched()
						}
					}
					qctx := ctx
					if tc.timeout > 0 && !last {
						var stop context.CancelFunc
						qctx, stop = context.WithTimeout(ctx, tc.timeout)
						defer stop()
					}
					var q *Request
					if tc.timeout == 0 || !last {
						q = c.IAllToAll(qctx, send, recv)
					}
					if !last {
						started <- struct{}{}
					}
					if err := <-barrier; err != nil {
						return fmt.Errorf("rank %d: Barrier: %w", r, err)
					}
					if q == nil {
						return nil
					}
					_, err := q.Wait(ctx)
					if tc.timeout > 0 {
						if !errors.Is(err, ErrTimeout) {
							return fmt.Errorf("rank %d: started collective past its context: %v, want ErrTimeout", r, err)
						}
						return nil
					}
					if err != nil {
						return fmt.Errorf("rank %d: IAllToAll: %w", r, err)
					}
					for j := range n {
						if got, want := binary.LittleEndian.Uint64(recv[8*j:]), uint64(100*j+r); got != want {
							return fmt.Errorf("rank %d: block from %d: %d, want %d", r, j, got, want)
						}
					}
					return nil
				}))
			})
		}
	}
}

// lastNumbered is the op sequence of the last collective numbered on c:
// the queue's, or the lease's while a lease holds the turn (lease.go).
func lastNumbered(c *Comm) uint64 {
	c.queue.mu.Lock()
	defer c.queue.mu.Unlock()
	seq := c.queue.seq
	if w := c.queue.lease.word.Load(); w&leaseState != leaseNone {
		seq = max(seq, w>>leaseShift)
	}
	return seq
}

// p2pToAll sends one message from rank from to every other rank, which
// receives it (a posted Irecv, waited for).
func p2pToAll(ctx context.Context, c *Comm, from int) error {
	buf := []byte{byte(from)}
	if c.Rank() == from {
		for j := range c.Size() {
			if j != from {
				if err := c.Send(ctx, buf, j, 7); err != nil {
					return err
				}
			}
		}
		return nil
	}
	_, err := c.Irecv(ctx, buf, from, 7).Wait(ctx)
	return err
}
