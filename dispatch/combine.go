package dispatch

import (
	"encoding/binary"
	"math"

	"github.com/a2a-moe/a2a/a2a/reduce"
)

// weightedSum writes every token's gate-weighted sum of expert outputs, read
// from the packed buffer the reverse exchange filled, into h.out.
//
// The sum runs in float32 in slot order and is rounded once: for one or two
// kept slots with fused kernels (the common top-1 and top-2 cases), beyond
// that through a float32 accumulator row. Each expert output is read once.
// For large steps (an output of streamBytes or more) the rows of the next
// token are prefetched while this one is summed (they sit anywhere in
// megabytes of outputs, each row a new stream the hardware prefetcher would
// only pick up after a few misses), and the sums of two kept slots are
// written with streaming stores where the vector kernel can (see vecAxpby).
func (h *Handle) weightedSum() {
	d := h.d
	K, rb, dt := d.cfg.K, d.rowBytes, d.cfg.DType
	stream := h.T*rb >= streamBytes
	for t := range h.T {
		if stream && t+1 < h.T {
			for a := (t + 1) * K; a < (t+2)*K; a++ {
				if h.slotOff[a] != -1 {
					prefetchRow(h.slotRow(a))
				}
			}
		}
		dst := h.out[t*rb : (t+1)*rb]
		n := 0
		for s := range K {
			a := t*K + s
			if h.slotOff[a] != -1 {
				h.offs[n], h.ws[n] = a, h.dec.Weight[a]
				n++
			}
		}
		switch {
		case n == 0:
			clear(dst)
		case n == 1 && dt != reduce.Float16:
			scaleRow(dt, dst, h.expertRow(0), h.ws[0])
		case n == 2 && dt != reduce.Float16:
			axpbyRow(dt, dst, h.expertRow(0), h.expertRow(1), h.ws[0], h.ws[1], stream)
		default:
			H := d.cfg.Hidden
			h.acc, h.tmp = growFloats(h.acc, H), growFloats(h.tmp, H)
			for i := range n {
				accumulate(dt, h.acc, h.tmp, h.expertRow(i), h.ws[i], i == 0)
			}
			narrowAcc(dt, dst, h.acc)
		}
	}
	if stream {
		storeFence()
	}
}

// accumulate adds one term of a weighted sum of three or more rows to the
// float32 accumulator row: acc = w*a (first) or acc += w*a, the product and
// the sum each rounded to float32. The vector kernels do the leading whole
// vectors, with the same bits; tmp is scratch of acc's length.
func accumulate(dt reduce.DType, acc, tmp []float32, a []byte, w float32, first bool) {
	v := vecAcc(dt, acc, a, w, first)
	acc, tmp = acc[v:], tmp[v:]
	widen(dt, tmp, a[v*dt.Size():])
	if first {
		for j, x := range tmp {
			acc[j] = w * x
		}
		return
	}
	for j, x := range tmp {
		acc[j] += float32(w * x)
	}
}

// narrowAcc rounds the accumulator row into dst, a row of dt elements.
func narrowAcc(dt reduce.DType, dst []byte, acc []float32) {
	v := vecNarrow(dt, dst, acc)
	narrow(dt, dst[v*dt.Size():], acc[v:])
}

// expertRow is the expert output row of the i-th kept slot collected in h.offs.
func (h *Handle) expertRow(i int) []byte { return h.slotRow(h.offs[i]) }

// slotRow is the expert output row of kept slot a: where the peer's expert
// wrote it or the reverse exchange put it (rowSrc), or for rows this rank
// kept for itself, in the expert outputs.
func (h *Handle) slotRow(a int) []byte {
	rb, off := h.d.rowBytes, h.slotOff[a]
	if off >= 0 {
		j := h.d.rt.slots.Owner[h.slotDec.Expert[a]]
		off -= h.rowDelta[j]
		return h.rowSrc[j][off : off+rb]
	}
	off = -2 - off
	return h.expertOut[off : off+rb]
}

// scaleRow sets dst = w*a elementwise (float32 or bfloat16 rows).
func scaleRow(dt reduce.DType, dst, a []byte, w float32) {
	le := binary.LittleEndian
	a = a[:len(dst)]
	n := vecScale(dt == reduce.BFloat16, dst, a, w)
	dst, a = dst[n:], a[n:]
	if dt == reduce.Float32 {
		for i := 0; i+4 <= len(dst); i += 4 {
			x := math.Float32frombits(le.Uint32(a[i:]))
			le.PutUint32(dst[i:], math.Float32bits(w*x))
		}
		return
	}
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		x := le.Uint64(a[i:])
		r0 := reduce.F32ToBF16(w * bf16(uint16(x)))
		r1 := reduce.F32ToBF16(w * bf16(uint16(x>>16)))
		r2 := reduce.F32ToBF16(w * bf16(uint16(x>>32)))
		r3 := reduce.F32ToBF16(w * bf16(uint16(x>>48)))
		le.PutUint64(dst[i:], uint64(r0)|uint64(r1)<<16|uint64(r2)<<32|uint64(r3)<<48)
	}
	for ; i+2 <= len(dst); i += 2 {
		le.PutUint16(dst[i:], reduce.F32ToBF16(w*bf16(le.Uint16(a[i:]))))
	}
}

