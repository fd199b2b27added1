package main

import (
	"encoding/binary"
	"math"
	"math/rand/v2"

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

// forward computes expert e on one row: in and out are rows of the layer's
// dtype, act is scratch of o.hidden+o.ffn float32. The reference and the
// distributed path both call it, so their expert outputs are identical.
func (m *model) forward(e int, in, out []byte, act []float32) {
	H, F := m.o.hidden, m.o.ffn
	x, h := act[:H], act[H:H+F]
	decode(m.o.dtype, x, in)
	ex := &m.experts[e]
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
		x[j] = s // x is free again: reuse it for the output
	}
	encode(m.o.dtype, out, x)
}

// tokens fills buf with the rows of (step, rank): standard normal values.
func (m *model) tokens(step, rank int, buf []byte) {
	rng := rand.New(rand.NewPCG(m.o.seed^saltTokens, uint64(step)<<32|uint64(rank)))
	n := len(buf) / m.o.dtype.Size()
	for i := range n {
		encodeOne(m.o.dtype, buf, i, float32(rng.NormFloat64()))
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
func (m *model) reference(tokens []byte, dec *routing.Decision, out []byte, act, acc []float32, row []byte) {
	rb := m.o.hidden * m.o.dtype.Size()
	for t := range dec.Tokens {
		clear(acc)
		for s := range dec.K {
			e := dec.Expert[t*dec.K+s]
			if e == routing.Dropped {
				continue
			}
			m.forward(int(e), tokens[t*rb:(t+1)*rb], row, act)
			w := dec.Weight[t*dec.K+s]
			for j := range acc {
				acc[j] += float32(w * decodeOne(m.o.dtype, row, j))
			}
		}
		encode(m.o.dtype, out[t*rb:(t+1)*rb], acc)
	}
}

func decode(dt reduce.DType, dst []float32, src []byte) {
	for j := range dst {
		dst[j] = decodeOne(dt, src, j)
	}
}

func encode(dt reduce.DType, dst []byte, src []float32) {
	for j, v := range src {
		encodeOne(dt, dst, j, v)
	}
}

func decodeOne(dt reduce.DType, b []byte, i int) float32 {
	if dt == reduce.BFloat16 {
		return reduce.BF16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
}

func encodeOne(dt reduce.DType, b []byte, i int, v float32) {
	if dt == reduce.BFloat16 {
		binary.LittleEndian.PutUint16(b[2*i:], reduce.F32ToBF16(v))
		return
	}
	binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
}
