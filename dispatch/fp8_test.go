package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

// fp8Ref is token t of rank src at step as the FP8 wire carries it: the
// row in float32, its E4M3 bytes and scales (QuantizeE4M3's), and the
// values a receiver dequantizes.
type fp8Ref struct {
	x      []float32
	q      []uint8
	scales []float32
	deq    []float32
}

func fp8Row(l layer, src, step, t int) (fp8Ref, error) {
	H := l.hidden
	ref := fp8Ref{x: make([]float32, H), q: make([]uint8, H), scales: make([]float32, reduce.E4M3Scales(H)), deq: make([]float32, H)}
	for j := range H {
		ref.x[j] = roundTo(l.dtype, l.value(src, step, t, j))
	}
	if err := reduce.QuantizeE4M3(ref.q, ref.scales, ref.x); err != nil {
		return ref, err
	}
	err := reduce.DequantizeE4M3(ref.deq, ref.q, ref.scales)
	return ref, err
}

// fp8Value is layer.value with a few elements scaled, so that the blocks of
// one row have different scales, values well inside the subnormal range of
// their block appear, and a row of zeros (token 3) is sent too.
func fp8Value(r, step, t, j int) float32 {
	if t == 3 {
		return 0
	}
	v := float32((r*31+step*11+t*7+j*3)%17-8) * 0.25
	switch {
	case j%5 == 0:
		return v / 1024 // subnormal in E4M3 next to the block's amax
	case j/reduce.E4M3Block == 1:
		return v * 37.5
	}
	return v
}

// TestFP8Wire runs verified steps with WireFP8: every received element
// within |x|/16 plus half the smallest subnormal step of its block
// (scale*2^-10) of the float64 reference, or with KeepFP8 exactly the FP8
// bytes and scales QuantizeE4M3 produces; the combined outputs are the
// weighted sums of the experts' outputs on the dequantized rows. Float32 and
// bfloat16 rows, with capacity and skew, through shared memory on one host,
// over TCP, and both at once on two fake hosts; synchronous and pipelined.
func TestFP8Wire(t *testing.T) {
	transports := []struct {
		name  string
		ranks int
		mod   func(*a2a.Config)
		rows  RowPath
	}{
		{name: "shm", ranks: 3},
		{name: "alltoallv", ranks: 3, rows: RowsAllToAllV},
		{name: "tcp", ranks: 3, mod: func(c *a2a.Config) { c.Transport = "tcp" }},
		{name: "hosts2", ranks: 4, mod: func(c *a2a.Config) { c.Host = fmt.Sprintf("host%d", c.Rank%2) }},
	}
	layers := []struct {
		name string
		l    layer
		keep bool
	}{
		{name: "bf16/capacity/skew", l: layer{experts: 7, k: 2, hidden: 300, tokens: 40, dtype: reduce.BFloat16, capacity: 1.1, skew: 1.5}},
		{name: "f32/k3/drops", l: layer{experts: 6, k: 3, hidden: 260, tokens: 30, dtype: reduce.Float32, capacity: 0.8, skew: 1, preDrop: true}},
		{name: "bf16/keep", l: layer{experts: 5, k: 2, hidden: 200, tokens: 25, dtype: reduce.BFloat16, capacity: 1.25, skew: 1}, keep: true},
		{name: "f32/keep/large", l: layer{experts: 4, k: 2, hidden: 1100, tokens: 300, dtype: reduce.Float32, skew: 0.5}, keep: true},
	}
	url := startNATS(t)
	for ti, tr := range transports {
		comms := group(t, url, tr.ranks, tr.mod)
		for li, lc := range layers {
			t.Run(tr.name+"/"+lc.name, func(t *testing.T) {
				l := lc.l
				l.seed = uint64(300 + 10*ti + li)
				l.values = fp8Value
				c := dispatchCase{ranks: tr.ranks, rows: tr.rows, l: l}
				pl := c.placement(t)
				ds := newDispatchers(t, comms, Config{Experts: l.experts, K: l.k, Hidden: l.hidden, DType: l.dtype,
					CapacityFactor: l.capacity, Rows: tr.rows, Wire: WireFP8, KeepFP8: lc.keep, Logger: discard,
					Hierarchy: HierarchyOff}) // the flat path: TestHierarchy runs FP8 on the relay path
				mustAll(t, onAll(tr.ranks, func(r int) error {
					for step := range 2 {
						if err := fp8Step(ds[r], c, pl, r, step, lc.keep, step == 1); err != nil {
							return fmt.Errorf("step %d: %w", step, err)
						}
					}
					return nil
				}))
			})
		}
	}
}

