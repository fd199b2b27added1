package a2a

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"
)

// blockUse is one rank's buffers for a loop of blocking AllToAllV calls of
// per bytes to every peer: two pairs, so a case can swap the slices while
// the counts stay.
type blockUse struct {
	c          *Comm
	per        int
	send, recv [2][]byte
	counts     []int
}

func newBlockUse(c *Comm, per int) *blockUse {
	n := c.Size()
	u := &blockUse{c: c, counts: make([]int, n)}
	for i := range u.send {
		u.send[i], u.recv[i] = make([]byte, per*n, per*n+8), make([]byte, per*n)
	}
	u.setPer(per)
	return u
}

// callPer runs call k as an AllToAllV of per bytes to every peer from the
// first buffer pair (per at most the pair's), then restores the counts.
func (u *blockUse) callPer(ctx context.Context, k, per int) error {
	was := u.per
	u.setPer(per)
	defer u.setPer(was)
	return u.call(ctx, k, 0, false)
}

func (u *blockUse) setPer(per int) {
	u.per = per
	for j := range u.counts {
		u.counts[j] = per
	}
}

// call runs call k over buffer pair b, all-to-all (counts equal) or
// AllToAllV, with fresh contents, and checks every byte received.
func (u *blockUse) call(ctx context.Context, k, b int, equal bool) error {
	r, per := u.c.Rank(), u.per
	send, recv := u.send[b], u.recv[b]
	for j := range u.counts {
		for x := range per {
			send[j*per+x] = pat(r, j, x+k)
		}
	}
	clear(recv)
	var err error
	if equal {
		err = u.c.AllToAll(ctx, send, recv)
	} else {
		err = u.c.AllToAllV(ctx, send, u.counts, recv, u.counts)
	}
	if err != nil {
		return fmt.Errorf("call %d: %w", k, err)
	}
	for j := range u.counts {
		for x := range per {
			if got, want := recv[j*per+x], pat(j, r, x+k); got != want {
				return fmt.Errorf("call %d: byte %d from rank %d is %d, want %d", k, x, j, got, want)
			}
		}
	}
	return nil
}

