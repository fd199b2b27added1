package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

// fakeHosts returns a Comm modifier that puts rank r on host hostOf(r).
func fakeHosts(hostOf func(r int) int) func(*a2a.Config) {
	return func(c *a2a.Config) { c.Host = fmt.Sprintf("host%d", hostOf(c.Rank)) }
}

// TestHierarchy runs verified steps on the relay path on fake hosts (4
// hosts of 2 ranks; 2 hosts of 2 interleaved ranks, whose relays' blocks
// come in another order than their hosts'; 3 hosts of one rank, each its
// own relay): every received row in
// its segment by source rank, and every combined element within the bound
// of summing per-host partial rows rounded to DType. Synchronous and
// pipelined steps, capacity drops, caller drops, top-3 and top-4 (the
// general sum), float16, the FP8 wire, and the forward inside a host by
// AllToAllV (RowsAllToAllV) instead of shared memory.
func TestHierarchy(t *testing.T) {
	groups := []struct {
		name   string
		ranks  int
		hostOf func(int) int
	}{
		{"hosts4x2", 8, func(r int) int { return r / 2 }},
		{"hosts2x2/interleaved", 4, func(r int) int { return r % 2 }},
		{"hosts3x1", 3, func(r int) int { return r }},
	}
	layers := []struct {
		name string
		l    layer
		wire WireFormat
		keep bool
		rows RowPath
	}{
		{name: "bf16/capacity/skew", l: layer{experts: 16, k: 4, hidden: 40, tokens: 30, dtype: reduce.BFloat16, capacity: 1.1, skew: 1.2}},
		{name: "f32/k3/drops", l: layer{experts: 12, k: 3, hidden: 24, tokens: 25, dtype: reduce.Float32, preDrop: true}},
		{name: "f16/k2", l: layer{experts: 8, k: 2, hidden: 16, tokens: 20, dtype: reduce.Float16, skew: 0.5}},
		{name: "f32/no-tokens", l: layer{experts: 8, k: 2, hidden: 8, tokens: 0, dtype: reduce.Float32}},
		// The forward by AllToAllV inside the host, and its reverse.
		{name: "bf16/k3/forward-by-alltoallv", l: layer{experts: 12, k: 3, hidden: 20, tokens: 22, dtype: reduce.BFloat16, capacity: 1.2}, rows: RowsAllToAllV},
		{name: "fp8/bf16", l: layer{experts: 16, k: 4, hidden: 260, tokens: 20, dtype: reduce.BFloat16, capacity: 1.25, skew: 1, values: fp8Value}, wire: WireFP8},
		{name: "fp8/f32/keep", l: layer{experts: 8, k: 3, hidden: 200, tokens: 16, dtype: reduce.Float32, values: fp8Value}, wire: WireFP8, keep: true},
	}
	url := startNATS(t)
	for gi, g := range groups {
		comms := group(t, url, g.ranks, fakeHosts(g.hostOf))
		for li, lc := range layers {
			t.Run(g.name+"/"+lc.name, func(t *testing.T) {
				l := lc.l
				l.seed = uint64(900 + 10*gi + li)
				c := dispatchCase{ranks: g.ranks, l: l}
				pl := c.placement(t)
				ds := newDispatchers(t, comms, Config{Experts: l.experts, K: l.k, Hidden: l.hidden, DType: l.dtype,
					CapacityFactor: l.capacity, Wire: lc.wire, KeepFP8: lc.keep, Rows: lc.rows, Hierarchy: HierarchyOn, Logger: discard})
				for r, d := range ds {
					if !d.Hierarchical() {
						t.Fatalf("rank %d: Hierarchical() = false with HierarchyOn", r)
					}
				}
				reportAll(t, onAll(g.ranks, func(r int) error {
					for step := range 4 {
						if err := runHierStep(ds[r], c, pl, r, step, lc.wire, lc.keep, g.hostOf); err != nil {
							return fmt.Errorf("step %d: %w", step, err)
						}
					}
					return hierPipeline(ds[r], c, pl, r, lc.wire, lc.keep, g.hostOf)
				}))
			})
		}
	}
}