// fp8Step is one verified step of rank r, asynchronous with async.
func fp8Step(d *Dispatcher, c dispatchCase, pl *routing.Placement, r, step int, keep, async bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := c.l
	tokens := l.tokenRows(r, step)
	dispatch := d.Dispatch
	if async {
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
	if err := checkFP8Received(l, r, step, c.ranks, pl, h, keep); err != nil {
		return fmt.Errorf("received rows: %w", err)
	}
	// What the experts read: with KeepFP8 the test dequantizes itself.
	H, dt := l.hidden, l.dtype
	in := h.Recv()
	if keep {
		in = make([]byte, len(h.Output()))
		f := make([]float32, H)
		S := reduce.E4M3Scales(H)
		for n := range h.Rows() {
			if err := reduce.DequantizeE4M3(f, h.Recv()[n*H:(n+1)*H], h.Scales()[n*S:(n+1)*S]); err != nil {
				return err
			}
			narrow(dt, in[n*H*dt.Size():], f)
		}
	}
	out := h.Output()
	for li := range h.LocalExperts() {
		e := h.Expert(li)
		for _, seg := range h.Segments(li) {
			for i := range seg.Rows * H {
				k := seg.Offset/dt.Size() + i
				putElem(dt, out, k, expertFn(e, getElem(dt, in, k)))
			}
		}
	}
	if err := d.Combine(ctx, h, out, tokens); err != nil {
		return err
	}
	// The experts saw the dequantized rows, rounded to the dtype, and wrote
	// their outputs rounded to it.
	deq := map[int][]float32{}
	return checkCombinedOf(l, r, step, tokens, func(e, t, j int) float32 {
		if deq[t] == nil {
			ref, err := fp8Row(l, r, step, t)
			if err != nil {
				panic(err)
			}
			deq[t] = ref.deq
		}
		return roundTo(dt, expertFn(e, roundTo(dt, deq[t][j])))
	})
}

// checkFP8Received checks every received row against the float64 reference
// within the FP8 bound, or with keep its bytes and scales exactly.
func checkFP8Received(l layer, r, step, size int, pl *routing.Placement, h *Handle, keep bool) error {
	H, dt := l.hidden, l.dtype
	S := reduce.E4M3Scales(H)
	if keep && (len(h.Recv()) != h.Rows()*H || len(h.Scales()) != h.Rows()*S) {
		return fmt.Errorf("KeepFP8: Recv %d bytes, Scales %d, want %d and %d", len(h.Recv()), len(h.Scales()), h.Rows()*H, h.Rows()*S)
	}
	if !keep && h.Scales() != nil {
		return fmt.Errorf("Scales without KeepFP8: %d", len(h.Scales()))
	}
	return walkReceived(l, r, step, size, pl, h, func(src, t int, seg Segment, n int) error {
		ref, err := fp8Row(l, src, step, t) // one row: no need to cache
		if err != nil {
			return err
		}
		row := seg.Offset/(H*dt.Size()) + n
		if keep {
			return checkKeptFP8Row(h, row, t, ref)
		}
		for j, x := range ref.x {
			got := float64(getElem(dt, h.Recv(), row*H+j))
			bound := math.Abs(float64(x))/16 + float64(ref.scales[j/reduce.E4M3Block])*0x1p-10
			if math.Abs(got-float64(x)) > bound {
				return fmt.Errorf("token %d element %d: got %v, want %v within %v", t, j, got, x, bound)
			}
		}
		return nil
	})
}

// checkKeptFP8Row checks received row row of token t, kept in FP8
// (KeepFP8): its E4M3 bytes and its scales exactly as QuantizeE4M3 gives them.
func checkKeptFP8Row(h *Handle, row, t int, ref fp8Ref) error {
	H := len(ref.q)
	S := len(ref.scales)
	if got := h.Recv()[row*H : (row+1)*H]; string(got) != string(ref.q) {
		return fmt.Errorf("token %d: FP8 bytes differ from QuantizeE4M3's", t)
	}
	for b, s := range h.Scales()[row*S : (row+1)*S] {
		if s != ref.scales[b] {
			return fmt.Errorf("token %d block %d: scale %v, want %v", t, b, s, ref.scales[b])
		}
	}
	return nil
}

// TestFP8NonFinite: a token row holding Inf or NaN fails the dispatch with
// ErrInvalidArgument naming the token on its rank and with ErrAborted, at
// once, on every other rank (through the counts exchange, so nobody waits
// for rows); the Comm stays usable and the next step verifies.
func TestFP8NonFinite(t *testing.T) {
	url := startNATS(t)
	for _, tc := range []struct {
		name  string
		dt    reduce.DType
		bad   float32
		rows  RowPath
		mod   func(*a2a.Config)
		ranks int // 0: 3
		hier  HierarchyMode
	}{
		{name: "f32/nan/shm", dt: reduce.Float32, bad: float32(math.NaN())},
		{name: "bf16/inf/alltoallv", dt: reduce.BFloat16, bad: float32(math.Inf(-1)), rows: RowsAllToAllV},
		{name: "bf16/nan/tcp", dt: reduce.BFloat16, bad: float32(math.NaN()), mod: func(c *a2a.Config) { c.Transport = "tcp" }},
		// The relay path tells the peers in its crossing's counts.
		{name: "f32/inf/hosts2x2/relay", dt: reduce.Float32, bad: float32(math.Inf(1)), ranks: 4, hier: HierarchyOn,
			mod: fakeHosts(func(r int) int { return r / 2 })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ranks := max(tc.ranks, 3)
			comms := group(t, url, ranks, tc.mod)
			l := layer{experts: 6, k: 2, hidden: 130, tokens: 12, dtype: tc.dt, seed: 9}
			c := dispatchCase{ranks: ranks, rows: tc.rows, l: l}
			pl := c.placement(t)
			ds := newDispatchers(t, comms, Config{Experts: 6, K: 2, Hidden: 130, DType: tc.dt, Rows: tc.rows, Wire: WireFP8,
				Hierarchy: tc.hier, Logger: discard})
			start := time.Now()
			errs := onAll(ranks, func(r int) error {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				tokens := l.tokenRows(r, 0)
				if r == 1 {
					putElem(tc.dt, tokens, 2*l.hidden+129, tc.bad) // token 2, second block
				}
				h, err := ds[r].Dispatch(ctx, tokens, l.decision(r, 0))
				if err == nil {
					h.Release()
				}
				return err
			})
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the failed step took %v", d)
			}
			for r, err := range errs {
				switch {
				case r == 1 && (!errors.Is(err, a2a.ErrInvalidArgument) || !strings.Contains(err.Error(), "token 2")):
					t.Errorf("rank 1: %v, want ErrInvalidArgument naming token 2", err)
				case r != 1 && !errors.Is(err, a2a.ErrAborted):
					t.Errorf("rank %d: %v, want ErrAborted", r, err)
				}
			}
			mustAll(t, onAll(ranks, func(r int) error { return fp8Step(ds[r], c, pl, r, 1, false, false) }))
		})
	}
}

