package dispatch

import (
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

// benchRank is one rank's inputs for the benchmarks.
type benchRank struct {
	tokens, out []byte
	logits      []float32
	dec         routing.Decision
	// The byte counts a dispatch of dec sends to and receives from the
	// other ranks (0 for this rank itself).
	sendCounts, recvCounts []int
	// The baseline's counts: forward, the dispatch's plus this rank's own
	// rows, which Dispatch copies into Recv as the engine copies a local
	// block; reverse, the combine's (the experts' outputs for this rank's
	// own rows are read where they are, not moved).
	fwdSend, fwdRecv []int
	send, recv       []byte
}

// benchLayer sets up ranks in-process ranks with one dispatcher each, and
// every rank's tokens and routing (uniform gate over the experts, no
// capacity limit so that both benchmarks move exactly the same bytes).
func benchLayer(b *testing.B, s benchShape, counts CountsMode, path RowPath) ([]*Dispatcher, []*benchRank) {
	ranks, experts, k, tokens, hidden, dt := s.ranks, s.experts, s.k, s.tokens, s.hidden, s.dt
	url := startNATS(b)
	comms := group(b, url, ranks, func(c *a2a.Config) {
		if s.hosts > 1 { // fake hosts: ranks split evenly, TCP between them
			c.Host = fmt.Sprintf("host%d", c.Rank*s.hosts/ranks)
		}
	})
	// The flat path, whose bytes the baseline moves (hier_bench_test.go
	// compares the relay path with it).
	ds := newDispatchers(b, comms, Config{Experts: experts, K: k, Hidden: hidden, DType: dt, Counts: counts, Rows: path,
		Hierarchy: HierarchyOff, Logger: discard})
	in := make([]*benchRank, ranks)
	rb := hidden * dt.Size()
	gate := routing.Gate{Experts: experts, K: k}
	mustAll(b, onAll(ranks, func(r int) error {
		br := &benchRank{tokens: make([]byte, tokens*rb), out: make([]byte, tokens*rb), logits: make([]float32, tokens*experts)}
		rng := rand.New(rand.NewPCG(42, uint64(r)))
		// Normal activations: random bit patterns would be full of
		// subnormals, whose arithmetic takes a slow microcode path.
		for i := range tokens * hidden {
			putElem(dt, br.tokens, i, float32(rng.NormFloat64()))
		}
		if err := routing.SkewedLogits(rng, tokens, experts, 0, br.logits); err != nil {
			return err
		}
		if err := gate.Route(br.logits, tokens, &br.dec); err != nil {
			return err
		}
		h, err := ds[r].Dispatch(context.Background(), br.tokens, &br.dec)
		if err != nil {
			return err
		}
		br.bareOf(h, r)
		if err := ds[r].Combine(context.Background(), h, h.Recv(), br.out); err != nil {
			return err
		}
		h.Release()
		in[r] = br
		return nil
	}))
	return ds, in
}

// bareOf sets br's baseline counts and buffers (baseStep) to the bytes that
// rank r's dispatch h moved.
func (br *benchRank) bareOf(h *Handle, r int) {
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
}

// benchShapes are the benchmark points: the target (4 ranks, 4096 tokens of
// 1024 bf16 elements, 16 experts, top-2) and a small, latency-bound step on
// 4 ranks (more than this machine's cores: ranks park while waiting) and on
// 2 (ranks busy-poll).
var benchShapes = []benchShape{
	{4, 16, 2, 4096, 1024, reduce.BFloat16, 1},
	{4, 16, 2, 4096, 1024, reduce.BFloat16, 2},
	{4, 16, 2, 256, 256, reduce.BFloat16, 1},
	{2, 16, 2, 256, 256, reduce.BFloat16, 1},
}

// benchShape is a layer and a group: hosts > 1 fakes that many hosts (equal
// shares of the ranks), so rows between them travel by TCP.
type benchShape struct {
	ranks, experts, k, tokens, hidden int
	dt                                reduce.DType
	hosts                             int
}

func (s benchShape) String() string {
	name := fmt.Sprintf("P%d/E%d/k%d/T%d/H%d/%v", s.ranks, s.experts, s.k, s.tokens, s.hidden, s.dt)
	if s.hosts > 1 {
		name += fmt.Sprintf("/hosts%d", s.hosts)
	}
	return name
}

// moeStep is one rank's MoE step of the benchmarks: gate (top-k of the
// logits), capacity and plan, packing, counts exchange, AllToAllV, reverse
// AllToAllV and the weighted sum; the experts are the identity, computed in
// place.
func moeStep(ds []*Dispatcher, in []*benchRank, gate routing.Gate) func(r int) error {
	ctx := context.Background()
	return func(r int) error {
		br, d := in[r], ds[r]
		if err := gate.Route(br.logits, len(br.logits)/gate.Experts, &br.dec); err != nil {
			return err
		}
		h, err := d.Dispatch(ctx, br.tokens, &br.dec)
		if err != nil {
			return err
		}
		if err := d.Combine(ctx, h, h.Recv(), br.out); err != nil {
			return err
		}
		h.Release()
		return nil
	}
}

// baseStep is one rank's baseline step: the forward and reverse AllToAllV of
// exactly the bytes the MoE step moves, with counts known in advance, nothing
// else. Forward, that includes this rank's own rows (the engine copies the
// local block as Dispatch copies them into Recv); reverse, it does not
// (Combine reads the outputs for them in place).
func baseStep(ds []*Dispatcher, in []*benchRank) func(r int) error {
	ctx := context.Background()
	return func(r int) error {
		br, c := in[r], ds[r].comm
		if err := c.AllToAllV(ctx, br.send, br.fwdSend, br.recv, br.fwdRecv); err != nil {
			return err
		}
		return c.AllToAllV(ctx, br.recv[:len(br.recv)-br.fwdRecv[r]], br.recvCounts, br.send[:len(br.send)-br.fwdSend[r]], br.sendCounts)
	}
}

// BenchmarkDispatchCombine measures whole MoE steps (moeStep) on every rank
// at once. Compare with BenchmarkTwoAllToAllV, which moves the same bytes.
func BenchmarkDispatchCombine(b *testing.B) {
	for _, s := range benchShapes {
		for _, counts := range []CountsMode{CountsInBand, CountsNATS} {
			b.Run(s.String()+"/"+counts.String(), func(b *testing.B) {
				ds, in := benchLayer(b, s, counts, RowsAuto)
				runBench(b, s.ranks, in, moeStep(ds, in, routing.Gate{Experts: s.experts, K: s.k}))
			})
		}
	}
}

// BenchmarkTwoAllToAllV is the baseline of BenchmarkDispatchCombine (baseStep).
func BenchmarkTwoAllToAllV(b *testing.B) {
	for _, s := range benchShapes {
		b.Run(s.String(), func(b *testing.B) {
			ds, in := benchLayer(b, s, CountsInBand, RowsAuto)
			runBench(b, s.ranks, in, baseStep(ds, in))
		})
	}
}

// BenchmarkOverhead alternates one MoE step and one baseline step on the
// same group, for each counts mode and row path (auto: shared memory between
// ranks of one host; alltoallv: AllToAllV for every pair), and reports both
// step times, the CPU time this process spent
// on each (all ranks, user and system: the kernel's copies of loopback TCP
// are most of it), and the relative overheads. On a shared machine the
// alternation keeps load changes from landing on one side only, which
// separate benchmarks cannot, and the CPU times do not count other
// processes at all.
func BenchmarkOverhead(b *testing.B) {
	for _, s := range benchShapes {
		for _, counts := range []CountsMode{CountsInBand, CountsNATS} {
			for _, path := range []RowPath{RowsAuto, RowsAllToAllV} {
				b.Run(s.String()+"/"+counts.String()+"/"+path.String(), func(b *testing.B) {
					ds, in := benchLayer(b, s, counts, path)
					moe, base := moeStep(ds, in, routing.Gate{Experts: s.experts, K: s.k}), baseStep(ds, in)
					var tm, tb, cm, cb time.Duration
					for i := range b.N + 3 {
						c0, t0 := cpuTime(b), time.Now()
						mustAll(b, onAll(s.ranks, moe))
						c1, t1 := cpuTime(b), time.Now()
						mustAll(b, onAll(s.ranks, base))
						c2, t2 := cpuTime(b), time.Now()
						if i >= 3 { // warm-up
							tm, tb = tm+t1.Sub(t0), tb+t2.Sub(t1)
							cm, cb = cm+c1-c0, cb+c2-c1
						}
					}
					n := float64(b.N)
					b.ReportMetric(float64(tm.Microseconds())/n, "moe_us/step")
					b.ReportMetric(float64(tb.Microseconds())/n, "base_us/step")
					b.ReportMetric(100*(float64(tm)/float64(tb)-1), "overhead_%")
					b.ReportMetric(float64(cm.Microseconds())/n, "moe_cpu_us/step")
					b.ReportMetric(float64(cb.Microseconds())/n, "base_cpu_us/step")
					b.ReportMetric(100*(float64(cm)/float64(cb)-1), "cpu_overhead_%")
				})
			}
		}
	}
}

// runBench times b.N steps run by every rank concurrently (the step time of
// the group), after a short warm-up.
func runBench(b *testing.B, ranks int, in []*benchRank, step func(r int) error) {
	loop := func(n int) {
		mustAll(b, onAll(ranks, func(r int) error {
			for range n {
				if err := step(r); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	loop(3)
	sent := 0
	for _, n := range in[0].sendCounts {
		sent += n
	}
	b.SetBytes(int64(2 * sent)) // rank 0's payload, both directions
	b.ReportAllocs()
	b.ResetTimer()
	loop(b.N)
	b.StopTimer()
}

// BenchmarkLocalCost measures the dispatcher's own CPU work for the target
// shape (4096 tokens of 1024 bf16 elements, 16 experts, top-2) on a single
// rank, where every row stays local and no byte crosses a socket: gate,
// dispatch (decision copy, capacity, plan, the rows copied once into expert
// order) and combine (the weighted sum), each reported per step.
func BenchmarkLocalCost(b *testing.B) {
	const experts, k, tokens, hidden = 16, 2, 4096, 1024
	ds, in := benchLayer(b, benchShape{1, experts, k, tokens, hidden, reduce.BFloat16, 1}, CountsInBand, RowsAuto)
	gate := routing.Gate{Experts: experts, K: k}
	ctx := context.Background()
	br, d := in[0], ds[0]
	var tg, td, tc time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if err := gate.Route(br.logits, tokens, &br.dec); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		h, err := d.Dispatch(ctx, br.tokens, &br.dec)
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if err := d.Combine(ctx, h, h.Recv(), br.out); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		h.Release()
		tg, td, tc = tg+t1.Sub(t0), td+t2.Sub(t1), tc+t3.Sub(t2)
	}
	n := float64(b.N)
	b.ReportMetric(float64(tg.Microseconds())/n, "gate_us/step")
	b.ReportMetric(float64(td.Microseconds())/n, "dispatch_us/step")
	b.ReportMetric(float64(tc.Microseconds())/n, "combine_us/step")
}

// BenchmarkAxpby measures the top-2 combine kernel alone on one 4096-token
// step of 1024-element rows: 16 MiB of expert outputs in, 8 MiB out
// (bfloat16), with ordinary and with streaming stores. SetBytes counts both,
// so MB/s compares with memory bandwidth.
func BenchmarkAxpby(b *testing.B) {
	const tokens, hidden = 4096, 1024
	for _, dt := range []reduce.DType{reduce.BFloat16, reduce.Float32} {
		for _, stream := range []bool{false, true} {
			name := dt.String()
			if stream {
				name += "/stream"
			}
			b.Run(name, func(b *testing.B) {
				rb := hidden * dt.Size()
				in, out := make([]byte, 2*tokens*rb), make([]byte, tokens*rb)
				// Real values in real memory: not the kernel's shared zero page,
				// not subnormals (slow microcode path).
				rng := rand.New(rand.NewPCG(1, 2))
				for i := range len(in) / dt.Size() {
					putElem(dt, in, i, float32(rng.NormFloat64()))
				}
				clear(out)
				b.SetBytes(int64(len(in) + len(out)))
				for range b.N {
					for t := range tokens {
						axpbyRow(dt, out[t*rb:(t+1)*rb], in[2*t*rb:(2*t+1)*rb], in[(2*t+1)*rb:(2*t+2)*rb], 0.25, 0.75, stream)
					}
					storeFence()
				}
			})
		}
	}
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