// runHierStep is one verified step of rank r on the relay path, asynchronous
// on odd steps, with the outputs in Output, then Recv (not with KeepFP8).
func runHierStep(d *Dispatcher, c dispatchCase, pl *routing.Placement, r, step int, wire WireFormat, keep bool, hostOf func(int) int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := c.l
	tokens := l.tokenRows(r, step)
	dispatch := d.Dispatch
	if step%2 == 1 {
		dispatch = d.DispatchAsync
	}
	h, err := dispatch(ctx, tokens, l.decision(r, step))
	if err != nil {
		return err
	}
	defer h.Release()
	if err := h.Wait(); err != nil {
		return err
	}
	out, err := hierCompute(h, c, pl, r, step, wire, keep, step%4 >= 2)
	if err != nil {
		return err
	}
	if step%2 == 1 {
		if err := d.CombineAsync(ctx, h, out, tokens); err != nil {
			return err
		}
		err = h.Wait()
	} else {
		err = d.Combine(ctx, h, out, tokens)
	}
	if err != nil {
		return err
	}
	return checkHierCombined(l, r, step, tokens, wire, pl, hostOf)
}

// hierCompute checks the received rows and runs the experts on them,
// into Output, or Recv itself with inRecv.
func hierCompute(h *Handle, c dispatchCase, pl *routing.Placement, r, step int, wire WireFormat, keep, inRecv bool) ([]byte, error) {
	l := c.l
	if wire == WireFP8 {
		if err := checkFP8Received(l, r, step, c.ranks, pl, h, keep); err != nil {
			return nil, fmt.Errorf("received rows: %w", err)
		}
	} else if err := checkReceived(l, r, step, c.ranks, pl, h); err != nil {
		return nil, fmt.Errorf("received rows: %w", err)
	}
	in, out := h.Recv(), h.Output()
	if keep {
		H := l.hidden
		in = make([]byte, len(out))
		f := make([]float32, H)
		S := reduce.E4M3Scales(H)
		for n := range h.Rows() {
			if err := reduce.DequantizeE4M3(f, h.Recv()[n*H:(n+1)*H], h.Scales()[n*S:(n+1)*S]); err != nil {
				return nil, err
			}
			for j, v := range f {
				putElem(l.dtype, in, n*H+j, v)
			}
		}
	} else if inRecv {
		out = in
	}
	runExpertsOn(h, l.dtype, l.hidden, in, out)
	return out, nil
}

// runExpertsOn is runExperts reading in.
func runExpertsOn(h *Handle, dt reduce.DType, hidden int, in, out []byte) {
	for l := range h.LocalExperts() {
		e := h.Expert(l)
		for _, seg := range h.Segments(l) {
			for i := range seg.Rows * hidden {
				k := seg.Offset/dt.Size() + i
				putElem(dt, out, k, expertFn(e, getElem(dt, in, k)))
			}
		}
	}
}

// hierPipeline overlaps two micro-batches as TestAsyncPipeline does.
func hierPipeline(d *Dispatcher, c dispatchCase, pl *routing.Placement, r int, wire WireFormat, keep bool, hostOf func(int) int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := c.l
	s0, s1 := 10, 11
	tok0, tok1 := l.tokenRows(r, s0), l.tokenRows(r, s1)
	h0, err := d.DispatchAsync(ctx, tok0, l.decision(r, s0))
	if err != nil {
		return err
	}
	defer h0.Release()
	h1, err := d.DispatchAsync(ctx, tok1, l.decision(r, s1))
	if err != nil {
		return err
	}
	defer h1.Release()
	if err := h0.Wait(); err != nil {
		return err
	}
	out0, err := hierCompute(h0, c, pl, r, s0, wire, keep, false)
	if err != nil {
		return err
	}
	res0 := make([]byte, len(tok0))
	if err := d.CombineAsync(ctx, h0, out0, res0); err != nil {
		return err
	}
	if err := h1.Wait(); err != nil {
		return err
	}
	out1, err := hierCompute(h1, c, pl, r, s1, wire, keep, false)
	if err != nil {
		return err
	}
	res1 := make([]byte, len(tok1))
	if err := d.Combine(ctx, h1, out1, res1); err != nil {
		return err
	}
	if err := h0.Wait(); err != nil {
		return err
	}
	if err := checkHierCombined(l, r, s0, res0, wire, pl, hostOf); err != nil {
		return fmt.Errorf("micro-batch 0: %w", err)
	}
	return checkHierCombined(l, r, s1, res1, wire, pl, hostOf)
}

