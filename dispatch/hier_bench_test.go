package dispatch

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

// BenchmarkHierarchy alternates a flat MoE step and a relay-path step of
// the DeepSeek-V3 shape (256 experts, top-8, hidden 7168, bfloat16) on 4
// fake hosts of 2 ranks (TCP between hosts, shared memory inside), on the
// same group with the same tokens and routing, and reports both step times
// (dispatch, identity experts in place, combine), their ratio and each
// path's bytes sent across hosts per rank and step. Alternating keeps a
// change of the machine's load from landing on one side only. A third step
// in each alternation is the bare pair of AllToAllV that moves the flat
// step's bytes (baseStep): flat/base and hier/base are both steps' ratios
// to it.
func BenchmarkHierarchy(b *testing.B) {
	for _, tokens := range []int{64, 256} {
		for _, wire := range []WireFormat{WireSame, WireFP8} {
			b.Run(fmt.Sprintf("T%d/%v", tokens, wire), func(b *testing.B) {
				benchHierarchy(b, tokens, wire)
			})
		}
	}
}

func benchHierarchy(b *testing.B, tokens int, wire WireFormat) {
	const ranks, hosts, experts, k, hidden = 8, 4, 256, 8, 7168
	dt := reduce.BFloat16
	comms := group(b, startNATS(b), ranks, fakeHosts(func(r int) int { return r / (ranks / hosts) }))
	cfg := Config{Experts: experts, K: k, Hidden: hidden, DType: dt, Wire: wire, Logger: discard}
	cfg.Hierarchy = HierarchyOff
	flat := newDispatchers(b, comms, cfg)
	cfg.Hierarchy = HierarchyOn
	hier := newDispatchers(b, comms, cfg)
	rb := hidden * dt.Size()
	toks, outs := make([][]byte, ranks), make([][]byte, ranks)
	decs := make([]routing.Decision, ranks)
	gate := routing.Gate{Experts: experts, K: k}
	for r := range ranks {
		rng := rand.New(rand.NewPCG(42, uint64(r)))
		toks[r], outs[r] = make([]byte, tokens*rb), make([]byte, tokens*rb)
		for i := range tokens * hidden {
			putElem(dt, toks[r], i, float32(rng.NormFloat64()))
		}
		logits := make([]float32, tokens*experts)
		if err := routing.SkewedLogits(rng, tokens, experts, 0, logits); err != nil {
			b.Fatal(err)
		}
		if err := gate.Route(logits, tokens, &decs[r]); err != nil {
			b.Fatal(err)
		}
	}
	cross := make([][2]int64, ranks)
	step := func(ds []*Dispatcher, side int) func(r int) error {
		return func(r int) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			h, err := ds[r].Dispatch(ctx, toks[r], &decs[r])
			if err != nil {
				return err
			}
			defer h.Release()
			cross[r][side] = h.Stats().CrossHostBytes
			return ds[r].Combine(ctx, h, h.Output(), outs[r])
		}
	}
	decp := make([]*routing.Decision, ranks)
	for r := range decp {
		decp[r] = &decs[r]
	}
	bare := bareRanks(b, flat, toks, decp)
	var tf, th, tb time.Duration
	for i := range b.N + 2 {
		t0 := time.Now()
		mustAll(b, onAll(ranks, step(flat, 0)))
		t1 := time.Now()
		mustAll(b, onAll(ranks, step(hier, 1)))
		t2 := time.Now()
		mustAll(b, onAll(ranks, baseStep(flat, bare)))
		t3 := time.Now()
		if i >= 2 { // warm-up
			tf, th, tb = tf+t1.Sub(t0), th+t2.Sub(t1), tb+t3.Sub(t2)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(tb.Microseconds())/n, "base_us/step")
	b.ReportMetric(float64(tf)/float64(tb), "flat/base")
	b.ReportMetric(float64(th)/float64(tb), "hier/base")
	b.ReportMetric(float64(tf.Microseconds())/n, "flat_us/step")
	b.ReportMetric(float64(th.Microseconds())/n, "hier_us/step")
	b.ReportMetric(float64(th)/float64(tf), "hier/flat")
	b.ReportMetric(float64(cross[0][0]), "flat_cross_B/rank")
	b.ReportMetric(float64(cross[0][1]), "hier_cross_B/rank")
}