// TestBlockingLLRound runs loops of blocking AllToAllV and AllToAll calls
// over TCP, shm and mixed, alone and mixed with nonblocking collectives,
// persistent uses, point-to-point waiters on other goroutines, and counts
// and buffers that change between calls, checking every byte. The cached
// LL round must serve the loops whose buffers stay (2 ranks on shm) and no
// call whose counts or buffers differ from the round's.
func TestBlockingLLRound(t *testing.T) {
	url := startNATS(t)
	const calls = 40
	plain := func(ctx context.Context, u *blockUse, k int) error { return u.call(ctx, k, 0, false) }
	cases := []roundCase[*blockUse]{
		{"alone", plain, calls - 2},
		{"alltoall", func(ctx context.Context, u *blockUse, k int) error { return u.call(ctx, k, 0, true) }, calls - 2},
		{"alltoall-and-v", func(ctx context.Context, u *blockUse, k int) error {
			// The same counts and buffers under two op kinds: one plan
			// cache entry, whose round must carry the right kind.
			return u.call(ctx, k, 0, k%2 == 0)
		}, -1},
		{"swap-buffers", func(ctx context.Context, u *blockUse, k int) error {
			// The same counts, a different buffer pair every call.
			return u.call(ctx, k, k%2, false)
		}, -1},
		{"swap-buffers-every-4", func(ctx context.Context, u *blockUse, k int) error {
			return u.call(ctx, k, k/4%2, false)
		}, calls / 2},
		{"change-counts", func(ctx context.Context, u *blockUse, k int) error {
			// Fewer bytes from the same buffers every 3rd call: another
			// plan, and back.
			if k%3 == 2 {
				return u.callPer(ctx, k, u.per/2)
			}
			return u.call(ctx, k, 0, false)
		}, calls / 3},
		{"many-shapes", func(ctx context.Context, u *blockUse, k int) error {
			// More shapes than the plan cache keeps, each twice in a row
			// over the same buffers: entries are replanned for other
			// counts, and their old rounds must go.
			return u.callPer(ctx, k, 8+4*(k/2%(planCacheSize+1)))
		}, calls / 2},
		{"set-algo", func(ctx context.Context, u *blockUse, k int) error {
			// Pairwise (no LL blocks) for calls 5-6 of every 10, on every
			// rank between the same calls: the round must not serve them.
			switch k % 10 {
			case 5:
				if err := u.c.SetAlgo("pairwise"); err != nil {
					return err
				}
			case 7:
				if err := u.c.SetAlgo(""); err != nil {
					return err
				}
			}
			if err := u.call(ctx, k, 0, false); err != nil {
				return err
			}
			if got := u.c.LastAlgo(); (got == "ll") != (k%10 < 5 || k%10 >= 7) {
				return fmt.Errorf("call %d ran %s", k, got)
			}
			return nil
		}, calls / 2},
		{"resliced-buffers", func(ctx context.Context, u *blockUse, k int) error {
			// The same first byte and counts, a longer slice every other
			// call: not the round's slices.
			base := u.send[0]
			if k%2 == 1 {
				u.send[0] = base[:len(base)+8]
			}
			err := u.call(ctx, k, 0, false)
			u.send[0] = base
			return err
		}, -1},
		{"icoll-around", func(ctx context.Context, u *blockUse, k int) error {
			out := make([]byte, 8)
			ar := u.c.IAllReduce(ctx, []byte{byte(k), 0, 0, 0, 0, 0, 0, 0}, out, Int64, Sum)
			if err := plain(ctx, u, k); err != nil {
				return err
			}
			ib := u.c.IBarrier(ctx)
			if err := WaitAll(ctx, ar, ib); err != nil {
				return err
			}
			if want := byte(u.c.Size() * k); out[0] != want {
				return fmt.Errorf("allreduce: %d, want %d", out[0], want)
			}
			return nil
		}, calls / 2},
		{"persistent-between", func(ctx context.Context, u *blockUse, k int) error {
			p, err := newDirectUse(u.c, 8)
			if err != nil {
				return err
			}
			defer p.p.Close()
			for i := range 2 {
				if err := plain(ctx, u, 2*k+i); err != nil {
					return err
				}
				p.fill(k + i)
				if err := p.p.Start(ctx); err != nil {
					return err
				}
				if err := p.p.Wait(ctx); err != nil {
					return err
				}
				if err := p.check(k + i); err != nil {
					return err
				}
			}
			return nil
		}, calls},
		{"p2p-waited-elsewhere", func(ctx context.Context, u *blockUse, k int) error {
			rr, sr, check := ringP2P(ctx, u.c, k)
			done := make(chan error, 1)
			go func() { done <- WaitAll(ctx, rr, sr) }()
			if err := plain(ctx, u, k); err != nil {
				return err
			}
			if err := <-done; err != nil {
				return err
			}
			return check()
		}, calls / 2},
	}
	runRoundCases(t, url, calls, func(c *Comm) *blockUse { return newBlockUse(c, 24) }, cases)
}

// roundCase is a loop of blocking calls over a rank's use U (its buffers):
// run makes call k.
type roundCase[U any] struct {
	name string
	run  func(ctx context.Context, u U, k int) error
	// rounds: the calls a resolved round must serve, of calls (on shm, 2
	// ranks): -1 none, else at least this many.
	rounds int
}

