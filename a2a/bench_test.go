package a2a

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// BenchmarkAllToAllV measures one rank's AllToAllV latency with 2 in-process
// ranks over the default data plane, shared memory (both ranks are on one
// host; BenchmarkSendRecv compares shm with tcp); the partner rank runs the
// same number of calls in another goroutine. -benchmem shows the
// steady-state allocations per op.
func BenchmarkAllToAllV(b *testing.B) {
	url := startNATS(b)
	for _, size := range []int{8, 64 << 10, 1 << 20} {
		for _, algo := range []string{"pairwise", "fullmesh"} {
			b.Run(fmt.Sprintf("%s/%d", algo, size), func(b *testing.B) {
				comms := group(b, url, 2, func(c *Config) { c.Algo = algo })
				counts := []int{size, size}
				benchRanks(b, comms, size, func(ctx context.Context, c *Comm, send, recv []byte) error {
					return c.AllToAllV(ctx, send, counts, recv, counts)
				})
			})
		}
	}
}

// BenchmarkSendRecv measures a point-to-point ping-pong between 2 in-process
// ranks (rank 0 sends then receives, rank 1 receives then sends): one op is
// a round trip, so half of it is the one-way latency.
func BenchmarkSendRecv(b *testing.B) {
	url := startNATS(b)
	for _, tr := range []string{"shm", "tcp"} {
		for _, size := range []int{8, 64 << 10} {
			b.Run(fmt.Sprintf("%s/%d", tr, size), func(b *testing.B) {
				comms := group(b, url, 2, func(c *Config) {
					c.Transport = tr
					// Slow heartbeats: a loaded machine must not abort the run.
					c.HeartbeatInterval, c.PeerTimeout = time.Second, 30*time.Second
				})
				benchRanks(b, comms, size, func(ctx context.Context, c *Comm, send, recv []byte) error {
					if c.Rank() == 0 {
						if err := c.Send(ctx, send[:size], 1, 3); err != nil {
							return err
						}
						_, err := c.Recv(ctx, recv[:size], 1, 3)
						return err
					}
					if _, err := c.Recv(ctx, recv[:size], 0, 3); err != nil {
						return err
					}
					return c.Send(ctx, send[:size], 0, 3)
				})
			})
		}
	}
}

// benchRanks times rank 0's calls of op, with blocks of size bytes per peer,
// while the other ranks make the same calls in goroutines, after a warm-up
// on every rank.
func benchRanks(b *testing.B, comms []*Comm, size int, op func(ctx context.Context, c *Comm, send, recv []byte) error) {
	n := len(comms)
	ctx := context.Background()
	bufs := make([][2][]byte, n)
	for r := range bufs {
		bufs[r] = [2][]byte{make([]byte, n*size), make([]byte, n*size)}
	}
	for range 10 {
		mustAllB(b, onAllB(comms, func(c *Comm) error { return op(ctx, c, bufs[c.Rank()][0], bufs[c.Rank()][1]) }))
	}
	iters := b.N
	done := make(chan error, n)
	for r := 1; r < n; r++ {
		go func() {
			for range iters {
				if err := op(ctx, comms[r], bufs[r][0], bufs[r][1]); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	b.SetBytes(int64(n * size))
	b.ReportAllocs()
	b.ResetTimer()
	for range iters {
		if err := op(ctx, comms[0], bufs[0][0], bufs[0][1]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	for r := 1; r < n; r++ {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
}

func onAllB(comms []*Comm, f func(c *Comm) error) []error { return onAll(comms, f) }

// TestSteadyStateAllocations asserts the engine's zero-allocation goal: a
// warmed-up AllToAllV on 2 ranks allocates nothing (background heartbeats of
// the control plane are the only allocations the counter may see).
func TestSteadyStateAllocations(t *testing.T) {
	url := startNATS(t)
	// Slow heartbeats: their messages are the control plane's allocations,
	// which the process-wide counter would otherwise charge to the data plane.
	comms := group(t, url, 3, func(c *Config) { c.HeartbeatInterval, c.PeerTimeout, c.Report = 10*time.Second, 30*time.Second, -1 })
	counts := []int{4096, 100, 0}
	run := func(iters int) {
		mustAll(t, onAll(comms, func(c *Comm) error {
			send, recv := make([]byte, 8192), make([]byte, 3*4096)
			rc := []int{counts[c.Rank()], counts[c.Rank()], counts[c.Rank()]}
			for range iters {
				if err := c.AllToAllV(context.Background(), send, counts, recv, rc); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	run(50)
	const iters = 3000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	run(iters)
	runtime.ReadMemStats(&after)
	// per rank: the goroutines and buffers of run() itself cost a handful of allocations
	perOp := (float64(after.Mallocs-before.Mallocs) - 64) / float64(3*iters)
	if perOp > 0.2 {
		t.Errorf("%.2f allocations per AllToAllV, want 0", perOp)
	}
}

func mustAllB(b *testing.B, errs []error) {
	b.Helper()
	for r, err := range errs {
		if err != nil {
			b.Fatalf("rank %d: %v", r, err)
		}
	}
}

// TestCollectiveAllocations: warmed-up reductions and rooted collectives
// allocate nothing either.
func TestCollectiveAllocations(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 2, func(c *Config) { c.HeartbeatInterval, c.PeerTimeout, c.Report = 10*time.Second, 30*time.Second, -1 })
	run := func(iters int) {
		mustAll(t, onAll(comms, func(c *Comm) error {
			s, r := make([]byte, 4096), make([]byte, 4096)
			for range iters {
				if err := c.AllReduce(context.Background(), s, r, Float32, Sum); err != nil {
					return err
				}
				if err := c.Broadcast(context.Background(), r, 0); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	run(20)
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	run(1000)
	runtime.ReadMemStats(&b)
	if perOp := (float64(b.Mallocs-a.Mallocs) - 64) / 4000; perOp > 0.2 {
		t.Errorf("%.2f allocations per collective, want 0", perOp)
	}
}

// BenchmarkCallOverhead measures the fixed cost of a collective call on a
// single-rank group: begin and end, validation, the plan cache, the engine's
// run over a schedule that only copies. No peer is waited for, so it shows
// the per-call bookkeeping that every small collective pays on top of its
// messages, steadier than a multi-rank figure on a loaded machine.
func BenchmarkCallOverhead(b *testing.B) {
	url := startNATS(b)
	comms := group(b, url, 1, nil)
	c, ctx := comms[0], context.Background()
	send, recv := make([]byte, 8), make([]byte, 8)
	counts := []int{8}
	ops := []struct {
		name string
		call func() error
	}{
		{"alltoallv", func() error { return c.AllToAllV(ctx, send, counts, recv, counts) }},
		{"alltoall", func() error { return c.AllToAll(ctx, send, recv) }},
		{"allreduce", func() error { return c.AllReduce(ctx, send, recv, Float32, Sum) }},
		{"barrier", func() error { return c.Barrier(ctx) }},
	}
	for _, op := range ops {
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
