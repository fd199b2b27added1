package main

import (
	"math"
	"math/rand/v2"
	"slices"

	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

// Salts keep the random streams of tokens, router logits and expert weights
// apart although they share the seed.
const (
	saltTokens  = 0x746f6b656e73 // "tokens"
	saltLogits  = 0x6c6f67697473 // "logits"
	saltWeights = 0x77656967687473
)

// model is the MoE layer every rank can rebuild from the options alone: the
// tokens and router logits of any (step, rank), and every expert's weights.
// That is what lets each rank compute the reference output of its tokens
// without asking anyone.
type model struct {
	o       options
	experts []expert // all of them: the reference needs any expert
}

// expert is a two-layer feed-forward network: y = W2 relu(W1 x + b1) + b2,
// W1 is ffn x hidden, W2 hidden x ffn, row-major, float32.
type expert struct {
	w1, b1, w2, b2 []float32
}

func newModel(o options) *model {
	m := &model{o: o, experts: make([]expert, o.experts)}
	H, F := o.hidden, o.ffn
	for e := range m.experts {
		rng := rand.New(rand.NewPCG(o.seed^saltWeights, uint64(e)))
		// Scaled so activations stay near unit size through both layers.
		s1, s2 := 1/math.Sqrt(float64(H)), 1/math.Sqrt(float64(F))
		x := expert{w1: make([]float32, F*H), b1: make([]float32, F), w2: make([]float32, H*F), b2: make([]float32, H)}
		for i := range x.w1 {
			x.w1[i] = float32(rng.NormFloat64() * s1)
		}
		for i := range x.b1 {
			x.b1[i] = float32(rng.NormFloat64() * 0.1)
		}
		for i := range x.w2 {
			x.w2[i] = float32(rng.NormFloat64() * s2)
		}
		for i := range x.b2 {
			x.b2[i] = float32(rng.NormFloat64() * 0.1)
		}
		m.experts[e] = x
	}
	return m
}

// forward computes expert ex on one row x into y, in float32: h is scratch
// of o.ffn values, and y may be x itself. The reference (the seed's
// experts) and the distributed path (the rank's own copies, see weights)
// both call it, so their expert outputs are identical when the weights are.
func (m *model) forward(ex *expert, x, y, h []float32) {
	H, F := m.o.hidden, m.o.ffn
	for f := range F {
		w := ex.w1[f*H : (f+1)*H]
		s := ex.b1[f]
		for j, v := range x {
			s += float32(w[j] * v)
		}
		h[f] = max(s, 0)
	}
	for j := range H {
		w := ex.w2[j*F : (j+1)*F]
		s := ex.b2[j]
		for f, v := range h {
			s += float32(w[f] * v)
		}
		y[j] = s // x is read no more: y may be x
	}
}

// apply runs expert ex on every row of in into the same row of out. act is
// scratch of o.hidden+o.ffn values.
func (m *model) apply(ex *expert, in, out rows, act []float32) {
	H := m.o.hidden
	for t := range in.len() / H {
		x := in.row(t, act[:H])
		y := out.dest(t, act[:H])
		m.forward(ex, x, y, act[H:])
		out.put(t, y)
	}
}

// tokens fills buf with the rows of (step, rank): standard normal values.
func (m *model) tokens(step, rank int, buf rows) {
	rng := rand.New(rand.NewPCG(m.o.seed^saltTokens, uint64(step)<<32|uint64(rank)))
	for i := range buf.len() {
		buf.set(i, float32(rng.NormFloat64()))
	}
}

// logits fills dst (tokens x experts) with the router logits of (step, rank):
// Zipf-skewed by o.skew (0 is uniform), see routing.SkewedLogits.
func (m *model) logits(step, rank int, dst []float32) error {
	rng := rand.New(rand.NewPCG(m.o.seed^saltLogits, uint64(step)<<32|uint64(rank)))
	return routing.SkewedLogits(rng, len(dst)/m.o.experts, m.o.experts, m.o.skew, dst)
}

// reference computes, in one process, what the distributed layer must return
// for one micro-batch: the gate-weighted sum over each token's kept experts
// of the expert outputs, in slot order, in float32, rounded once to the
// dtype. dec is the routing after capacity (the dispatcher drops the same
// assignments: capacity depends only on the micro-batch's own decision). A
// dropped assignment contributes zero, and a token that lost every
// assignment gets a zero row: in a real model the residual connection
// carries it past the layer.
func (m *model) reference(tokens rows, dec *routing.Decision, out rows, act, acc []float32, row rows) {
	for t := range dec.Tokens {
		clear(acc)
		for s := range dec.K {
			e := dec.Expert[t*dec.K+s]
			if e == routing.Dropped {
				continue
			}
			// Through a row of the layer's dtype, as the distributed
			// path's expert outputs are.
			m.apply(&m.experts[e], tokens.slice(t, t+1), row, act)
			w := dec.Weight[t*dec.K+s]
			for j := range acc {
				acc[j] += float32(w * row.at(j))
			}
		}
		out.put(t, acc)
	}
}

// referenceRelay is reference for the relay path (dispatch.Config.Hierarchy):
// the products of each host's experts summed in slot order in float32 and
// rounded to the dtype (the partial row that host sends back), then the
// partials summed in float32, those of host own first, then the others in
// the order the token's slots first name them, and rounded once more.
// hostOf gives the host of expert e's rank.
func (m *model) referenceRelay(tokens rows, dec *routing.Decision, out rows, act, acc, part []float32, row rows, hostOf func(e int) int, own int) {
	var hosts []int
	for t := range dec.Tokens {
		clear(acc)
		hosts = append(hosts[:0], own)
		for s := range dec.K {
			if e := dec.Expert[t*dec.K+s]; e != routing.Dropped && !slices.Contains(hosts, hostOf(int(e))) {
				hosts = append(hosts, hostOf(int(e)))
			}
		}
		for _, g := range hosts {
			clear(part)
			for s := range dec.K {
				e := dec.Expert[t*dec.K+s]
				if e == routing.Dropped || hostOf(int(e)) != g {
					continue
				}
				m.apply(&m.experts[e], tokens.slice(t, t+1), row, act)
				w := dec.Weight[t*dec.K+s]
				for j := range part {
					part[j] += float32(w * row.at(j))
				}
			}
			for j, v := range part {
				if m.o.dtype == reduce.BFloat16 {
					v = reduce.BF16ToF32(reduce.F32ToBF16(v))
				}
				acc[j] += v
			}
		}
		out.put(t, acc)
	}
}

// rows is a buffer of token rows in the layer's dtype seen through reduce's
// typed views, without copying: float32 rows are read and written in place,
// bfloat16 rows are widened to float32 and rounded back a row at a time.
type rows struct {
	hidden int
	bf16   bool
	f32    []float32 // float32 layers
	h16    []uint16  // bfloat16 layers: the bits
}

// viewRows views b, rows of hidden elements of dt (float32 or bfloat16).
// It fails only when b is misaligned or holds partial elements, which
// buffers from make and from a dispatch.Handle never are.
func viewRows(dt reduce.DType, b []byte, hidden int) (rows, error) {
	r := rows{hidden: hidden, bf16: dt == reduce.BFloat16}
	var err error
	if r.bf16 {
		r.h16, err = reduce.BFloat16s(b)
	} else {
		r.f32, err = reduce.Float32s(b)
	}
	return r, err
}

// len is the number of elements.
func (r rows) len() int { return len(r.f32) + len(r.h16) }

// slice returns rows lo..hi-1.
func (r rows) slice(lo, hi int) rows {
	if r.bf16 {
		r.h16 = r.h16[lo*r.hidden : hi*r.hidden]
	} else {
		r.f32 = r.f32[lo*r.hidden : hi*r.hidden]
	}
	return r
}

func (r rows) at(i int) float32 {
	if r.bf16 {
		return reduce.BF16ToF32(r.h16[i])
	}
	return r.f32[i]
}

func (r rows) set(i int, v float32) {
	if r.bf16 {
		r.h16[i] = reduce.F32ToBF16(v)
	} else {
		r.f32[i] = v
	}
}

// row returns row t in float32: the row itself, or widened into scratch.
func (r rows) row(t int, scratch []float32) []float32 {
	if !r.bf16 {
		return r.f32[t*r.hidden : (t+1)*r.hidden]
	}
	for j, h := range r.h16[t*r.hidden : (t+1)*r.hidden] {
		scratch[j] = reduce.BF16ToF32(h)
	}
	return scratch
}

// dest returns where to compute row t: the row itself, or scratch that put
// then rounds into the row.
func (r rows) dest(t int, scratch []float32) []float32 {
	if !r.bf16 {
		return r.f32[t*r.hidden : (t+1)*r.hidden]
	}
	return scratch
}

// put stores v as row t; a row computed in place (dest) is already there.
func (r rows) put(t int, v []float32) {
	if !r.bf16 {
		copy(r.f32[t*r.hidden:(t+1)*r.hidden], v) // no-op when v is the row
		return
	}
	for j, x := range v {
		r.h16[t*r.hidden+j] = reduce.F32ToBF16(x)
	}
}