// runRoundCases runs each case's loop of calls on every rank of every data
// plane, over a use made by newUse, and checks how many of the calls ran a
// cached LL round: none without LL slots to every peer (TCP, mixed, a
// crowded host), else as the case says.
func runRoundCases[U any](t *testing.T, url string, calls int, newUse func(*Comm) U, cases []roundCase[U]) {
	for _, dp := range dataPlanes {
		t.Run(dp.name, func(t *testing.T) {
			ranks := planeRanks(dp.name)
			comms := planeGroup(t, url, ranks, dp.mod)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					mustAll(t, onAll(comms, func(c *Comm) error {
						u := newUse(c)
						before := c.plan.llRounds
						for k := range calls {
							if err := tc.run(ctx, u, k); err != nil {
								return err
							}
						}
						got := c.plan.llRounds - before
						switch {
						case dp.name != "shm" || runtime.NumCPU() < ranks:
							if got != 0 {
								return fmt.Errorf("%d calls ran an LL round without LL slots to every peer", got)
							}
						case tc.rounds < 0 && got != 0:
							return fmt.Errorf("%d calls ran an LL round, want none", got)
						case got < uint64(max(tc.rounds, 0)):
							return fmt.Errorf("%d calls ran an LL round, want at least %d", got, tc.rounds)
						}
						return nil
					}))
				})
			}
		})
	}
}

// TestBlockingLLRoundFailures stops a blocking call that runs the cached
// LL round: its context's deadline, an abort of either rank, the peer's
// Close, and a second blocking call of another goroutine (which must be
// refused with ErrInvalidArgument while the first completes). Each ends
// with its typed error within bounded time, on TCP and shm.
func TestBlockingLLRoundFailures(t *testing.T) {
	url := startNATS(t)
	cases := []struct {
		name string
		// stop stops rank 0's call, which waits for rank 1.
		stop func(ctx context.Context, comms []*Comm, us []*blockUse) error
		ctx  time.Duration // rank 0's call's context; 0: the test's
		want error
	}{
		{"deadline", func(context.Context, []*Comm, []*blockUse) error { return nil }, 100 * time.Millisecond, ErrTimeout},
		{"abort-self", func(_ context.Context, comms []*Comm, _ []*blockUse) error {
			comms[0].Abort(errors.New("test abort"))
			return nil
		}, 0, ErrAborted},
		{"abort-peer", func(_ context.Context, comms []*Comm, _ []*blockUse) error {
			comms[1].Abort(errors.New("test abort"))
			return nil
		}, 0, ErrAborted},
		{"peer-closed", func(_ context.Context, comms []*Comm, _ []*blockUse) error { return comms[1].Close() }, 0, ErrPeerLost},
		{"second-call", func(ctx context.Context, comms []*Comm, us []*blockUse) error {
			// Refused while rank 0's call runs; then rank 1 joins that call,
			// which completes.
			err := us[0].call(ctx, 1000, 1, false)
			if !errors.Is(err, ErrInvalidArgument) {
				return fmt.Errorf("second blocking call: %v, want ErrInvalidArgument", err)
			}
			return us[1].call(ctx, 999, 0, false)
		}, 0, nil},
	}
	for _, dp := range dataPlanes[:2] {
		for _, tc := range cases {
			t.Run(dp.name+"/"+tc.name, func(t *testing.T) {
				comms := planeGroup(t, url, 2, dp.mod)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				us := make([]*blockUse, 2)
				mustAll(t, onAll(comms, func(c *Comm) error { // good calls first: the round is resolved
					u := newBlockUse(c, 8)
					us[c.Rank()] = u
					for k := range 5 {
						if err := u.call(ctx, k, 0, false); err != nil {
							return err
						}
					}
					return nil
				}))
				want := uint64(0)
				if dp.name == "shm" && runtime.NumCPU() >= 2 {
					want = 4 // the first call only notes the buffers
				}
				if got := comms[0].plan.llRounds; got != want {
					t.Fatalf("%d calls ran the LL round, want %d", got, want)
				}
				cctx := ctx
				if tc.ctx > 0 {
					var stop context.CancelFunc
					cctx, stop = context.WithTimeout(ctx, tc.ctx)
					defer stop()
				}
				done := make(chan error, 1)
				start := time.Now()
				go func() { done <- us[0].call(cctx, 999, 0, false) }()
				time.Sleep(200 * time.Millisecond) // rank 0 polls its slots (or frames)
				if err := tc.stop(ctx, comms, us); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-done:
					if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
						t.Errorf("call: %v, want %v", err, tc.want)
					}
					if tc.want == ErrPeerLost && !namesRank(err, 1) {
						t.Errorf("call: %v, want it to name rank 1", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("the call did not return within 5 s of the stop")
				}
				if d := time.Since(start); d > 4*time.Second {
					t.Errorf("the call returned after %v", d)
				}
				if want > 0 {
					want++ // the stopped call's
				}
				if got := comms[0].plan.llRounds; got != want {
					t.Errorf("%d calls ran the LL round, want %d", got, want)
				}
			})
		}
	}
}