// TestFP8Config: WireFP8 takes float32 and bfloat16 rows with in-band
// counts only, KeepFP8 needs WireFP8, and ranks that differ in Wire or
// KeepFP8 fail New with ErrMismatch naming the field.
func TestFP8Config(t *testing.T) {
	base := Config{Experts: 4, K: 2, Hidden: 8, Logger: discard}
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Wire, c.DType = WireFP8, reduce.Float16 }, "not float16"},
		{func(c *Config) { c.Wire, c.Counts = WireFP8, CountsNATS }, "in-band counts"},
		{func(c *Config) { c.KeepFP8 = true }, "KeepFP8 needs Wire"},
		{func(c *Config) { c.Wire = 7 }, "wire format WireFormat(7)"},
	} {
		cfg := base
		tc.mod(&cfg)
		if err := cfg.withDefaults().validate(); !errors.Is(err, a2a.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want ErrInvalidArgument saying %q", cfg, err, tc.want)
		}
	}
	url := startNATS(t)
	comms := group(t, url, 3, nil)
	for _, tc := range []struct {
		all, two func(*Config)
		want     string
	}{
		{func(*Config) {}, func(c *Config) { c.Wire = WireFP8 }, "Config.Wire is fp8 there, same on this rank"},
		{func(c *Config) { c.Wire = WireFP8 }, func(c *Config) { c.KeepFP8 = true }, "Config.KeepFP8 is true there, false on this rank"},
	} {
		errs := onAll(3, func(r int) error {
			cfg := base
			tc.all(&cfg)
			if r == 2 {
				tc.two(&cfg)
			}
			d, err := New(context.Background(), comms[r], cfg)
			if err == nil {
				d.Close()
			}
			return err
		})
		for r, err := range errs {
			if !errors.Is(err, a2a.ErrMismatch) {
				t.Errorf("rank %d: %v, want ErrMismatch", r, err)
			}
		}
		if err := errs[0]; err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("rank 0: %v, want it to say %q", err, tc.want)
		}
	}
}

// TestFP8MisalignedTokens: token rows at an odd address (no typed view)
// are quantized through the scratch row, with the same result.
func TestFP8MisalignedTokens(t *testing.T) {
	const ranks = 2
	url := startNATS(t)
	comms := group(t, url, ranks, nil)
	for _, dt := range []reduce.DType{reduce.Float32, reduce.BFloat16} {
		l := layer{experts: 4, k: 2, hidden: 130, tokens: 9, dtype: dt, seed: 11, values: fp8Value}
		c := dispatchCase{ranks: ranks, l: l}
		pl := c.placement(t)
		ds := newDispatchers(t, comms, Config{Experts: 4, K: 2, Hidden: 130, DType: dt, Wire: WireFP8, Logger: discard})
		mustAll(t, onAll(ranks, func(r int) error {
			tok := l.tokenRows(r, 0)
			odd := make([]byte, len(tok)+1)[1:]
			copy(odd, tok)
			h, err := ds[r].Dispatch(t.Context(), odd, l.decision(r, 0))
			if err != nil {
				return err
			}
			defer h.Release()
			return checkFP8Received(l, r, 0, ranks, pl, h, false)
		}))
	}
}
