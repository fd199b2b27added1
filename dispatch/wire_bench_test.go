package dispatch

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

// BenchmarkWire compares the dispatch wire formats on DeepSeek-V3's row
// (H=7168 bfloat16): the same group runs, alternately, a WireSame and a
// WireFP8 step (dispatch, identity experts in place, combine) on the same
// tokens and routing, so load changes on a shared machine land on both. It
// reports, per step, the dispatch payload rank 0 sends (Stats.SentBytes),
// the dispatch time (Stats.DispatchTime, mean over ranks) and the whole
// step's wall time of each, and the FP8/same ratios. A third step in each
// alternation is the bare pair of AllToAllV that moves the WireSame step's
// bytes (baseStep), so that every step time has its ratio to the bare
// exchange run in the same process (same_overhead_%, fp8/base_step).
// /shm runs one host
// (rows through shared memory), /hosts2 two fake hosts (half the rows by
// TCP), /tcp forces TCP between every pair.
func BenchmarkWire(b *testing.B) {
	const ranks, experts, k, tokens, hidden = 4, 16, 2, 512, 7168
	for _, net := range []string{"shm", "hosts2", "tcp"} {
		b.Run(fmt.Sprintf("P%d/E%d/k%d/T%d/H%d/bfloat16/%s", ranks, experts, k, tokens, hidden, net), func(b *testing.B) {
			url := startNATS(b)
			comms := group(b, url, ranks, func(c *a2a.Config) {
				switch net {
				case "hosts2":
					c.Host = fmt.Sprintf("host%d", c.Rank*2/ranks)
				case "tcp":
					c.Transport = "tcp"
				}
			})
			cfg := Config{Experts: experts, K: k, Hidden: hidden, DType: reduce.BFloat16, Hierarchy: HierarchyOff, Logger: discard}
			same := newDispatchers(b, comms, cfg)
			cfg.Wire = WireFP8
			fp8 := newDispatchers(b, comms, cfg)
			rb := hidden * 2
			toks, decs := make([][]byte, ranks), make([]*routing.Decision, ranks)
			outs := make([][]byte, ranks)
			for r := range ranks {
				rng := rand.New(rand.NewPCG(42, uint64(r)))
				toks[r], outs[r] = make([]byte, tokens*rb), make([]byte, tokens*rb)
				for i := range tokens * hidden {
					putElem(reduce.BFloat16, toks[r], i, float32(rng.NormFloat64()))
				}
				logits := make([]float32, tokens*experts)
				if err := routing.SkewedLogits(rng, tokens, experts, 0, logits); err != nil {
					b.Fatal(err)
				}
				decs[r] = &routing.Decision{}
				if err := (routing.Gate{Experts: experts, K: k}).Route(logits, tokens, decs[r]); err != nil {
					b.Fatal(err)
				}
			}
			type sample struct {
				sent     [ranks]int64
				dispatch [ranks]time.Duration
			}
			step := func(ds []*Dispatcher, s *sample) time.Duration {
				t0 := time.Now()
				mustAll(b, onAll(ranks, func(r int) error {
					ctx := context.Background()
					h, err := ds[r].Dispatch(ctx, toks[r], decs[r])
					if err != nil {
						return err
					}
					defer h.Release()
					st := h.Stats()
					s.sent[r], s.dispatch[r] = st.SentBytes, st.DispatchTime
					return ds[r].Combine(ctx, h, h.Output(), outs[r])
				}))
				return time.Since(t0)
			}
			bare := bareRanks(b, same, toks, decs)
			var wall, disp [2]time.Duration
			var sent [2]int64
			var base time.Duration
			for i := range b.N + 2 {
				for w, ds := range [][]*Dispatcher{same, fp8} {
					var s sample
					t := step(ds, &s)
					if i < 2 { // warm-up: buffers grow, segments get mapped
						continue
					}
					wall[w] += t
					for r := range ranks {
						disp[w] += s.dispatch[r] / ranks
					}
					sent[w] += s.sent[0]
				}
				t0 := time.Now()
				mustAll(b, onAll(ranks, baseStep(same, bare)))
				if i >= 2 {
					base += time.Since(t0)
				}
			}
			n := float64(b.N)
			b.ReportMetric(float64(base.Microseconds())/n, "base_step_us/step")
			b.ReportMetric(100*(float64(wall[0])/float64(base)-1), "same_overhead_%")
			b.ReportMetric(float64(wall[1])/float64(base), "fp8/base_step")
			for w, name := range []string{"same", "fp8"} {
				b.ReportMetric(float64(sent[w])/n, name+"_dispatch_B/step")
				b.ReportMetric(float64(disp[w].Microseconds())/n, name+"_dispatch_us/step")
				b.ReportMetric(float64(wall[w].Microseconds())/n, name+"_step_us/step")
			}
			b.ReportMetric(float64(sent[1])/float64(sent[0]), "fp8/same_bytes")
			b.ReportMetric(float64(disp[1])/float64(disp[0]), "fp8/same_dispatch")
			b.ReportMetric(float64(wall[1])/float64(wall[0]), "fp8/same_step")
		})
	}
}

// bareRanks dispatches every rank's tokens once with ds and returns the
// baseline (baseStep) of the bytes those dispatches moved.
func bareRanks(b *testing.B, ds []*Dispatcher, toks [][]byte, decs []*routing.Decision) []*benchRank {
	in := make([]*benchRank, len(ds))
	mustAll(b, onAll(len(ds), func(r int) error {
		h, err := ds[r].Dispatch(context.Background(), toks[r], decs[r])
		if err != nil {
			return err
		}
		defer h.Release()
		in[r] = &benchRank{}
		in[r].bareOf(h, r)
		return ds[r].Combine(context.Background(), h, h.Output(), make([]byte, len(toks[r])))
	}))
	return in
}
