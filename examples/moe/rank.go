package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/dispatch"
	"github.com/a2a-moe/a2a/metrics"
	"github.com/a2a-moe/a2a/routing"
)

// runWorker is one rank started by the launcher (or by a2ad run): it reads
// its group from the A2A_* environment.
func runWorker(ctx context.Context, log *slog.Logger, o options, stdout io.Writer) error {
	cfg, err := a2a.ConfigFromEnv()
	if err != nil {
		return err
	}
	return runRank(ctx, log, o, cfg, stdout)
}

// runRank joins the group, serves its metrics, runs the steps and verifies
// them. Only rank 0 writes to stdout.
func runRank(ctx context.Context, log *slog.Logger, o options, cfg a2a.Config, stdout io.Writer) error {
	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg, metrics.Options{Group: cfg.Group, Rank: cfg.Rank})
	if err != nil {
		return err
	}
	cfg.Observer, cfg.Logger = obs, log
	if o.hosts > 1 && cfg.Rank >= 0 && cfg.WorldSize > 0 {
		cfg.Host = fmt.Sprintf("moe-host%d", cfg.Rank*o.hosts/cfg.WorldSize)
	}
	c, err := a2a.Join(ctx, cfg)
	if err != nil {
		return err
	}
	world := c
	var dp *dataParallel
	if o.dp > 1 {
		defer world.Close() // after the groups' communicators
		if c, dp, err = splitDP(ctx, world, o.dp, o.experts); err != nil {
			return err
		}
		defer dp.close()
	}
	m := &membership{c: c, dp: dp}
	defer func() { m.c.Close() }() // the last communicator: a shrink replaces it
	if err := watchComm(world, obs, reg, cfg.Group); err != nil {
		return err
	}
	sctx, stopServer := context.WithCancel(ctx)
	defer stopServer()
	urls, err := serveMetrics(sctx, world, o, reg)
	if err != nil {
		return err
	}

	pl, err := routing.Contiguous(o.experts, c.Size())
	if err != nil {
		return err
	}
	w := newWeights(newModel(o), pl, c.Rank())
	w.die = o.killReplace && c.Rank() == o.killRank
	m.layer = dispatch.Config{
		Experts: o.experts, K: o.k, Hidden: o.hidden, DType: o.dtype, Placement: pl,
		CapacityFactor: o.capacity, Counts: o.counts, Rows: o.rows, Wire: o.wire, MaxTokens: o.maxTokens, Hierarchy: o.hierarchy,
		Observer: obs, Logger: log,
		Rebalance: dispatch.Rebalance{Every: o.rebalance * o.microbatches, Threshold: o.threshold, Redundant: o.redundant, Mover: w},
	}
	if m.d, err = dispatch.New(ctx, c, m.layer); err != nil {
		return err
	}
	defer func() { m.d.Close() }() // the last dispatcher: a shrink replaces it

	out := io.Discard
	if world.Rank() == 0 {
		out = stdout
		printHeader(out, o, c.Size(), m.d.Placement(), urls, c.TransportName(), rowPaths(m.d))
	}
	// Tokens come from the world rank: each expert-parallel group has its own.
	rs, err := newRankState(o, m.d, world.Rank(), w)
	if err != nil {
		return err
	}
	rs.c = c
	if err := m.runSteps(ctx, o, rs, out); err != nil {
		return err
	}
	if o.killRank > 0 {
		fmt.Fprintf(out, "metrics: a2a_shrinks_total %v, a2a_membership_size %v\n", gauge(reg, "a2a_shrinks_total"), gauge(reg, "a2a_membership_size"))
	}
	if o.rebalance > 0 {
		fmt.Fprintf(out, "metrics: a2a_moe_replacements_total %v, a2a_moe_replace_bytes_total %v (rank 0), a2a_moe_rank_imbalance %.2f\n",
			gauge(reg, "a2a_moe_replacements_total"), gauge(reg, "a2a_moe_replace_bytes_total"), gauge(reg, "a2a_moe_rank_imbalance"))
	}
	size := m.c.Size() // after a shrink, the survivors
	if dp != nil {
		size = world.Size()
	}
	fmt.Fprintf(out, "all %d steps verified on %d ranks\n", o.steps, size)
	fmt.Fprint(out, legend)
	if o.hold > 0 {
		fmt.Fprintf(out, "holding for %v (metrics stay up)\n", o.hold)
		sleep(ctx, o.hold) // interrupted is fine: the work is done
	}
	return nil
}

