package a2a

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/algo"
)

// directUse is one rank's persistent AllToAllV of 8 bytes per peer (all LL
// where the pair has slots) and its buffers, for the direct turn's tests.
type directUse struct {
	c          *Comm
	p          *Persistent
	send, recv []byte
	counts     []int
}

func newDirectUse(c *Comm, per int) (*directUse, error) {
	n := c.Size()
	u := &directUse{c: c, send: make([]byte, per*n), recv: make([]byte, per*n), counts: make([]int, n)}
	for j := range u.counts {
		u.counts[j] = per
	}
	var err error
	u.p, err = c.AllToAllVInit(u.send, u.counts, u.recv, u.counts)
	return u, err
}

// fill writes use k's contents into send.
func (u *directUse) fill(k int) {
	r, per := u.c.Rank(), u.counts[0]
	for j := range u.counts {
		for b := range per {
			u.send[j*per+b] = pat(r, j, b+k)
		}
	}
}

// check verifies every byte use k received.
func (u *directUse) check(k int) error {
	r, per := u.c.Rank(), u.counts[0]
	for j := range u.counts {
		for b := range per {
			if got, want := u.recv[j*per+b], pat(j, r, b+k); got != want {
				return fmt.Errorf("use %d: byte %d from rank %d is %d, want %d", k, b, j, got, want)
			}
		}
	}
	return nil
}

// ringP2P posts a receive from the previous rank and a send to the next,
// tag k, and returns them with the check of the received bytes.
func ringP2P(ctx context.Context, c *Comm, k int) (rr, sr *Request, check func() error) {
	r, n := c.Rank(), c.Size()
	next, prev := (r+1)%n, (r+n-1)%n
	in := make([]byte, 100+k)
	rr = c.Irecv(ctx, in, prev, k)
	sr = c.Isend(ctx, p2pMessage(r, next, k, len(in)), next, k)
	return rr, sr, func() error {
		if want := p2pMessage(prev, r, k, len(in)); string(in) != string(want) {
			return fmt.Errorf("p2p round %d: wrong bytes from rank %d", k, prev)
		}
		return nil
	}
}

// TestPersistentDirectMix runs a persistent AllToAllV in every mix with
// nonblocking collectives, blocking collectives of another goroutine and
// point-to-point waiters, over TCP, shm and mixed, checking every byte. The
// use alone must take the direct turn every time; in the mixes it takes
// whichever turn is free, and the order of the calls stays today's.
func TestPersistentDirectMix(t *testing.T) {
	url := startNATS(t)
	const rounds = 30
	ranks := 2 // not crowded on 2 CPUs: shm's uses run engine.RunLL
	type step func(ctx context.Context, u *directUse, k int) error
	waitP := func(ctx context.Context, u *directUse) error { return u.p.Wait(ctx) }
	cases := []struct {
		name   string
		run    step
		direct bool // every use must run in a direct turn
	}{
		{"alone", func(ctx context.Context, u *directUse, k int) error {
			if err := u.p.Start(ctx); err != nil {
				return err
			}
			return waitP(ctx, u)
		}, true},
		{"icoll-before", func(ctx context.Context, u *directUse, k int) error {
			out := make([]byte, 8)
			ar := u.c.IAllReduce(ctx, []byte{byte(k), 0, 0, 0, 0, 0, 0, 0}, out, Int64, Sum)
			if err := u.p.Start(ctx); err != nil {
				return err
			}
			if err := waitP(ctx, u); err != nil {
				return err
			}
			if _, err := ar.Wait(ctx); err != nil {
				return err
			}
			if out[0] != byte(ranks*k) {
				return fmt.Errorf("allreduce: %d, want %d", out[0], ranks*k)
			}
			return nil
		}, false},
		{"icoll-after", func(ctx context.Context, u *directUse, k int) error {
			if err := u.p.Start(ctx); err != nil {
				return err
			}
			out := make([]byte, 8)
			ar := u.c.IAllReduce(ctx, []byte{1, 0, 0, 0, 0, 0, 0, 0}, out, Int64, Sum)
			ib := u.c.IBarrier(ctx)
			if k%2 == 0 { // the nonblocking calls' Waits first: their goroutines run the use
				if err := WaitAll(ctx, ib, ar); err != nil {
					return err
				}
			}
			if err := waitP(ctx, u); err != nil {
				return err
			}
			if err := WaitAll(ctx, ar, ib); err != nil {
				return err
			}
			if int(out[0]) != ranks {
				return fmt.Errorf("allreduce: %d, want %d", out[0], ranks)
			}
			return nil
		}, false},
		{"blocking-other-goroutine", func(ctx context.Context, u *directUse, k int) error {
			if err := u.p.Start(ctx); err != nil {
				return err
			}
			// Called after the Start, on every rank: it waits for the use
			// (or runs it) and then runs, as today's rules order it.
			done := make(chan error, 1)
			go func() { done <- u.c.AllReduce(ctx, make([]byte, 8), make([]byte, 8), Int64, Sum) }()
			if k%2 == 0 {
				time.Sleep(time.Millisecond) // let it reach the queue first
			}
			if err := waitP(ctx, u); err != nil {
				return err
			}
			return <-done
		}, false},
		{"p2p-before", func(ctx context.Context, u *directUse, k int) error {
			rr, sr, check := ringP2P(ctx, u.c, k)
			if err := u.p.Start(ctx); err != nil {
				return err
			}
			if err := waitP(ctx, u); err != nil {
				return err
			}
			if err := WaitAll(ctx, rr, sr); err != nil {
				return err
			}
			return check()
		}, false},
		{"p2p-before-waited-elsewhere", func(ctx context.Context, u *directUse, k int) error {
			rr, sr, check := ringP2P(ctx, u.c, k)
			done := make(chan error, 1)
			go func() { done <- WaitAll(ctx, rr, sr) }()
			if err := u.p.Start(ctx); err != nil {
				return err
			}
			if err := waitP(ctx, u); err != nil {
				return err
			}
			if err := <-done; err != nil {
				return err
			}
			return check()
		}, false},
		{"p2p-after-waited-elsewhere", func(ctx context.Context, u *directUse, k int) error {
			if err := u.p.Start(ctx); err != nil {
				return err
			}
			// Posted after the use: fenced behind it, so the waiter may run
			// the use itself while this goroutine's Wait tries its turn.
			rr, sr, check := ringP2P(ctx, u.c, k)
			done := make(chan error, 1)
			go func() { done <- WaitAll(ctx, sr, rr) }()
			if err := waitP(ctx, u); err != nil {
				return err
			}
			if err := <-done; err != nil {
				return err
			}
			return check()
		}, false},
	}
	for _, dp := range dataPlanes {
		t.Run(dp.name, func(t *testing.T) {
			ranks = planeRanks(dp.name)
			comms := planeGroup(t, url, ranks, dp.mod)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					mustAll(t, onAll(comms, func(c *Comm) error {
						u, err := newDirectUse(c, 8)
						if err != nil {
							return err
						}
						defer u.p.Close()
						for k := range rounds {
							u.fill(k)
							if err := tc.run(ctx, u, k); err != nil {
								return fmt.Errorf("round %d: %w", k, err)
							}
							if err := u.check(k); err != nil {
								return err
							}
						}
						if tc.direct && u.p.direct != rounds {
							return fmt.Errorf("%d of %d uses ran in a direct turn, want all", u.p.direct, rounds)
						}
						if want := dp.name == "shm" && ranks <= runtime.NumCPU(); (u.p.ll != nil) != want {
							return fmt.Errorf("resolved LL round: %v, want %v", u.p.ll != nil, want)
						}
						return nil
					}))
				})
			}
		})
	}
}