// checkHierCombined verifies out against the relay path's arithmetic: for
// each token, the float32 weighted sum of its expert outputs on each host,
// rounded to DType, summed in float32 and rounded again. The bound is
// checkCombined's plus a unit in the last place of each partial (a float32
// sum taken in another order may round it the other way). With FP8 the
// experts saw the dequantized rows.
func checkHierCombined(l layer, r, step int, out []byte, wire WireFormat, pl *routing.Placement, hostOf func(int) int) error {
	output := func(e, t, j int) float32 { return expertFn(e, l.value(r, step, t, j)) }
	if wire == WireFP8 {
		refs := map[int]fp8Ref{}
		output = func(e, t, j int) float32 {
			ref, ok := refs[t]
			if !ok {
				ref, _ = fp8Row(l, r, step, t)
				refs[t] = ref
			}
			return roundTo(l.dtype, expertFn(e, roundTo(l.dtype, ref.deq[j])))
		}
	}
	dec := l.dispatched(r, step)
	H := l.hidden
	partial := map[int]float32{}
	for t := range dec.Tokens {
		for j := range H {
			clear(partial)
			for s := range dec.K {
				e := dec.Expert[t*dec.K+s]
				if e == routing.Dropped {
					continue
				}
				partial[hostOf(pl.Owner[e])] += dec.Weight[t*dec.K+s] * output(int(e), t, j)
			}
			var acc, slack float32
			for _, p := range partial {
				acc += roundTo(l.dtype, p)
				if l.dtype == reduce.Float32 {
					slack += 1e-6 * max(1, abs(p))
				} else {
					slack += abs(p) / 128
				}
			}
			want := roundTo(l.dtype, acc)
			got := getElem(l.dtype, out, t*H+j)
			tol := float32(1e-6) * max(1, abs(want))
			if l.dtype != reduce.Float32 {
				tol = max(abs(want), 1e-3) / 128
			}
			if abs(got-want) > tol+slack {
				return fmt.Errorf("token %d element %d: got %v, want %v (bound %v)", t, j, got, want, tol+slack)
			}
		}
	}
	return nil
}