// watchComm adds what c knows to the rank's metrics: the data plane's
// rejected connections, the bytes per peer and the control messages
// rejected.
func watchComm(c *a2a.Comm, obs *metrics.Observer, reg *prometheus.Registry, group string) error {
	obs.WatchTransport(func() uint64 { return c.Stats().Rejected })
	obs.WatchPeerBytes(c.Stats)
	return metrics.RegisterControlRejects(prometheus.WrapRegistererWith(
		prometheus.Labels{"group": group, "rank": strconv.Itoa(c.Rank())}, reg), c.ControlRejects)
}

// serveMetrics serves the rank's /metrics until ctx ends and returns every
// rank's URL, which it learns from the others through c.
func serveMetrics(ctx context.Context, c *a2a.Comm, o options, reg *prometheus.Registry) ([]string, error) {
	port := 0
	if o.metricsPort > 0 {
		port = o.metricsPort + c.Rank()
	}
	addr, err := metrics.Serve(ctx, net.JoinHostPort(o.metricsAddr, strconv.Itoa(port)), reg)
	if err != nil {
		return nil, err
	}
	return gatherStrings(ctx, c, "http://"+addr+"/metrics")
}

// membership is the rank's group as it stands: the communicator, the
// dispatcher and the layer's configuration, all of which a shrink replaces.
type membership struct {
	c     *a2a.Comm
	d     *dispatch.Dispatcher
	layer dispatch.Config
	dp    *dataParallel // --dp: the data-parallel group; nil without
}

