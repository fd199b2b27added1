package a2a

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"
)

// TestEveryCollectiveAllocatesNothing: once warm, every collective at every
// size class (one LL message, ring frames, segmented) allocates nothing on
// any rank. The process-wide counter sees all ranks and the harness's own
// goroutines, hence the small allowance.
func TestEveryCollectiveAllocatesNothing(t *testing.T) {
	url := startNATS(t)
	const n = 3
	comms := group(t, url, n, func(c *Config) {
		c.HeartbeatInterval, c.PeerTimeout, c.Report = 10*time.Second, 30*time.Second, -1
	})
	ctx := context.Background()
	for _, size := range []int{8, 64 << 10, 1 << 20} {
		block := size
		counts := make([]int, n)
		for i := range counts {
			counts[i] = block
		}
		learned := make([][]int, n) // AllToAllVInBand's receive counts, by rank
		for r := range learned {
			learned[r] = make([]int, n)
		}
		ops := []struct {
			name string
			op   func(c *Comm, send, recv []byte) error
		}{
			{"alltoallv", func(c *Comm, s, r []byte) error { return c.AllToAllV(ctx, s[:n*block], counts, r[:n*block], counts) }},
			{"alltoall", func(c *Comm, s, r []byte) error { return c.AllToAll(ctx, s[:n*block], r[:n*block]) }},
			{"alltoallv-inband", func(c *Comm, s, r []byte) error {
				return c.AllToAllVInBand(ctx, s[:n*block], counts, r[:n*block], learned[c.Rank()])
			}},
			{"allreduce", func(c *Comm, s, r []byte) error { return c.AllReduce(ctx, s[:block], r[:block], Float32, Sum) }},
			{"reducescatter", func(c *Comm, s, r []byte) error { return c.ReduceScatter(ctx, s[:n*block], r[:block], Float32, Sum) }},
			{"allgather", func(c *Comm, s, r []byte) error { return c.AllGather(ctx, s[:block], r[:n*block]) }},
			{"allgatherv", func(c *Comm, s, r []byte) error { return c.AllGatherV(ctx, s[:block], r[:n*block], counts) }},
			{"broadcast", func(c *Comm, s, r []byte) error { return c.Broadcast(ctx, s[:block], 0) }},
			{"reduce", func(c *Comm, s, r []byte) error { return c.Reduce(ctx, s[:block], r[:block], Float32, Sum, 1) }},
			{"gather", func(c *Comm, s, r []byte) error { return c.Gather(ctx, s[:block], r[:n*block], 0) }},
			{"gatherv", func(c *Comm, s, r []byte) error { return c.GatherV(ctx, s[:block], r[:n*block], counts, 2) }},
			{"scatter", func(c *Comm, s, r []byte) error { return c.Scatter(ctx, s[:n*block], r[:block], 1) }},
			{"scatterv", func(c *Comm, s, r []byte) error { return c.ScatterV(ctx, s[:n*block], counts, r[:block], 0) }},
			{"barrier", func(c *Comm, s, r []byte) error { return c.Barrier(ctx) }},
		}
		for _, o := range ops {
			t.Run(fmt.Sprintf("%s/%d", o.name, size), func(t *testing.T) {
				bufs := make([][2][]byte, n)
				for r := range bufs {
					bufs[r] = [2][]byte{make([]byte, n*block), make([]byte, n*block)}
				}
				run := func(iters int) {
					mustAll(t, onAll(comms, func(c *Comm) error {
						for range iters {
							if err := o.op(c, bufs[c.Rank()][0], bufs[c.Rank()][1]); err != nil {
								return err
							}
						}
						return nil
					}))
				}
				run(5)
				iters := max(10, 2000*8/max(size, 8)) // fewer of the large ones
				iters = min(iters, 300)
				// The lowest of three windows: an allocation per call shows in
				// every one, while the process's other goroutines (NATS, the
				// runtime, the race detector on a loaded machine) allocate now
				// and then, and once took a window of 10 large calls over the
				// slack.
				perOp := math.Inf(1)
				for range 3 {
					var before, after runtime.MemStats
					runtime.GC()
					runtime.ReadMemStats(&before)
					run(iters)
					runtime.ReadMemStats(&after)
					perOp = min(perOp, (float64(after.Mallocs-before.Mallocs)-64)/float64(n*iters))
				}
				if perOp > 0.1 {
					t.Errorf("%.2f allocations per call per rank, want 0", perOp)
				}
			})
		}
	}
}
