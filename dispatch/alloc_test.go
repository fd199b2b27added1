package dispatch

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

// TestSteadyStateAllocations: once warm, a dispatch + combine step allocates
// nothing, in the synchronous form and in the pipelined asynchronous one,
// with rows in their dtype and in FP8, in the normal and the decode mode
// (CountsInBand; the NATS mode allocates in the control plane), and the
// decode mode on two fake hosts. As in the a2a
// package's test, heartbeats are slowed down because their messages are the
// only other allocations the process-wide counter sees.
func TestSteadyStateAllocations(t *testing.T) {
	const ranks = 3
	url := startNATS(t)
	comms := group(t, url, ranks, func(c *a2a.Config) { c.HeartbeatInterval, c.PeerTimeout, c.Report = 10*time.Second, 30*time.Second, -1 })
	l := layer{experts: 6, k: 2, hidden: 16, tokens: 64, dtype: reduce.BFloat16, capacity: 1.25, skew: 1, seed: 5}
	for _, wire := range []WireFormat{WireSame, WireFP8} {
		for _, maxTokens := range []int{0, 72} {
			name := wire.String()
			if maxTokens > 0 {
				name += "/decode"
			}
			t.Run(name, func(t *testing.T) {
				ds := newDispatchers(t, comms, Config{Experts: 6, K: 2, Hidden: 16, DType: reduce.BFloat16, CapacityFactor: 1.25,
					Wire: wire, MaxTokens: maxTokens, Logger: discard})
				steadyState(t, ds, l, 0.2)
			})
		}
	}
	// The decode mode across (fake) hosts: 2 hosts of 2 ranks, so each
	// rank has a shared-memory peer and two point-to-point peers, whose
	// blocks travel by persistent requests (Isend/Irecv made 8 allocations
	// per step). Its steps are slower, and on a loaded machine the control
	// plane's timers add up to 0.25 per step in the window: the limit is
	// looser, and still fails for a single allocation per step.
	hosts := group(t, url, 4, func(c *a2a.Config) {
		c.HeartbeatInterval, c.PeerTimeout, c.Report = 10*time.Second, 30*time.Second, -1
		c.Host = fmt.Sprintf("host%d", c.Rank/2)
	})
	l4 := layer{experts: 8, k: 2, hidden: 16, tokens: 64, dtype: reduce.BFloat16, capacity: 1.25, skew: 1, seed: 6}
	for _, wire := range []WireFormat{WireSame, WireFP8} {
		t.Run("hosts2x2/"+wire.String()+"/decode", func(t *testing.T) {
			ds := newDispatchers(t, hosts, Config{Experts: 8, K: 2, Hidden: 16, DType: reduce.BFloat16, CapacityFactor: 1.25,
				Wire: wire, MaxTokens: 72, Logger: discard})
			if !ds[0].SharedMemory() || !ds[0].UsesAllToAllV() {
				t.Fatalf("shared memory %v, point to point %v: want both", ds[0].SharedMemory(), ds[0].UsesAllToAllV())
			}
			steadyState(t, ds, l4, 0.5)
		})
	}
}

// steadyState measures the allocations of warm steps on ds, failing above
// limit per rank and step.
func steadyState(t *testing.T, ds []*Dispatcher, l layer, limit float64) {
	ranks := len(ds)
	// Inputs for two alternating steps, made before measuring.
	type input struct {
		tok [2][]byte
		out [2][]byte
		dec [2]*routing.Decision
	}
	in := make([]input, ranks)
	for r := range in {
		for s := range 2 {
			in[r].tok[s] = l.tokenRows(r, s)
			in[r].out[s] = make([]byte, len(in[r].tok[s]))
			in[r].dec[s] = l.decision(r, s)
		}
	}
	ctx := context.Background()
	sync := func(r, i int) error {
		d, s := ds[r], i%2
		h, err := d.Dispatch(ctx, in[r].tok[s], in[r].dec[s])
		if err != nil {
			return err
		}
		if err := d.Combine(ctx, h, h.Recv(), in[r].out[s]); err != nil {
			return err
		}
		h.Release()
		return nil
	}
	async := func(r, i int) error {
		d := ds[r]
		h0, err := d.Dispatch(ctx, in[r].tok[0], in[r].dec[0])
		if err != nil {
			return err
		}
		h1, err := d.DispatchAsync(ctx, in[r].tok[1], in[r].dec[1])
		if err != nil {
			return err
		}
		if err := h1.Wait(); err != nil {
			return err
		}
		if err := d.CombineAsync(ctx, h0, h0.Recv(), in[r].out[0]); err != nil {
			return err
		}
		if err := h0.Wait(); err != nil {
			return err
		}
		if err := d.Combine(ctx, h1, h1.Recv(), in[r].out[1]); err != nil {
			return err
		}
		h0.Release()
		h1.Release()
		return nil
	}
	for _, tc := range []struct {
		name string
		step func(r, i int) error
	}{{"sync", sync}, {"async", async}} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(iters int) {
				mustAll(t, onAll(ranks, func(r int) error {
					for i := range iters {
						if err := tc.step(r, i); err != nil {
							return err
						}
					}
					return nil
				}))
			}
			run(30)
			const iters = 300
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			run(iters)
			runtime.ReadMemStats(&after)
			// onAll's goroutines and closures cost a handful per run.
			perStep := (float64(after.Mallocs-before.Mallocs) - 64) / float64(ranks*iters)
			t.Logf("%.3f allocations per step", perStep)
			if perStep > limit {
				t.Errorf("%.2f allocations per step, want 0", perStep)
			}
		})
	}
}