// TestBlockingLLRound1000 runs 1000 blocking AllToAllV calls of 2 ranks
// with fixed buffers and new contents, checks every byte, and counts 0
// allocations per call, on TCP and shm (where the LL round serves them).
func TestBlockingLLRound1000(t *testing.T) {
	url := startNATS(t)
	const calls = 1000
	for _, dp := range dataPlanes[:2] {
		t.Run(dp.name, func(t *testing.T) {
			comms := planeGroup(t, url, 2, dp.mod)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			allocs := make([]float64, 2)
			mustAll(t, onAll(comms, func(c *Comm) error {
				u := newBlockUse(c, 24)
				k := 0
				var bad error
				one := func() {
					if err := u.call(ctx, k, 0, false); err != nil && bad == nil {
						bad = err
					}
					k++
				}
				one()
				one()
				allocs[c.Rank()] = testing.AllocsPerRun(calls-3, one)
				want := uint64(0)
				if dp.name == "shm" && runtime.NumCPU() >= 2 {
					want = calls - 1
				}
				if bad == nil && c.plan.llRounds != want {
					bad = fmt.Errorf("%d of %d calls ran the LL round, want %d", c.plan.llRounds, calls, want)
				}
				return bad
			}))
			for r, a := range allocs {
				if a != 0 {
					t.Errorf("rank %d: %v allocations per call, want 0", r, a)
				}
			}
		})
	}
}

// reduceUse is one rank's buffers for a loop of blocking AllReduces of
// float64 elements: two pairs, so a case can swap them.
type reduceUse struct {
	c          *Comm
	send, recv [2][]byte
}

func newReduceUse(c *Comm, elems int) *reduceUse {
	u := &reduceUse{c: c}
	for i := range u.send {
		u.send[i], u.recv[i] = make([]byte, 8*elems), make([]byte, 8*elems)
	}
	return u
}

// call runs AllReduce k with op over the first elems elements of buffer
// pair b (in place when inPlace), rank r contributing r+k+i to element i,
// and checks every element: the sum, or the mean for Avg.
func (u *reduceUse) call(ctx context.Context, k, b, elems int, op Op, inPlace bool) error {
	r, n := u.c.Rank(), u.c.Size()
	send, recv := u.send[b][:8*elems], u.recv[b][:8*elems]
	if inPlace {
		recv = send
	}
	for i := range elems {
		binary.LittleEndian.PutUint64(send[8*i:], math.Float64bits(float64(r+k+i)))
	}
	if !inPlace {
		clear(recv)
	}
	if err := u.c.AllReduce(ctx, send, recv, Float64, op); err != nil {
		return fmt.Errorf("call %d: %w", k, err)
	}
	for i := range elems {
		want := float64(n*(k+i) + n*(n-1)/2)
		if op == Avg {
			want /= float64(n)
		}
		if got := math.Float64frombits(binary.LittleEndian.Uint64(recv[8*i:])); got != want {
			return fmt.Errorf("call %d (%s): element %d is %v, want %v", k, op, i, got, want)
		}
	}
	return nil
}

