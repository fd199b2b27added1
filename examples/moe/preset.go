package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/a2a-moe/a2a/dispatch"
)

// preset is the MoE layer of a published model: what --preset sets.
type preset struct {
	experts, k, hidden int
}

// presetNames are the models --preset knows, for its help and errors.
const presetNames = "deepseek-v3, qwen3-30b-a3b or mixtral-8x7b"

// lookupPreset returns the layer of model name, from the model's published
// configuration (n_routed_experts or num_experts, num_experts_per_tok,
// hidden_size). DeepSeek-V3's shared expert and its group-limited routing
// are left out: the shared expert moves no rows, and the demo's gate picks
// the top k of all experts.
func lookupPreset(name string) (preset, bool) {
	switch name {
	case "deepseek-v3":
		return preset{experts: 256, k: 8, hidden: 7168}, true
	case "qwen3-30b-a3b":
		return preset{experts: 128, k: 8, hidden: 2048}, true
	case "mixtral-8x7b":
		return preset{experts: 8, k: 2, hidden: 4096}, true
	}
	return preset{}, false
}

// presetFFN is the inner size of the experts under a preset. The models'
// (2048, 768, 14336) would make this machine's CPU, which computes every
// expert twice (the layer and the reference), the whole step: the experts
// stand in for a device's work, and the rows that move are the model's.
const presetFFN = 4

// applyPreset sets, from --preset, each flag of the layer that the command
// line left unset: experts, k and hidden from the model, and what the three
// models share: bfloat16 rows, no capacity limit (they drop no tokens) and
// --ffn presetFFN.
func (o *options) applyPreset(fs *flag.FlagSet, text *textFlags) error {
	if o.preset == "" {
		return nil
	}
	p, ok := lookupPreset(o.preset)
	if !ok {
		return fmt.Errorf("--preset %q: %s", o.preset, presetNames)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	set := func(name string, apply func()) {
		if !given[name] {
			apply()
		}
	}
	set("experts", func() { o.experts = p.experts })
	set("k", func() { o.k = p.k })
	set("hidden", func() { o.hidden = p.hidden })
	set("ffn", func() { o.ffn = presetFFN })
	set("capacity", func() { o.capacity = 0 })
	set("dtype", func() { text.dtype = "bfloat16" })
	return nil
}

// figures collects, under --preset, what DeepEP's tests print: each rank's
// dispatch and combine time and its "logical" bandwidth, the bytes of every
// token->expert row the rank's tokens made (rows to its own rank and host
// included, so the figure does not depend on where the experts are) over
// that time. Step 0 warms up (connections, buffers) and is left out when
// there are more.
type figures struct {
	o                    options
	ranks                int
	rowBytes, wireRow    int
	from                 int           // first step counted
	steps                int           // steps counted
	dispBytes, combBytes float64       // logical bytes, all ranks and steps
	dispTime, combTime   time.Duration // all ranks and steps
	samples              int           // rank-steps
	sent                 int64         // dispatch bytes between ranks, all steps
	took                 []time.Duration
}

func newFigures(o options, d *dispatch.Dispatcher) *figures {
	f := &figures{o: o, rowBytes: d.RowBytes(), wireRow: d.WireRowBytes()}
	if o.steps > 1 {
		f.from = 1
	}
	return f
}

// add records step's results of every rank.
func (f *figures) add(step int, a *aggregate) {
	if step < f.from {
		return
	}
	f.steps++
	f.ranks = a.size
	for _, s := range a.all {
		f.dispBytes += float64(s.kept * f.wireRow)
		f.combBytes += float64(s.kept * f.rowBytes)
		f.dispTime += s.dispatch
		f.combTime += s.combine
		f.sent += s.sent
		f.samples++
	}
	f.took = append(f.took, a.slowest())
}

// print writes the figures, once a step is counted.
func (f *figures) print(w io.Writer) {
	if f.steps == 0 {
		return
	}
	o := f.o
	wire := o.dtype.String()
	if o.wire == dispatch.WireFP8 {
		wire = "FP8 E4M3 + scales"
	}
	steps := fmt.Sprintf("step %d", f.from)
	if f.steps > 1 {
		steps = fmt.Sprintf("steps %d-%d", f.from, f.from+f.steps-1)
	}
	warm := ""
	if f.from > 0 {
		warm = " (step 0 warms up)"
	}
	n := time.Duration(f.samples)
	fmt.Fprintf(w, "%s: %d experts, top-%d, hidden %d, %d ranks x %d tokens; %s%s, per rank as DeepEP reports (logical: every token->expert row, to its own rank and host too):\n",
		o.preset, o.experts, o.k, o.hidden, f.ranks, o.tokens, steps, warm)
	fmt.Fprintf(w, "  dispatch  avg %9s  logical %7s GB/s  (%s rows, %d B each)\n",
		round(f.dispTime/n), gbps(f.dispBytes, f.dispTime), wire, f.wireRow)
	fmt.Fprintf(w, "  combine   avg %9s  logical %7s GB/s  (%v rows, %d B each)\n",
		round(f.combTime/n), gbps(f.combBytes, f.combTime), o.dtype, f.rowBytes)
	fmt.Fprintf(w, "  step      median %s (slowest rank: dispatch, experts, combine); dispatched between ranks %s per step\n",
		round(median(f.took)), bytesString(f.sent/int64(f.steps)))
}

// gbps formats bytes over d in GB/s (10^9 bytes, as DeepEP counts): two
// decimals, or three significant digits below 1 GB/s, so that a small run
// on a crowded machine does not print 0.00.
func gbps(bytes float64, d time.Duration) string {
	if d <= 0 || bytes <= 0 {
		return "0"
	}
	g := bytes / d.Seconds() / 1e9
	return fmt.Sprintf("%.*f", max(2, 2-int(math.Floor(math.Log10(g)))), g)
}