// TestHierarchyCrossHostBytes: in the DeepSeek-V3 shape (256 experts,
// top-8, hidden 7168, bfloat16) on 4 fake hosts of 2 ranks, the relay path
// sends across hosts exactly one row per distinct (token, remote host)
// pair of the routing, the flat path one per (token, remote expert); and
// the transport's own byte counters between the hosts agree: the relay
// path's are at least those rows and at most their rows, metadata and 4
// KiB of framing per peer, and below the flat path's rows.
func TestHierarchyCrossHostBytes(t *testing.T) {
	const ranks, hosts, E, K, H, T = 8, 4, 256, 8, 7168, 48
	hostOf := func(r int) int { return r / (ranks / hosts) }
	comms := group(t, startNATS(t), ranks, fakeHosts(hostOf))
	l := layer{experts: E, k: K, hidden: H, tokens: T, dtype: reduce.BFloat16, seed: 5}
	pl, err := routing.Contiguous(E, ranks)
	if err != nil {
		t.Fatal(err)
	}
	rb := H * 2
	for _, mode := range []HierarchyMode{HierarchyOn, HierarchyOff} {
		t.Run(mode.String(), func(t *testing.T) {
			ds := newDispatchers(t, comms, Config{Experts: E, K: K, Hidden: H, DType: reduce.BFloat16, Hierarchy: mode, Logger: discard})
			mustAll(t, onAll(ranks, func(r int) error {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				dec := l.decision(r, 0)
				pairs, remote := 0, 0
				for tok := range dec.Tokens {
					seen := map[int]bool{}
					for s := range K {
						g := hostOf(pl.Owner[dec.Expert[tok*K+s]])
						if g == hostOf(r) {
							continue
						}
						remote++
						if !seen[g] {
							seen[g] = true
							pairs++
						}
					}
				}
				before := comms[r].Stats()
				h, err := ds[r].Dispatch(ctx, l.tokenRows(r, 0), dec)
				if err != nil {
					return err
				}
				defer h.Release()
				after := comms[r].Stats()
				var wire uint64
				for j := range ranks {
					if hostOf(j) != hostOf(r) {
						wire += after.BytesSent[j] - before.BytesSent[j]
					}
				}
				got := h.Stats().CrossHostBytes
				want, most := int64(remote*rb), uint64(remote*rb+ranks*4096)
				if mode == HierarchyOn {
					want, most = int64(pairs*rb), uint64(pairs*(rb+8*K)+ranks*4096)
				}
				if got != want {
					return fmt.Errorf("CrossHostBytes %d, want %d (%d pairs, %d remote rows of %d bytes)", got, want, pairs, remote, rb)
				}
				if wire < uint64(want) || wire > most {
					return fmt.Errorf("the transport sent %d bytes to other hosts, want %d to %d", wire, want, most)
				}
				if mode == HierarchyOn && float64(pairs) > 0.6*float64(remote) {
					return fmt.Errorf("%d (token, host) pairs for %d remote rows: the shape should halve the crossings", pairs, remote)
				}
				if err := checkReceived(l, r, 0, ranks, pl, h); err != nil {
					return err
				}
				return ds[r].Combine(ctx, h, h.Recv(), make([]byte, dec.Tokens*rb))
			}))
		})
	}
}