// TestBlockingAllReduceLLRound runs loops of small blocking AllReduces over
// TCP, shm and mixed, checking every element. The cached LL round must
// serve the loops that keep their buffers, size and operator (2 ranks on
// shm, where the LL plan is one round) and no call that changes one of
// them, nor an in-place one (two rounds).
func TestBlockingAllReduceLLRound(t *testing.T) {
	url := startNATS(t)
	const calls = 40
	cases := []roundCase[*reduceUse]{
		{"sum", func(ctx context.Context, u *reduceUse, k int) error { return u.call(ctx, k, 0, 4, Sum, false) }, calls - 2},
		{"avg", func(ctx context.Context, u *reduceUse, k int) error { return u.call(ctx, k, 0, 4, Avg, false) }, calls - 2},
		{"sum-and-avg", func(ctx context.Context, u *reduceUse, k int) error {
			// One plan (Avg sums, then divides), two signatures: the
			// round must carry the right one.
			return u.call(ctx, k, 0, 4, []Op{Sum, Avg}[k%2], false)
		}, -1},
		{"swap-buffers", func(ctx context.Context, u *reduceUse, k int) error { return u.call(ctx, k, k%2, 4, Sum, false) }, -1},
		{"swap-buffers-every-4", func(ctx context.Context, u *reduceUse, k int) error {
			return u.call(ctx, k, k/4%2, 4, Sum, false)
		}, calls / 2},
		{"change-size", func(ctx context.Context, u *reduceUse, k int) error {
			// Another size every 3rd call: another plan, and back.
			return u.call(ctx, k, 0, 4+4*(k%3/2), Sum, false)
		}, calls / 4},
		{"in-place", func(ctx context.Context, u *reduceUse, k int) error { return u.call(ctx, k, 0, 4, Sum, true) }, -1},
		{"alltoallv-between", func(ctx context.Context, u *reduceUse, k int) error {
			// The AllToAllV's own LL round between: the two rounds' epochs
			// and slots must not mix.
			if err := u.call(ctx, k, 0, 4, Sum, false); err != nil {
				return err
			}
			return newBlockUse(u.c, 16).call(ctx, k, 0, false)
		}, calls - 2},
	}
	runRoundCases(t, url, calls, func(c *Comm) *reduceUse { return newReduceUse(c, 8) }, cases)
}

// TestBlockingAllReduceLLRoundMismatch: once the LL round serves rank 0's
// AllReduces, rank 1 calls one with another operator of the same size.
// The signature after the round's message catches it: both ranks fail
// with ErrMismatch instead of returning a wrong sum.
func TestBlockingAllReduceLLRoundMismatch(t *testing.T) {
	url := startNATS(t)
	for _, dp := range dataPlanes[:2] {
		t.Run(dp.name, func(t *testing.T) {
			comms := planeGroup(t, url, 2, dp.mod)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			mustAll(t, onAll(comms, func(c *Comm) error {
				u := newReduceUse(c, 4)
				for k := range 5 {
					if err := u.call(ctx, k, 0, 4, Sum, false); err != nil {
						return err
					}
				}
				op := Sum
				if c.Rank() == 1 {
					op = Max
				}
				err := c.AllReduce(ctx, u.send[0][:32], u.recv[0][:32], Float64, op)
				if !errors.Is(err, ErrMismatch) {
					return fmt.Errorf("rank %d: %v, want ErrMismatch", c.Rank(), err)
				}
				return nil
			}))
			// With slots: 4 good calls after the first, and rank 0's
			// mismatched one.
			if got := comms[0].plan.llRounds; dp.name == "shm" && runtime.NumCPU() >= 2 && got != 5 {
				t.Errorf("rank 0: %d calls ran the LL round, want 5", got)
			}
		})
	}
}