// TestPersistentDirectFailures stops a use that runs in a direct turn: its
// context's deadline, an abort of either rank, the peer's Close and the
// rank's own Close must each end the Wait with its typed error, within
// bounded time, on TCP and shm.
func TestPersistentDirectFailures(t *testing.T) {
	url := startNATS(t)
	cases := []struct {
		name string
		// stop stops rank 0's use, which waits for rank 1 (never started).
		stop func(comms []*Comm)
		ctx  time.Duration // rank 0's Start context; 0: the test's
		want error
	}{
		{"deadline", func([]*Comm) {}, 100 * time.Millisecond, ErrTimeout},
		{"abort-self", func(comms []*Comm) { comms[0].Abort(errors.New("test abort")) }, 0, ErrAborted},
		{"abort-peer", func(comms []*Comm) { comms[1].Abort(errors.New("test abort")) }, 0, ErrAborted},
		{"peer-closed", func(comms []*Comm) { comms[1].Close() }, 0, ErrPeerLost},
		// Close of the waiting rank's own Comm: it waits for the use to give
		// the call lock up, which the use's engine does at its next check.
		{"self-closed", func(comms []*Comm) { comms[0].Close() }, 0, ErrClosed},
	}
	for _, dp := range dataPlanes[:2] {
		for _, tc := range cases {
			t.Run(dp.name+"/"+tc.name, func(t *testing.T) {
				comms := planeGroup(t, url, 2, dp.mod)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				us := make([]*directUse, 2)
				mustAll(t, onAll(comms, func(c *Comm) error { // a few good uses first
					u, err := newDirectUse(c, 8)
					us[c.Rank()] = u
					for k := range 5 {
						u.fill(k)
						if err == nil {
							err = u.p.Start(ctx)
						}
						if err == nil {
							err = u.p.Wait(ctx)
						}
						if err == nil {
							err = u.check(k)
						}
					}
					return err
				}))
				u := us[0]
				sctx := ctx
				if tc.ctx > 0 {
					var stop context.CancelFunc
					sctx, stop = context.WithTimeout(ctx, tc.ctx)
					defer stop()
				}
				if err := u.p.Start(sctx); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				start := time.Now()
				go func() { done <- u.p.Wait(ctx) }()
				time.Sleep(200 * time.Millisecond) // rank 0 polls its slots (or frames)
				tc.stop(comms)
				select {
				case err := <-done:
					if !errors.Is(err, tc.want) {
						t.Errorf("Wait: %v, want %v", err, tc.want)
					}
					if tc.want == ErrPeerLost && !namesRank(err, 1) {
						t.Errorf("Wait: %v, want it to name rank 1", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("Wait did not return within 5 s of the stop")
				}
				if d := time.Since(start); d > 4*time.Second {
					t.Errorf("Wait returned after %v", d)
				}
				if want := dp.name == "shm" && runtime.NumCPU() >= 2; (u.p.ll != nil) != want {
					t.Errorf("resolved LL round: %v, want %v", u.p.ll != nil, want)
				}
				if u.p.direct != 6 {
					t.Errorf("%d uses ran in a direct turn, want all 6", u.p.direct)
				}
				// A failed use reaches the reports at once, not with its batch.
				r := comms[0].rep
				r.mu.Lock()
				errs, ops := r.t.errors, r.t.ops[reportOp("alltoallv")][u.p.algo]
				r.mu.Unlock()
				if errs != 1 || ops != 6 {
					t.Errorf("reports: %d errors of %d uses, want 1 of 6", errs, ops)
				}
			})
		}
	}
}

// TestPersistentTallyBatched: a Persistent's uses reach the Comm's report
// tally in batches of tallyBatch, an error at once, and the rest at Close;
// every use is counted once, with the wait attribution of its peer.
func TestPersistentTallyBatched(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 2, func(c *Config) { patient(c); c.Transport, c.Report = "shm", time.Hour })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const uses = tallyBatch + tallyBatch/2
	counted := func(c *Comm) (ops, last uint64) {
		c.rep.mu.Lock()
		defer c.rep.mu.Unlock()
		return c.rep.t.ops[reportOp("alltoallv")][algo.AlgoLL], c.rep.t.last[1-c.Rank()]
	}
	mustAll(t, onAll(comms, func(c *Comm) error {
		u, err := newDirectUse(c, 8)
		if err != nil {
			return err
		}
		if u.p.algo != algo.AlgoLL {
			return fmt.Errorf("algo %v, want ll", u.p.algo)
		}
		for k := range uses {
			u.fill(k)
			if err := u.p.Start(ctx); err != nil {
				return err
			}
			if err := u.p.Wait(ctx); err != nil {
				return err
			}
		}
		if ops, _ := counted(c); ops != tallyBatch {
			return fmt.Errorf("%d uses counted before Close, want the first batch, %d", ops, tallyBatch)
		}
		if err := u.p.Close(); err != nil {
			return err
		}
		if ops, last := counted(c); ops != uses || last == 0 || last > uses {
			return fmt.Errorf("%d uses counted after Close (peer's arrivals %d), want %d", ops, last, uses)
		}
		return nil
	}))
}

// TestPersistentDirect1000 reuses an all-LL persistent AllToAllV of 2 ranks
// (on shm, its resolved round: engine.RunLL) for 1000 Starts with new
// contents, checks every byte, and counts 0 allocations per Start-Wait.
func TestPersistentDirect1000(t *testing.T) {
	url := startNATS(t)
	const uses = 1000
	for _, dp := range dataPlanes[:2] {
		t.Run(dp.name, func(t *testing.T) {
			comms := planeGroup(t, url, 2, dp.mod)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			allocs := make([]float64, 2)
			mustAll(t, onAll(comms, func(c *Comm) error {
				u, err := newDirectUse(c, 24)
				if err != nil {
					return err
				}
				k := 0
				var bad error
				use := func() {
					u.fill(k)
					if err := u.p.Start(ctx); err != nil && bad == nil {
						bad = err
					}
					if err := u.p.Wait(ctx); err != nil && bad == nil {
						bad = fmt.Errorf("use %d: %w", k, err)
					}
					if err := u.check(k); err != nil && bad == nil {
						bad = err
					}
					k++
				}
				use()
				allocs[c.Rank()] = testing.AllocsPerRun(uses-2, use)
				if bad == nil && (u.p.direct != uses || u.p.algo != algo.AlgoLL) {
					bad = fmt.Errorf("%d of %d uses in a direct turn, algo %v; want all, ll", u.p.direct, uses, u.p.algo)
				}
				if want := dp.name == "shm" && runtime.NumCPU() >= 2; bad == nil && (u.p.ll != nil) != want {
					bad = fmt.Errorf("resolved LL round: %v, want %v", u.p.ll != nil, want)
				}
				return errors.Join(bad, u.p.Close())
			}))
			for r, a := range allocs {
				if a != 0 {
					t.Errorf("rank %d: %v allocations per Start-Wait, want 0", r, a)
				}
			}
		})
	}
}
