package dispatch

import (
	"context"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

// BenchmarkDecode is issue 19's decode target: 8 in-process ranks on one
// host, 128 tokens per rank of 7168 bfloat16 elements, 64 experts, top-8;
// and smaller steps of the same group (16 tokens of 1024 elements, 1 token
// of 7168), where the exchanges' latency rather than the copies and sums
// weighs most. Each
// iteration runs one group step of each kind on the same Comms, in turn (so
// load changes hit all three alike): a dispatch + combine of the normal
// mode, one of the decode mode (MaxTokens = the step's tokens) and the bare
// AllToAllV pair that moves the same bytes (baseStep). It reports each
// one's p50 group step time, the ratios of the normal mode's and the
// AllToAllV's to the decode mode's, and the decode mode's allocations per
// rank and step (measured over a run of warm steps;
// TestSteadyStateAllocations asserts none on a small shape). The experts
// are the identity, computed in place.
func BenchmarkDecode(b *testing.B) {
	for _, s := range []benchShape{
		{8, 64, 8, 128, 7168, reduce.BFloat16, 1},
		{8, 64, 8, 16, 1024, reduce.BFloat16, 1},
		{8, 64, 8, 1, 7168, reduce.BFloat16, 1},
	} {
		b.Run(s.String(), func(b *testing.B) { benchDecode(b, s) })
	}
}

func benchDecode(b *testing.B, s benchShape) {
	ranks, experts, k, tokens, hidden, dt := s.ranks, s.experts, s.k, s.tokens, s.hidden, s.dt
	url := startNATS(b)
	comms := group(b, url, ranks, func(c *a2a.Config) { c.HeartbeatInterval, c.PeerTimeout, c.Report = 10*time.Second, 30*time.Second, -1 })
	cfg := Config{Experts: experts, K: k, Hidden: hidden, DType: dt, Logger: discard}
	normal := newDispatchers(b, comms, cfg)
	cfg.MaxTokens = tokens
	decode := newDispatchers(b, comms, cfg)
	in := make([]*benchRank, ranks)
	rb := hidden * dt.Size()
	gate := routing.Gate{Experts: experts, K: k}
	mustAll(b, onAll(ranks, func(r int) error {
		br := &benchRank{tokens: make([]byte, tokens*rb), out: make([]byte, tokens*rb), logits: make([]float32, tokens*experts)}
		rng := rand.New(rand.NewPCG(42, uint64(r)))
		for i := range tokens * hidden {
			putElem(dt, br.tokens, i, float32(rng.NormFloat64()))
		}
		if err := routing.SkewedLogits(rng, tokens, experts, 0, br.logits); err != nil {
			return err
		}
		if err := gate.Route(br.logits, tokens, &br.dec); err != nil {
			return err
		}
		h, err := normal[r].Dispatch(context.Background(), br.tokens, &br.dec)
		if err != nil {
			return err
		}
		br.sendCounts = append([]int(nil), h.sendCounts...)
		br.recvCounts = append([]int(nil), h.recvCounts...)
		br.fwdSend = append([]int(nil), h.sendCounts...)
		br.fwdRecv = append([]int(nil), h.recvCounts...)
		br.fwdSend[r], br.fwdRecv[r] = h.selfBytes, h.selfBytes
		sent := 0
		for _, n := range h.sendCounts {
			sent += n
		}
		br.send, br.recv = make([]byte, sent+h.selfBytes), make([]byte, len(h.recv))
		h.Release()
		in[r] = br
		return nil
	}))
	steps := [3]func(r int) error{moeStep(normal, in, gate), moeStep(decode, in, gate), baseStep(normal, in)}
	for _, st := range steps {
		for range 3 { // warm-up: buffers, mappings, pages
			mustAll(b, onAll(ranks, st))
		}
	}
	var times [3][]time.Duration
	b.ResetTimer()
	for range b.N {
		for i, st := range steps {
			t0 := time.Now()
			mustAll(b, onAll(ranks, st))
			times[i] = append(times[i], time.Since(t0))
		}
	}
	b.StopTimer()
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds())
	}
	pn, pd, pa := p50(times[0]), p50(times[1]), p50(times[2])
	b.ReportMetric(pn, "normal_p50_us")
	b.ReportMetric(pd, "decode_p50_us")
	b.ReportMetric(pa, "alltoallv_p50_us")
	b.ReportMetric(pn/pd, "normal/decode")
	b.ReportMetric(pa/pd, "alltoallv/decode")
	b.ReportMetric(decodeAllocs(b, ranks, steps[1]), "decode_allocs/step")
}

// decodeAllocs counts the allocations of warm steps, per rank and step: one
// run of many steps per rank, so that the run's own goroutines do not count,
// less what the process allocates without steps in as long a time (the
// control plane's timers and messages: steps of this size take long).
func decodeAllocs(b *testing.B, ranks int, step func(r int) error) float64 {
	const iters = 20
	var before, after, idle runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	t0 := time.Now()
	mustAll(b, onAll(ranks, func(r int) error {
		for range iters {
			if err := step(r); err != nil {
				return err
			}
		}
		return nil
	}))
	runtime.ReadMemStats(&after)
	time.Sleep(time.Since(t0))
	runtime.ReadMemStats(&idle)
	steps := float64(after.Mallocs-before.Mallocs) - float64(idle.Mallocs-after.Mallocs) - 64
	return max(steps, 0) / float64(ranks*iters)
}