// runSteps runs and verifies the steps. When a peer dies under --kill-rank,
// it shrinks the group to the survivors and redoes the step.
func (m *membership) runSteps(ctx context.Context, o options, r *rankState, out io.Writer) error {
	agg := newAggregate(o, m.c.Size())
	var times stepTimes
	fig := newFigures(o, m.d)
	for step := 0; step < o.steps; {
		if step == o.killStep && r.rank == o.killRank && !o.killReplace {
			// As kill -9 from outside would: no leave, no flush, no cleanup.
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		before, load := m.d.Placement(), m.d.Load()
		stepStart := time.Now()
		res, err := r.step(ctx, step)
		if err == nil {
			err = agg.gather(ctx, m.c, res)
		}
		if err != nil {
			if o.killRank < 0 || !errors.Is(err, a2a.ErrPeerLost) {
				return fmt.Errorf("step %d: %w", step, err)
			}
			if err := m.shrink(ctx, o, step, err, time.Since(stepStart), out); err != nil {
				return err
			}
			r.d, r.c, agg = m.d, m.c, newAggregate(o, m.c.Size())
			r.w.load(m.d.Placement(), m.c.Rank())
			continue
		}
		replaced := m.d.Placement() != before
		if replaced {
			r.w.keep(m.d.Placement(), m.c.Rank())
			printReplace(out, step, m.d.LastReplace(), before, m.d.Placement(), load)
		}
		agg.print(out, step)
		times.add(step, agg, replaced)
		fig.add(step, agg)
		if err := verified(agg, res, step); err != nil {
			return err
		}
		if m.dp != nil {
			if err := m.dp.allReduce(ctx, step, res.load, out); err != nil {
				return err
			}
		}
		if o.interval > 0 && step+1 < o.steps {
			if !sleep(ctx, o.interval) {
				return ctx.Err()
			}
		}
		step++
	}
	if o.rebalance > 0 {
		times.print(out)
	}
	if o.preset != "" {
		fig.print(out)
	}
	return nil
}

// shrink carries on without the peer whose loss failed step: it shrinks the
// group to the survivors, settles the placement, re-places the experts on
// them and builds the dispatcher anew.
func (m *membership) shrink(ctx context.Context, o options, step int, lossErr error, failedAfter time.Duration, out io.Writer) error {
	start := time.Now()
	m.d.Close()
	shrunk, err := m.c.Shrink(ctx)
	if err != nil {
		return fmt.Errorf("step %d: shrinking after %v: %w", step, lossErr, err)
	}
	m.c = shrunk
	// A rank lost while voting in a re-placement may have left some
	// survivors switched and others not: agree first on which placement
	// the shrink starts from.
	if err := m.d.Settle(ctx, m.c); err != nil {
		return fmt.Errorf("step %d: settling the placement after %v: %w", step, lossErr, err)
	}
	// How long the slowest survivor's step ran before it failed with
	// ErrPeerLost (the lost rank died as the step began).
	mine, all := make([]byte, 8), make([]byte, 8*m.c.Size())
	binary.LittleEndian.PutUint64(mine, uint64(failedAfter))
	if err := m.c.AllGather(ctx, mine, all); err != nil {
		return err
	}
	var slowest time.Duration
	for i := range m.c.Size() {
		slowest = max(slowest, time.Duration(binary.LittleEndian.Uint64(all[8*i:])))
	}
	fmt.Fprintf(out, "step %d: every survivor failed with ErrPeerLost within %v of the step's start\n", step, slowest.Round(time.Millisecond))
	if m.layer.Hierarchy == dispatch.HierarchyOn {
		m.layer.Hierarchy = dispatch.HierarchyAuto // the survivors' hosts may no longer hold equal numbers of ranks
	}
	pl, err := m.d.Placement().Shrink(m.c.FormerRanks())
	if err != nil {
		return err
	}
	m.layer.Placement = pl
	if n := o.experts + o.redundant; n%m.c.Size() != 0 || n/m.c.Size() > o.experts {
		m.layer.Rebalance.Every = 0 // the redundant slots no longer divide among the survivors
	}
	d, err := dispatch.New(ctx, m.c, m.layer)
	if err != nil {
		// m.d stays the closed dispatcher, which closes again harmlessly.
		return fmt.Errorf("step %d: dispatcher after the shrink: %w", step, err)
	}
	m.d = d
	fmt.Fprintf(out, "step %d: lost a rank; shrunk to %d ranks (former ranks %v) in %v, experts re-placed: %s\n",
		step, m.c.Size(), m.c.FormerRanks(), time.Since(start).Round(time.Millisecond), expertsPerRank(pl))
	return nil
}

// verified fails the step when any rank's outputs differed from its
// reference, naming this rank's first mismatch when it has one.
func verified(agg *aggregate, res *stepResult, step int) error {
	bad := agg.failed()
	if len(bad) == 0 {
		return nil
	}
	if res.mismatches > 0 {
		return fmt.Errorf("step %d: verification failed: %d output elements differ from the reference, first: %s", step, res.mismatches, res.first)
	}
	return fmt.Errorf("step %d: verification failed on ranks %v", step, bad)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// rowPaths says how rows travel in this layer.
func rowPaths(d *dispatch.Dispatcher) string {
	switch {
	case d.Hierarchical():
		return "one crossing per host: a row per (token, remote host) to a relay rank there by AllToAllV, forwarded to its experts through shared memory; one partial row back"
	case !d.SharedMemory():
		return "AllToAllV, reverse AllToAllV to combine"
	case d.UsesAllToAllV():
		return "shared memory between ranks of a host, AllToAllV between the others"
	}
	return "shared memory (packed into the receivers' buffers, outputs read in place)"
}

func printHeader(w io.Writer, o options, size int, pl *routing.Placement, urls []string, transport, rows string) {
	mb := "1 micro-batch"
	if o.microbatches > 1 {
		mb = fmt.Sprintf("%d micro-batches (exchange overlaps expert compute)", o.microbatches)
	}
	if o.maxTokens > 0 {
		mb += fmt.Sprintf(", decode mode (fixed buffers for %d tokens, split send/receive)", o.maxTokens)
	}
	fmt.Fprintf(w, "moe: %d ranks, %d experts (%s), top-%d, %d tokens per rank, hidden %d, ffn %d, %v, capacity %g, skew %g, counts %v, %s\n",
		size, o.experts, expertsPerRank(pl), o.k, o.tokens, o.hidden, o.ffn, o.dtype, o.capacity, o.skew, o.counts, mb)
	if o.dp > 1 {
		fmt.Fprintf(w, "data parallel: %d expert-parallel groups of %d ranks (Comm.Split, sharing one data plane); group 0's steps shown, expert loads AllReduced across the groups\n", o.dp, size)
	}
	if o.wire != dispatch.WireSame {
		rows += fmt.Sprintf(", dispatched as %v", o.wire)
	}
	fmt.Fprintf(w, "data plane %s; rows: %s\n", transport, rows)
	if o.rebalance > 0 {
		fmt.Fprintf(w, "re-placement: every %d steps, when the estimated imbalance exceeds %g, %d redundant slots; the experts' weights move between ranks\n",
			o.rebalance, o.threshold, o.redundant)
	}
	for r, u := range urls {
		fmt.Fprintf(w, "rank %d metrics %s\n", r, u)
	}
	if o.hold > 0 {
		fmt.Fprintf(w, "(the ranks serve /metrics until %v after the last step)\n", o.hold)
	} else {
		fmt.Fprintln(w, "(the ranks serve /metrics only while they run: --hold 1m keeps them up a minute after the last step)")
	}
	fmt.Fprintf(w, "%4s %13s %8s %9s %9s %9s %9s  %-8s  %s\n",
		"step", "kept/routed", "dropped", "imbalance", "dispatch", "combine", "moved", "result", "tokens per expert")
}

// legend explains the step lines' columns, after the run.
const legend = `columns, totals over all ranks:
  kept/routed        token->expert assignments the gate made (routed) and those under capacity (kept)
  dropped            assignments over an expert's capacity (--capacity): they contribute zero
  imbalance          max/mean of the rows each rank's experts processed: 1.00 is even, 2.00
                     means the busiest rank did twice the average (--skew raises it)
  dispatch, combine  the slowest rank's time, waiting for the other ranks included
  moved              bytes that crossed between ranks, both directions
  result             verified: every output element equals the single-process reference
  tokens per expert  rows each expert processed
`

// expertsPerRank says how many experts (replicas included) each rank hosts.
func expertsPerRank(pl *routing.Placement) string {
	lo, hi := pl.Slots(), 0
	spr := pl.SlotsPerRank()
	for r := range pl.Ranks {
		n := 0
		for s := r * spr; s < (r+1)*spr; s++ {
			if pl.SlotExpert(s) != routing.EmptySlot {
				n++
			}
		}
		lo, hi = min(lo, n), max(hi, n)
	}
	per := fmt.Sprintf("%d per rank", lo)
	if lo != hi {
		per = fmt.Sprintf("%d-%d per rank", lo, hi)
	}
	if n := pl.Slots() - pl.Experts; n > 0 && lo == hi {
		per += fmt.Sprintf(", %d replicas", n)
	}
	return per
}

// printReplace reports a re-placement the dispatcher made at step: what
// moved, and the max/mean rank load the estimate gives before and after.
func printReplace(w io.Writer, step int, st dispatch.ReplaceStats, before, after *routing.Placement, load []float64) {
	est := func(pl *routing.Placement) float64 {
		l, err := pl.RankLoad(load)
		if err != nil {
			return math.NaN()
		}
		return routing.Imbalance(l)
	}
	fmt.Fprintf(w, "step %d: experts re-placed (%s): %d slots changed, %d expert copies, %s of weights moved in %v; estimated imbalance %.2f -> %.2f\n",
		step, expertsPerRank(after), st.ChangedSlots, st.Copies, bytesString(st.GroupBytes), st.Duration.Round(100*time.Microsecond), est(before), est(after))
}

// stepResult is what one rank reports about one step.
type stepResult struct {
	ok                bool
	mismatches        int
	first             string // first mismatch, for the error message
	routed, kept      int    // assignments this rank's tokens made / sent
	dropped           int
	received          int // rows this rank's experts processed
	dispatch, combine time.Duration
	moved             int64         // bytes sent to other ranks, dispatch and combine
	sent              int64         // of which dispatch's, in the wire format
	took              time.Duration // dispatch, experts and combine (a re-placement inside Dispatch too)
	cpu               time.Duration // this rank's CPU time during took
	load              []int         // kept rows per global expert
}

// rankState is one rank's reusable step state.
type rankState struct {
	o      options
	m      *model
	d      *dispatch.Dispatcher
	rank   int
	gate   routing.Gate
	cap    routing.Capacity
	tokens []byte // what Dispatch sends
	logits []float32
	decs   []routing.Decision // per micro-batch, as routed
	refDec routing.Decision
	out    []byte // what Combine writes
	hs     []*dispatch.Handle
	act    []float32
	acc    []float32
	part   []float32 // referenceRelay's partial row
	c      *a2a.Comm // the group: hosts of the relay path's reference
	res    stepResult
	w      *weights // the experts this rank hosts

	// Views of the rows, and the reference's own buffers.
	tokensV, outV, ref, row rows
	// --wire fp8: the tokens as the FP8 wire delivers them, and scratch.
	wireV  rows
	q      []uint8
	scales []float32
	wide   []float32
}

func newRankState(o options, d *dispatch.Dispatcher, rank int, w *weights) (*rankState, error) {
	rb := d.RowBytes()
	r := &rankState{
		o: o, m: w.m, d: d, rank: rank, w: w,
		gate:   routing.Gate{Experts: o.experts, K: o.k},
		cap:    routing.Capacity{Factor: o.capacity},
		tokens: make([]byte, o.tokens*rb), logits: make([]float32, o.tokens*o.experts),
		decs: make([]routing.Decision, o.microbatches),
		out:  make([]byte, o.tokens*rb),
		hs:   make([]*dispatch.Handle, o.microbatches),
		act:  make([]float32, o.hidden+o.ffn), acc: make([]float32, o.hidden),
		res: stepResult{load: make([]int, o.experts)},
	}
	var errs [4]error
	r.tokensV, errs[0] = viewRows(o.dtype, r.tokens, o.hidden)
	r.outV, errs[1] = viewRows(o.dtype, r.out, o.hidden)
	r.ref, errs[2] = viewRows(o.dtype, make([]byte, o.tokens*rb), o.hidden)
	r.row, errs[3] = viewRows(o.dtype, make([]byte, rb), o.hidden)
	if o.wire == dispatch.WireFP8 {
		var err error
		r.wireV, err = viewRows(o.dtype, make([]byte, o.tokens*rb), o.hidden)
		errs[3] = errors.Join(errs[3], err)
		r.q, r.scales = make([]uint8, o.hidden), make([]float32, reduce.E4M3Scales(o.hidden))
		r.wide = make([]float32, o.hidden)
	}
	return r, errors.Join(errs[:]...)
}

// span is micro-batch i's token range.
func (r *rankState) span(i int) (lo, hi int) {
	T, M := r.o.tokens, r.o.microbatches
	return i * T / M, (i + 1) * T / M
}

// step runs one step: route, dispatch, experts, combine, verify.
func (r *rankState) step(ctx context.Context, step int) (*stepResult, error) {
	o := r.o
	r.m.tokens(step, r.rank, r.tokensV)
	if err := r.m.logits(step, r.rank, r.logits); err != nil {
		return nil, err
	}
	for i := range r.decs {
		lo, hi := r.span(i)
		if err := r.gate.Route(r.logits[lo*o.experts:hi*o.experts], hi-lo, &r.decs[i]); err != nil {
			return nil, err
		}
	}
	runtime.LockOSThread() // for threadCPU
	start, cpu0 := time.Now(), threadCPU()
	err := r.pipeline(ctx)
	took, cpu := time.Since(start), threadCPU()-cpu0
	runtime.UnlockOSThread()
	if err != nil {
		return nil, err
	}

	res := &r.res
	*res = stepResult{ok: true, load: res.load, took: took, cpu: cpu}
	clear(res.load)
	for i, h := range r.hs {
		st := h.Stats()
		res.routed += r.decs[i].Kept()
		res.kept += st.Kept
		res.dropped += st.Dropped
		res.received += st.Received
		res.dispatch += st.DispatchTime
		res.combine += st.CombineTime
		// Combine sends back the rows dispatch received, in the dtype.
		res.moved += st.SentBytes + st.ReceivedBytes*int64(r.d.RowBytes())/int64(r.d.WireRowBytes())
		res.sent += st.SentBytes
		for e, n := range h.ExpertLoad() {
			res.load[e] += n
		}
		h.Release()
		r.hs[i] = nil
	}
	if r.rank == o.corruptRank && len(r.out) > 0 {
		r.outV.set(0, r.outV.at(0)+1)
	}

	// The reference: the same micro-batches routed and capped
	// independently, every expert computed here, summed in slot order.
	// With the FP8 wire the experts saw the tokens through it: so does the
	// reference, after checking each element's FP8 error bound.
	refIn := r.tokensV
	if o.wire == dispatch.WireFP8 {
		refIn = r.wireV
		if err := r.fp8Tokens(res); err != nil {
			return nil, err
		}
	}
	for i := range r.decs {
		lo, hi := r.span(i)
		dec := &r.refDec
		dec.Tokens, dec.K = r.decs[i].Tokens, r.decs[i].K
		dec.Expert = append(dec.Expert[:0], r.decs[i].Expert...)
		dec.Weight = append(dec.Weight[:0], r.decs[i].Weight...)
		if _, err := r.cap.Apply(dec, o.experts, nil); err != nil {
			return nil, err
		}
		if r.d.Hierarchical() {
			pl, c := r.d.Placement(), r.c
			r.part = slices.Grow(r.part[:0], o.hidden)[:o.hidden]
			r.m.referenceRelay(refIn.slice(lo, hi), dec, r.ref.slice(lo, hi), r.act, r.acc, r.part, r.row,
				func(e int) int { return c.Host(pl.Owner[e]) }, c.Host(c.Rank()))
			continue
		}
		r.m.reference(refIn.slice(lo, hi), dec, r.ref.slice(lo, hi), r.act, r.acc, r.row)
	}
	for i := range r.outV.len() {
		got, want := r.outV.at(i), r.ref.at(i)
		if !matches(o.dtype, got, want) {
			if res.mismatches == 0 {
				res.first = fmt.Sprintf("token %d element %d: got %v, want %v", i/o.hidden, i%o.hidden, got, want)
			}
			res.mismatches++
		}
	}
	res.ok = res.mismatches == 0
	return res, nil
}

// fp8Tokens fills r.wireV with the tokens as the FP8 wire delivers them to
// the experts (reduce's E4M3 round trip, rounded to the dtype) and counts
// as mismatches in res the elements beyond the wire's error bound, |x|/16
// plus half the smallest subnormal step of the element's block
// (scale*2^-10), against the token in float64.
func (r *rankState) fp8Tokens(res *stepResult) error {
	H := r.o.hidden
	for t := range r.o.tokens {
		for j := range H {
			r.wide[j] = r.tokensV.at(t*H + j)
		}
		if err := reduce.QuantizeE4M3(r.q, r.scales, r.wide); err != nil {
			return fmt.Errorf("token %d: %w", t, err)
		}
		for j, b := range r.q {
			orig := float64(r.tokensV.at(t*H + j))
			r.wireV.set(t*H+j, reduce.E4M3ToF32(b)*r.scales[j/reduce.E4M3Block])
			got := float64(r.wireV.at(t*H + j))
			bound := math.Abs(orig)/16 + float64(r.scales[j/reduce.E4M3Block])*0x1p-10
			if math.Abs(got-orig) > bound {
				if res.mismatches == 0 {
					res.first = fmt.Sprintf("token %d element %d: FP8 wire gives %v for %v, beyond %v", t, j, got, orig, bound)
				}
				res.mismatches++
			}
		}
	}
	return nil
}

// matches reports whether got matches the reference want. The reference does
// the same float32 operations in the same order (expert outputs, products
// rounded to float32, slot-order sum, one rounding to the dtype), so on
// amd64 the two agree bit for bit; the tolerance, float32 rounding (relative
// 1e-5) or one bfloat16 unit in the last place, covers compilers that fuse
// multiply-adds where the two paths do not.
func matches(dt reduce.DType, got, want float32) bool {
	if got == want || (got != got && want != want) {
		return true
	}
	tol := 1e-5 * max(1, math.Abs(float64(want)))
	if dt == reduce.BFloat16 {
		tol = max(math.Abs(float64(want)), 1e-3) / 128
	}
	return math.Abs(float64(got-want)) <= tol
}

// pipeline dispatches, computes and combines the step's micro-batches. With
// one micro-batch it is the plain synchronous step. With more, micro-batch
// i+1 is dispatched asynchronously before the experts compute micro-batch i,
// and micro-batch i's combine runs asynchronously while the experts compute
// i+1: the exchanges overlap the compute. Every rank submits the same
// sequence (D0 D1 C0 D2 C1 ... ), which is what keeps the collectives
// matched.
func (r *rankState) pipeline(ctx context.Context) error {
	if r.d.DecodeMode() {
		return r.pipelineDecode(ctx)
	}
	rb := r.d.RowBytes()
	M := len(r.hs)
	lo, hi := r.span(0)
	var err error
	if r.hs[0], err = r.d.Dispatch(ctx, r.tokens[lo*rb:hi*rb], &r.decs[0]); err != nil {
		return err
	}
	for i := range M {
		if i+1 < M {
			lo, hi := r.span(i + 1)
			if r.hs[i+1], err = r.d.DispatchAsync(ctx, r.tokens[lo*rb:hi*rb], &r.decs[i+1]); err != nil {
				return err
			}
		}
		if err := r.experts(r.hs[i]); err != nil {
			return err
		}
		if i+1 < M {
			if err := r.hs[i+1].Wait(); err != nil {
				return err
			}
		}
		lo, hi := r.span(i)
		if err := r.d.CombineAsync(ctx, r.hs[i], r.hs[i].Output(), r.out[lo*rb:hi*rb]); err != nil {
			return err
		}
	}
	for _, h := range r.hs {
		if err := h.Wait(); err != nil {
			return err
		}
	}
	return nil
}

// pipelineDecode is pipeline in the decode mode, all on this goroutine:
// every micro-batch's rows are sent before any is awaited, and each one's
// combine is sent as soon as its experts are done, so the exchanges of one
// overlap the compute of the other with no goroutine of the dispatcher's.
// Every rank makes the same calls in the same order (D0 D1 C0 C1).
func (r *rankState) pipelineDecode(ctx context.Context) error {
	rb := r.d.RowBytes()
	var err error
	for i := range r.hs {
		lo, hi := r.span(i)
		if r.hs[i], err = r.d.DispatchSend(ctx, r.tokens[lo*rb:hi*rb], &r.decs[i]); err != nil {
			return err
		}
	}
	for i, h := range r.hs {
		if err := h.Wait(); err != nil {
			return err
		}
		if err := r.experts(h); err != nil {
			return err
		}
		lo, hi := r.span(i)
		if err := r.d.CombineSend(ctx, h, h.Output(), r.out[lo*rb:hi*rb]); err != nil {
			return err
		}
	}
	for _, h := range r.hs {
		if err := h.Wait(); err != nil {
			return err
		}
	}
	return nil
}

// experts runs every local expert on its received rows, reading them and
// writing the outputs in place through typed views.
func (r *rankState) experts(h *dispatch.Handle) error {
	rb := r.d.RowBytes()
	in, out := h.Recv(), h.Output()
	for l := range h.LocalExperts() {
		e, err := r.w.get(h.Expert(l))
		if err != nil {
			return err
		}
		for _, seg := range h.Segments(l) {
			end := seg.Offset + seg.Rows*rb
			x, err := viewRows(r.o.dtype, in[seg.Offset:end], r.o.hidden)
			if err != nil {
				return err
			}
			y, err := viewRows(r.o.dtype, out[seg.Offset:end], r.o.hidden)
			if err != nil {
				return err
			}
			r.m.apply(e, x, y, r.act)
		}
	}
	return nil
}

// gatherStrings gives every rank the string s of every rank (each at most
// 255 bytes), with one AllToAll of fixed-size blocks.
func gatherStrings(ctx context.Context, c *a2a.Comm, s string) ([]string, error) {
	const block = 256
	if len(s) >= block {
		return nil, fmt.Errorf("%q longer than %d bytes", s, block-1)
	}
	n := c.Size()
	send, recv := make([]byte, n*block), make([]byte, n*block)
	for j := range n {
		send[j*block] = byte(len(s))
		copy(send[j*block+1:], s)
	}
	if err := c.AllToAll(ctx, send, recv); err != nil {
		return nil, err
	}
	out := make([]string, n)
	for i := range n {
		b := recv[i*block:]
		out[i] = string(b[1 : 1+int(b[0])])
	}
	return out, nil
}

// gauge reads the value of the metric family name from reg (summed over
// its series), as a scrape of /metrics would show it.
func gauge(reg *prometheus.Registry, name string) float64 {
	families, err := reg.Gather()
	if err != nil {
		return math.NaN()
	}
	var v float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return v
}