// TestHierarchyChoice: auto takes the relay path on fake hosts of equal
// size (TCP between hosts, shared memory inside: the cost model prices the
// crossing higher), never on one host or on hosts of different sizes, and
// forcing it where it cannot run fails New with ErrInvalidArgument on every
// rank, the Comm left usable.
func TestHierarchyChoice(t *testing.T) {
	url := startNATS(t)
	cases := []struct {
		name   string
		ranks  int
		hostOf func(int) int
		cfg    func(*Config)
		want   bool
		err    bool
	}{
		{name: "auto/hosts2x2", ranks: 4, hostOf: func(r int) int { return r / 2 }, want: true},
		{name: "auto/one-host", ranks: 3, hostOf: func(int) int { return 0 }},
		{name: "auto/uneven", ranks: 3, hostOf: func(r int) int { return r / 2 }},
		{name: "off/hosts2x2", ranks: 4, hostOf: func(r int) int { return r / 2 }, cfg: func(c *Config) { c.Hierarchy = HierarchyOff }},
		{name: "auto/nats-counts", ranks: 4, hostOf: func(r int) int { return r / 2 }, cfg: func(c *Config) { c.Counts = CountsNATS }},
		{name: "on/uneven", ranks: 3, hostOf: func(r int) int { return r / 2 }, cfg: func(c *Config) { c.Hierarchy = HierarchyOn }, err: true},
		{name: "on/one-host", ranks: 2, hostOf: func(int) int { return 0 }, cfg: func(c *Config) { c.Hierarchy = HierarchyOn }, err: true},
		{name: "on/nats-counts", ranks: 4, hostOf: func(r int) int { return r / 2 },
			cfg: func(c *Config) { c.Hierarchy, c.Counts = HierarchyOn, CountsNATS }, err: true},
		{name: "auto/decode", ranks: 4, hostOf: func(r int) int { return r / 2 }, cfg: func(c *Config) { c.MaxTokens = 8 }},
		{name: "on/decode", ranks: 4, hostOf: func(r int) int { return r / 2 },
			cfg: func(c *Config) { c.Hierarchy, c.MaxTokens = HierarchyOn, 8 }, err: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			comms := group(t, url, tc.ranks, fakeHosts(tc.hostOf))
			cfg := Config{Experts: 16, K: 4, Hidden: 64, DType: reduce.BFloat16, Logger: discard}
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			ds := make([]*Dispatcher, tc.ranks)
			errs := onAll(tc.ranks, func(r int) error {
				var err error
				ds[r], err = New(context.Background(), comms[r], cfg)
				return err
			})
			for r, err := range errs {
				if tc.err {
					if !errors.Is(err, a2a.ErrInvalidArgument) {
						t.Fatalf("rank %d: New = %v, want ErrInvalidArgument", r, err)
					}
					if err := comms[r].Err(); err != nil {
						t.Fatalf("rank %d: Comm failed: %v", r, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
				defer ds[r].Close()
				if ds[r].Hierarchical() != tc.want {
					t.Fatalf("rank %d: Hierarchical() = %v, want %v", r, ds[r].Hierarchical(), tc.want)
				}
			}
		})
	}
}

// reportAll is mustAll reporting every rank's error: the first rank's is
// often only a timeout waiting for the one that failed.
func reportAll(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// hierRecorder counts what an Observer hears.
type hierRecorder struct {
	mu                         sync.Mutex
	dispatches, combines, load int
	shared                     int64
}

func (o *hierRecorder) ObserveDispatch(time.Duration, []int, int, float64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.dispatches++
}

func (o *hierRecorder) ObserveCombine(time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.combines++
}

func (o *hierRecorder) ObserveSharedTraffic(sent, received int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.shared += sent + received
}

func (o *hierRecorder) ObserveLoad([]float64, float64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.load++
}

// TestHierarchyObserver: on the relay path an Observer hears one dispatch
// and one combine per step (not the inner dispatcher's too), the forward's
// rows through shared memory, and the load estimate, which Load returns
// summed over the group.
func TestHierarchyObserver(t *testing.T) {
	const ranks, steps = 4, 4
	comms := group(t, startNATS(t), ranks, fakeHosts(func(r int) int { return r / 2 }))
	l := layer{experts: 8, k: 3, hidden: 16, tokens: 24, dtype: reduce.Float32, seed: 12}
	obs := make([]*hierRecorder, ranks)
	cfgs := make([]Config, ranks)
	for r := range ranks {
		obs[r] = new(hierRecorder)
		cfgs[r] = Config{Experts: 8, K: 3, Hidden: 16, Hierarchy: HierarchyOn, Observer: obs[r], Logger: discard}
	}
	ds := newDispatchersOf(t, comms, cfgs)
	mustAll(t, onAll(ranks, func(r int) error {
		for step := range steps {
			h, err := ds[r].Dispatch(t.Context(), l.tokenRows(r, step), l.decision(r, step))
			if err != nil {
				return err
			}
			err = ds[r].Combine(t.Context(), h, h.Recv(), make([]byte, h.Tokens()*ds[r].RowBytes()))
			h.Release()
			if err != nil {
				return err
			}
		}
		return nil
	}))
	for r, o := range obs {
		if o.dispatches != steps || o.combines != steps {
			t.Errorf("rank %d: %d dispatches and %d combines observed, want %d each", r, o.dispatches, o.combines, steps)
		}
		if o.shared == 0 || o.load == 0 {
			t.Errorf("rank %d: shared traffic %d B, %d load estimates observed: want some", r, o.shared, o.load)
		}
		total := 0.0
		for _, v := range ds[r].Load() {
			total += v
		}
		if total <= 0 {
			t.Errorf("rank %d: Load sums to %v", r, total)
		}
	}
}
