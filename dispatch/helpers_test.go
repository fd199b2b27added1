package dispatch

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/a2atest"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

var discard = slog.New(slog.DiscardHandler)

func startNATS(t testing.TB) string { return a2atest.StartNATS(t) }

func group(t testing.TB, url string, n int, mod func(*a2a.Config)) []*a2a.Comm {
	return a2atest.Group(t, url, n, mod)
}

// onAll runs f for every rank concurrently and returns the errors by rank.
func onAll(n int, f func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r)
		}()
	}
	wg.Wait()
	return errs
}

func mustAll(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// newDispatchers creates one dispatcher per rank (New is collective) and
// closes them when the test ends.
func newDispatchers(t testing.TB, comms []*a2a.Comm, cfg Config) []*Dispatcher {
	t.Helper()
	cfgs := make([]Config, len(comms))
	for r := range cfgs {
		cfgs[r] = cfg
	}
	return newDispatchersOf(t, comms, cfgs)
}

// newDispatchersOf is newDispatchers with each rank's own configuration.
func newDispatchersOf(t testing.TB, comms []*a2a.Comm, cfgs []Config) []*Dispatcher {
	t.Helper()
	ds := make([]*Dispatcher, len(comms))
	mustAll(t, onAll(len(comms), func(r int) error {
		var err error
		ds[r], err = New(context.Background(), comms[r], cfgs[r])
		return err
	}))
	t.Cleanup(func() {
		for _, d := range ds {
			d.Close()
		}
	})
	return ds
}

// layer is a deterministic MoE workload: every rank can recompute any rank's
// tokens and routing for any step, which is what the checks rely on.
type layer struct {
	experts, k, hidden int
	tokens             int // base tokens per rank; rank r has a few more
	dtype              reduce.DType
	capacity           float64
	skew               float64
	preDrop            bool // the caller marks some slots Dropped itself
	seed               uint64
	// values, if set, replaces the default element values (value).
	values func(r, step, t, j int) float32
}

func (l layer) tokensOf(r, step int) int {
	if l.tokens == 0 {
		return 0
	}
	return l.tokens + (r*7+step*3)%5
}

// value is element j of token t of rank r at step: small multiples of 1/4,
// exact in every dtype under test.
func (l layer) value(r, step, t, j int) float32 {
	if l.values != nil {
		return l.values(r, step, t, j)
	}
	return float32((r*31+step*11+t*7+j*3)%17-8) * 0.25
}

func (l layer) tokenRows(r, step int) []byte {
	T, H := l.tokensOf(r, step), l.hidden
	buf := make([]byte, T*H*l.dtype.Size())
	for t := range T {
		for j := range H {
			putElem(l.dtype, buf, t*H+j, l.value(r, step, t, j))
		}
	}
	return buf
}

// decision is rank r's routing at step as the caller hands it to Dispatch.
func (l layer) decision(r, step int) *routing.Decision {
	T := l.tokensOf(r, step)
	rng := rand.New(rand.NewPCG(l.seed, uint64(r)<<32|uint64(step)))
	logits := make([]float32, T*l.experts)
	if err := routing.SkewedLogits(rng, T, l.experts, l.skew, logits); err != nil {
		panic(err)
	}
	var d routing.Decision
	if err := (routing.Gate{Experts: l.experts, K: l.k}).Route(logits, T, &d); err != nil {
		panic(err)
	}
	if l.preDrop {
		for i := range d.Expert {
			if (i*13+r)%9 == 0 {
				d.Expert[i], d.Weight[i] = routing.Dropped, 0
			}
		}
	}
	return &d
}

// dispatched is the decision after capacity, as the dispatcher computes it.
func (l layer) dispatched(r, step int) *routing.Decision {
	d := l.decision(r, step)
	if _, err := (routing.Capacity{Factor: l.capacity}).Apply(d, l.experts, nil); err != nil {
		panic(err)
	}
	return d
}

// expertFn is expert e's output for input x: exact in every dtype under test
// for the values layer.value produces.
func expertFn(e int, x float32) float32 { return x*float32(e%3+1)*0.5 + float32(e%5)*0.125 }

// runExperts applies expertFn to every received row, writing to out (which
// may be h.Recv() itself).
func runExperts(h *Handle, dt reduce.DType, hidden int, out []byte) {
	in := h.Recv()
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

// checkReceived verifies that h holds, for every local expert and source
// rank, exactly the rows of that rank's tokens routed there, in token order.
func checkReceived(l layer, r, step, size int, pl *routing.Placement, h *Handle) error {
	rb := l.hidden * l.dtype.Size()
	tokens := make([][]byte, size) // by source rank, made once
	return walkReceived(l, r, step, size, pl, h, func(src, t int, seg Segment, n int) error {
		if tokens[src] == nil {
			tokens[src] = l.tokenRows(src, step)
		}
		got := h.Recv()[seg.Offset+n*rb : seg.Offset+(n+1)*rb]
		if want := tokens[src]; string(got) != string(want[t*rb:(t+1)*rb]) {
			return fmt.Errorf("not token %d's row", t)
		}
		return nil
	})
}

// walkReceived checks the segments of h against the reference routing and
// calls row for row n of every segment with the token t of rank src it
// must hold.
func walkReceived(l layer, r, step, size int, pl *routing.Placement, h *Handle, row func(src, t int, seg Segment, n int) error) error {
	local := pl.PerRank[r]
	if h.LocalExperts() != len(local) {
		return fmt.Errorf("%d local experts, want %d", h.LocalExperts(), len(local))
	}
	total := 0
	for li, e := range local {
		if h.Expert(li) != e {
			return fmt.Errorf("local expert %d is %d, want %d", li, h.Expert(li), e)
		}
		segs := h.Segments(li)
		if len(segs) != size {
			return fmt.Errorf("expert %d: %d segments, want %d", e, len(segs), size)
		}
		rows := 0
		for src, seg := range segs {
			if seg.Source != src {
				return fmt.Errorf("expert %d segment %d names source %d", e, src, seg.Source)
			}
			dec := l.dispatched(src, step)
			n := 0
			for t := range dec.Tokens {
				for s := range dec.K {
					if int(dec.Expert[t*dec.K+s]) != e {
						continue
					}
					if n >= seg.Rows {
						return fmt.Errorf("expert %d from rank %d: %d rows, want more", e, src, seg.Rows)
					}
					if err := row(src, t, seg, n); err != nil {
						return fmt.Errorf("expert %d from rank %d row %d: %w", e, src, n, err)
					}
					n++
				}
			}
			if n != seg.Rows {
				return fmt.Errorf("expert %d from rank %d: %d rows, want %d", e, src, seg.Rows, n)
			}
			rows += n
		}
		if h.ExpertRows(li) != rows {
			return fmt.Errorf("expert %d: ExpertRows %d, segments hold %d", e, h.ExpertRows(li), rows)
		}
		total += rows
	}
	if h.Rows() != total {
		return fmt.Errorf("Rows %d, want %d", h.Rows(), total)
	}
	return nil
}

// checkCombined verifies out against the reference MoE layer output of rank
// r's tokens: the float32 sum over kept slots of weight * expert(token),
// rounded to the dtype. A bfloat16/float16 result may differ by one unit in
// the last place (fused multiply-add on some architectures); float32 by a
// relative 1e-6.
func checkCombined(l layer, r, step int, out []byte) error {
	return checkCombinedOf(l, r, step, out, func(e, t, j int) float32 { return expertFn(e, l.value(r, step, t, j)) })
}

// checkCombinedOf is checkCombined with expert e's output for element j of
// token t given by output.
func checkCombinedOf(l layer, r, step int, out []byte, output func(e, t, j int) float32) error {
	dec := l.dispatched(r, step)
	H := l.hidden
	if len(out) != dec.Tokens*H*l.dtype.Size() {
		return fmt.Errorf("output of %d bytes, want %d", len(out), dec.Tokens*H*l.dtype.Size())
	}
	for t := range dec.Tokens {
		for j := range H {
			var acc float32
			for s := range dec.K {
				e := dec.Expert[t*dec.K+s]
				if e == routing.Dropped {
					continue
				}
				acc += dec.Weight[t*dec.K+s] * output(int(e), t, j)
			}
			want := roundTo(l.dtype, acc)
			got := getElem(l.dtype, out, t*H+j)
			tol := float32(1e-6) * max(1, abs(want))
			if l.dtype != reduce.Float32 {
				tol = max(abs(want), 1e-3) / 128 // one bf16 ulp covers f16 too
			}
			if abs(got-want) > tol {
				return fmt.Errorf("token %d element %d: got %v, want %v", t, j, got, want)
			}
		}
	}
	return nil
}

func abs(x float32) float32 { return float32(math.Abs(float64(x))) }

func roundTo(dt reduce.DType, v float32) float32 {
	switch dt {
	case reduce.BFloat16:
		return reduce.BF16ToF32(reduce.F32ToBF16(v))
	case reduce.Float16:
		return reduce.F16ToF32(reduce.F32ToF16(v))
	}
	return v
}

func putElem(dt reduce.DType, buf []byte, i int, v float32) {
	le := binary.LittleEndian
	switch dt {
	case reduce.Float32:
		le.PutUint32(buf[4*i:], math.Float32bits(v))
	case reduce.BFloat16:
		le.PutUint16(buf[2*i:], reduce.F32ToBF16(v))
	default:
		le.PutUint16(buf[2*i:], reduce.F32ToF16(v))
	}
}

func getElem(dt reduce.DType, buf []byte, i int) float32 {
	le := binary.LittleEndian
	switch dt {
	case reduce.Float32:
		return math.Float32frombits(le.Uint32(buf[4*i:]))
	case reduce.BFloat16:
		return reduce.BF16ToF32(le.Uint16(buf[2*i:]))
	}
	return reduce.F16ToF32(le.Uint16(buf[2*i:]))
}
