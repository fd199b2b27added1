package a2a

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/internal/nap"
)

// benchP50 runs op iters times on every rank (the others in goroutines) and
// reports rank 0's median call as p50-ns, next to the mean ns/op.
func benchP50(b *testing.B, comms []*Comm, op func(ctx context.Context, c *Comm) error) {
	ctx := context.Background()
	for range 100 {
		mustAllB(b, onAllB(comms, func(c *Comm) error { return op(ctx, c) }))
	}
	iters := b.N
	done := make(chan error, len(comms))
	for _, c := range comms[1:] {
		go func() {
			for range iters {
				if err := op(ctx, c); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	times := make([]time.Duration, iters)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range iters {
		t0 := time.Now()
		if err := op(ctx, comms[0]); err != nil {
			b.Fatal(err)
		}
		times[i] = time.Since(t0)
	}
	b.StopTimer()
	for range comms[1:] {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns")
}

// BenchmarkPersistentAllToAllV compares the persistent AllToAllV with the
// blocking one at 8 bytes per peer, 2 ranks over shared memory (issue 21's
// goal: p50 within one cross-core round trip plus 100 ns).
func BenchmarkPersistentAllToAllV(b *testing.B) {
	url := startNATS(b)
	comms := group(b, url, 2, func(c *Config) {
		c.Transport = "shm"
		c.HeartbeatInterval, c.PeerTimeout, c.Report = time.Second, 30*time.Second, -1
	})
	counts := []int{8, 8}
	bufs := make([][2][]byte, 2)
	ps := make([]*Persistent, 2)
	for r, c := range comms {
		bufs[r] = [2][]byte{make([]byte, 16), make([]byte, 16)}
		p, err := c.AllToAllVInit(bufs[r][0], counts, bufs[r][1], counts)
		if err != nil {
			b.Fatal(err)
		}
		ps[r] = p
	}
	b.Run("blocking", func(b *testing.B) {
		benchP50(b, comms, func(ctx context.Context, c *Comm) error {
			return c.AllToAllV(ctx, bufs[c.Rank()][0], counts, bufs[c.Rank()][1], counts)
		})
	})
	b.Run("persistent", func(b *testing.B) {
		benchP50(b, comms, func(ctx context.Context, c *Comm) error {
			p := ps[c.Rank()]
			if err := p.Start(ctx); err != nil {
				return err
			}
			return p.Wait(ctx)
		})
	})
}

// BenchmarkIAllToAllVOverlap measures an AllToAllV of 1 MiB per peer (2
// ranks, TCP and shm) alone, 1 ms of compute alone, and the two overlapped
// (IAllToAllV, compute, Wait); overlap/max reports the overlapped wall time
// over the longer of the two (issue 21's goal: <= 1.1). Compute is either
// busy on the CPU, or off it (the thread blocked in the kernel, as while it
// waits for a GPU kernel): with two in-process ranks on a 2-core machine busy
// compute leaves no core for the exchange's copies.
func BenchmarkIAllToAllVOverlap(b *testing.B) {
	url := startNATS(b)
	const size = 1 << 20
	for _, tc := range []struct {
		tr, compute string
	}{{"shm", "offcpu"}, {"tcp", "offcpu"}, {"shm", "busy"}, {"tcp", "busy"}} {
		tr, compute := tc.tr, compute
		if tc.compute == "offcpu" {
			compute = nap.For
		}
		b.Run(tc.tr+"/"+tc.compute, func(b *testing.B) {
			comms := group(b, url, 2, func(c *Config) {
				c.Transport = tr
				c.HeartbeatInterval, c.PeerTimeout, c.Report = time.Second, 30*time.Second, -1
			})
			counts := []int{size, size}
			bufs := make([][2][]byte, 2)
			for r := range bufs {
				bufs[r] = [2][]byte{make([]byte, 2*size), make([]byte, 2*size)}
			}
			ctx := context.Background()
			exchange := func(c *Comm) error {
				return c.AllToAllV(ctx, bufs[c.Rank()][0], counts, bufs[c.Rank()][1], counts)
			}
			mean := func(n int, f func() error) time.Duration {
				t0 := time.Now()
				for range n {
					if err := f(); err != nil {
						b.Fatal(err)
					}
				}
				return time.Since(t0) / time.Duration(n)
			}
			n := max(b.N, 20)
			var tx time.Duration
			mustAllB(b, onAllB(comms, func(c *Comm) error {
				d := mean(n, func() error { return exchange(c) })
				if c.Rank() == 0 {
					tx = d
				}
				return nil
			}))
			tc := mean(n, func() error { compute(time.Millisecond); return nil })
			var to time.Duration
			b.ResetTimer()
			mustAllB(b, onAllB(comms, func(c *Comm) error {
				d := mean(n, func() error {
					q := c.IAllToAllV(ctx, bufs[c.Rank()][0], counts, bufs[c.Rank()][1], counts)
					compute(time.Millisecond)
					_, err := q.Wait(ctx)
					return err
				})
				if c.Rank() == 0 {
					to = d
				}
				return nil
			}))
			b.ReportMetric(float64(tx.Microseconds()), "exchange-us")
			b.ReportMetric(float64(tc.Microseconds()), "compute-us")
			b.ReportMetric(float64(to.Microseconds()), "overlapped-us")
			b.ReportMetric(float64(to)/float64(max(tx, tc)), "overlap/max")
		})
	}
}

// BenchmarkStartedAfterBlocking: how soon a collective started while a
// blocking one runs on another goroutine follows that call's end. On each of
// 2 shm ranks one goroutine calls Barrier, rank 1's 5 ms late (its thread
// blocked); rank 0 starts an IBarrier 1 ms into its Barrier, which waits
// for the turn, and rank 1 starts its own once its Barrier returns. lag is
// rank 0's IBarrier end less its Barrier's end (p50 and p90).
func BenchmarkStartedAfterBlocking(b *testing.B) {
	comms := group(b, startNATS(b), 2, func(c *Config) {
		c.Transport = "shm"
		c.HeartbeatInterval, c.PeerTimeout, c.Report = time.Second, 30*time.Second, -1
	})
	ctx := context.Background()
	lags := make([]time.Duration, 0, b.N)
	for range b.N {
		var blockingEnd, startedEnd time.Time
		mustAllB(b, onAllB(comms, func(c *Comm) error {
			r := c.Rank()
			blocking := make(chan error, 1)
			go func() {
				if r == 1 {
					nap.For(5 * time.Millisecond)
				}
				err := c.Barrier(ctx)
				if r == 0 {
					blockingEnd = time.Now()
				}
				blocking <- err
			}()
			var err error
			if r == 1 {
				err = <-blocking // rank 1 starts its IBarrier after, as rank 0 did
			} else {
				nap.For(time.Millisecond)
			}
			q := c.IBarrier(ctx)
			_, qerr := q.Wait(ctx)
			if r == 0 {
				startedEnd = time.Now()
				err = <-blocking
			}
			if err != nil {
				return err
			}
			return qerr
		}))
		lags = append(lags, startedEnd.Sub(blockingEnd))
	}
	b.StopTimer()
	slices.Sort(lags)
	b.ReportMetric(float64(lags[len(lags)/2].Nanoseconds())/1e3, "lag_p50_us")
	b.ReportMetric(float64(lags[len(lags)*9/10].Nanoseconds())/1e3, "lag_p90_us")
}

// compute busy-loops for d, as a kernel on the CPU would.
func compute(d time.Duration) {
	for t0 := time.Now(); time.Since(t0) < d; {
	}
}

// BenchmarkPersistentCallOverhead is BenchmarkCallOverhead for the
// persistent forms and a nonblocking call: the fixed cost of a Start and a
// Wait on a single-rank group, steadier than a two-rank figure on a loaded
// machine.
func BenchmarkPersistentCallOverhead(b *testing.B) {
	url := startNATS(b)
	comms := group(b, url, 1, nil)
	c, ctx := comms[0], context.Background()
	send, recv := make([]byte, 8), make([]byte, 8)
	counts := []int{8}
	pv, err := c.AllToAllVInit(send, counts, recv, counts)
	if err != nil {
		b.Fatal(err)
	}
	pr, err := c.AllReduceInit(send, recv, Float32, Sum)
	if err != nil {
		b.Fatal(err)
	}
	startWait := func(p *Persistent) func() error {
		return func() error {
			if err := p.Start(ctx); err != nil {
				return err
			}
			return p.Wait(ctx)
		}
	}
	for _, op := range []struct {
		name string
		call func() error
	}{
		{"alltoallv", func() error { return c.AllToAllV(ctx, send, counts, recv, counts) }},
		{"alltoallv-persistent", startWait(pv)},
		{"alltoallv-nonblocking", func() error {
			_, err := c.IAllToAllV(ctx, send, counts, recv, counts).Wait(ctx)
			return err
		}},
		{"allreduce", func() error { return c.AllReduce(ctx, send, recv, Float32, Sum) }},
		{"allreduce-persistent", startWait(pr)},
	} {
		b.Run(op.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := op.call(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