// axpbyRow sets dst = wa*a + wb*b elementwise (float32 or bfloat16 rows),
// rounding the products and the sum to float32 (the explicit conversions
// forbid a fused multiply-add, so that every architecture and the vector
// kernels agree bit for bit) and the result once to the row type. With
// stream, the vector kernels may use non-temporal stores: call storeFence
// after the last row.
func axpbyRow(dt reduce.DType, dst, a, b []byte, wa, wb float32, stream bool) {
	le := binary.LittleEndian
	a, b = a[:len(dst)], b[:len(dst)]
	n := vecAxpby(dt == reduce.BFloat16, dst, a, b, wa, wb, stream)
	dst, a, b = dst[n:], a[n:], b[n:]
	if dt == reduce.Float32 {
		i := 0
		// Two lanes per 64-bit load and store.
		for ; i+8 <= len(dst); i += 8 {
			x, y := le.Uint64(a[i:]), le.Uint64(b[i:])
			r0 := float32(wa*math.Float32frombits(uint32(x))) + float32(wb*math.Float32frombits(uint32(y)))
			r1 := float32(wa*math.Float32frombits(uint32(x>>32))) + float32(wb*math.Float32frombits(uint32(y>>32)))
			le.PutUint64(dst[i:], uint64(math.Float32bits(r0))|uint64(math.Float32bits(r1))<<32)
		}
		for ; i+4 <= len(dst); i += 4 {
			x := math.Float32frombits(le.Uint32(a[i:]))
			y := math.Float32frombits(le.Uint32(b[i:]))
			le.PutUint32(dst[i:], math.Float32bits(float32(wa*x)+float32(wb*y)))
		}
		return
	}
	i := 0
	// Four lanes per 64-bit load and store, as package reduce does.
	for ; i+8 <= len(dst); i += 8 {
		x, y := le.Uint64(a[i:]), le.Uint64(b[i:])
		r0 := reduce.F32ToBF16(float32(wa*bf16(uint16(x))) + float32(wb*bf16(uint16(y))))
		r1 := reduce.F32ToBF16(float32(wa*bf16(uint16(x>>16))) + float32(wb*bf16(uint16(y>>16))))
		r2 := reduce.F32ToBF16(float32(wa*bf16(uint16(x>>32))) + float32(wb*bf16(uint16(y>>32))))
		r3 := reduce.F32ToBF16(float32(wa*bf16(uint16(x>>48))) + float32(wb*bf16(uint16(y>>48))))
		le.PutUint64(dst[i:], uint64(r0)|uint64(r1)<<16|uint64(r2)<<32|uint64(r3)<<48)
	}
	for ; i+2 <= len(dst); i += 2 {
		x, y := bf16(le.Uint16(a[i:])), bf16(le.Uint16(b[i:]))
		le.PutUint16(dst[i:], reduce.F32ToBF16(float32(wa*x)+float32(wb*y)))
	}
}

func bf16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// widen decodes a row of dt elements into float32.
func widen(dt reduce.DType, dst []float32, src []byte) {
	le := binary.LittleEndian
	switch dt {
	case reduce.Float32:
		for j := range dst {
			dst[j] = math.Float32frombits(le.Uint32(src[4*j:]))
		}
	case reduce.BFloat16:
		for j := range dst {
			dst[j] = bf16(le.Uint16(src[2*j:]))
		}
	default:
		for j := range dst {
			dst[j] = reduce.F16ToF32(le.Uint16(src[2*j:]))
		}
	}
}

// narrow encodes float32 values as a row of dt elements, rounding to nearest even.
func narrow(dt reduce.DType, dst []byte, src []float32) {
	le := binary.LittleEndian
	switch dt {
	case reduce.Float32:
		for j, v := range src {
			le.PutUint32(dst[4*j:], math.Float32bits(v))
		}
	case reduce.BFloat16:
		j := 0
		for ; j+4 <= len(src); j += 4 { // four lanes per 64-bit store
			s := src[j : j+4 : j+4]
			le.PutUint64(dst[2*j:], uint64(reduce.F32ToBF16(s[0]))|uint64(reduce.F32ToBF16(s[1]))<<16|
				uint64(reduce.F32ToBF16(s[2]))<<32|uint64(reduce.F32ToBF16(s[3]))<<48)
		}
		for ; j < len(src); j++ {
			le.PutUint16(dst[2*j:], reduce.F32ToBF16(src[j]))
		}
	default:
		for j, v := range src {
			le.PutUint16(dst[2*j:], reduce.F32ToF16(v))
		}
	}
}
