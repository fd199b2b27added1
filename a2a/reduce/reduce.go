// Package reduce holds the elementwise reduction kernels of the AllReduce,
// ReduceScatter and Reduce collectives: dst = dst op src over buffers of
// little-endian encoded elements.
//
// The package imports only the standard library and the error kinds
// (a2a/internal/fault, itself a leaf) so that both the algorithm simulator
// and the engine can use it.
//
// Semantics, per element:
//   - Integers are exact two's complement (uint8: modulo 256); Sum and Prod wrap
//     around on overflow.
//   - Float Sum computes dst+src in the element's precision, so results are
//     deterministic for a given reduction order.
//   - Float Max and Min return NaN if either operand is NaN; max(-0, +0) is +0
//     and min(-0, +0) is -0.
//   - BFloat16 and Float16 are widened to float32, combined, and rounded back to
//     nearest-even (overflow gives ±Inf, NaN stays NaN, float16 subnormals are
//     exact). Each call rounds once, so a sum accumulated over k calls is
//     rounded k times.
//   - Avg accumulates a Sum; Finish then divides by the number of contributions.
//     Integer Avg truncates toward zero (-7/2 = -3), after any wrap-around of the
//     accumulated sum.
//
// It also holds the element conversions the layers above share: bfloat16 and
// float16 (half.go), typed views of byte buffers, and FP8 E4M3 with one scale
// per block of 128 elements (fp8.go), the wire format of MoE dispatch rows.
//
// Performance: for 4- and 8-byte elements, when the host is little-endian and
// every buffer is aligned for the element type, the kernels work on typed views
// of the bytes (no copying) in loops unrolled by eight; otherwise they decode
// through encoding/binary in small stack chunks. Half-precision and uint8
// kernels work on the bytes directly. Nothing allocates.
//
// Typed views: Float32s, Float64s, BFloat16s, Float16s, Int32s and Int64s
// are the inverse of AsBytes. They return a byte buffer (a collective's
// receive buffer, a dispatch.Handle's rows) as its elements without copying,
// and an error matching ErrInvalidArgument when the bytes are misaligned for
// the element type or hold a partial element. Buffers from a2a.AllocBuffer,
// from make and from a dispatch.Handle, and their row slices, are aligned.
package reduce

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// ErrInvalidArgument is matched (errors.Is) by every error of this package: an
// unknown dtype or op, mismatched or partial lengths, partially overlapping
// buffers, or a typed view of misaligned bytes. It is also the library's
// invalid-argument kind: errors.Is(err, a2a.ErrInvalidArgument) holds for
// the same errors, so a caller of reduce and a2a checks one sentinel.
var ErrInvalidArgument error = invalidArgument{}

// invalidArgument is this package's sentinel; Is makes it match the kind
// package a2a re-exports from fault, which this package may import (fault
// imports nothing of ours).
type invalidArgument struct{}

func (invalidArgument) Error() string { return "reduce: invalid argument" }

func (invalidArgument) Is(target error) bool { return target == fault.ErrInvalidArgument }

// chunk is the number of elements the portable paths decode at a time: large
// enough to amortise the kernel dispatch, small enough to live on the stack.
const chunk = 256

// Reduce computes dst[i] = dst[i] op src[i] for every element. dst and src must
// have the same length, a multiple of dt.Size(). src may be dst itself, but must
// not otherwise overlap it. For Avg it accumulates a Sum (see Finish).
func Reduce(dt DType, op Op, dst, src []byte) error {
	return ReduceTo(dt, op, dst, dst, src)
}

// ReduceTo computes dst[i] = a[i] op b[i] for every element, sparing ring
// algorithms a copy when the result must land in a third buffer. All three have
// the same length, a multiple of dt.Size(). dst may be a or b (or both), but
// must not partially overlap either. For Avg it accumulates a Sum.
func ReduceTo(dt DType, op Op, dst, a, b []byte) error {
	if err := check(dt, op, len(dst)); err != nil {
		return err
	}
	if len(a) != len(dst) || len(b) != len(dst) {
		return fmt.Errorf("%w: %s lengths differ (dst %d, a %d, b %d)", ErrInvalidArgument, dt, len(dst), len(a), len(b))
	}
	if len(dst) == 0 {
		return nil
	}
	if partialOverlap(dst, a) || partialOverlap(dst, b) {
		return fmt.Errorf("%w: destination partially overlaps an operand", ErrInvalidArgument)
	}
	switch dt {
	case Float32:
		if hostLittleEndian && aligned(4, dst, a, b) {
			applyVec(op, view[float32](dst), view[float32](a), view[float32](b), sumF32Vec)
		} else {
			portable32[float32](op, dst, a, b)
		}
	case Int32:
		if hostLittleEndian && aligned(4, dst, a, b) {
			applyVec(op, view[int32](dst), view[int32](a), view[int32](b), sumI32Vec)
		} else {
			portable32[int32](op, dst, a, b)
		}
	case Float64:
		if hostLittleEndian && aligned(unsafe.Alignof(float64(0)), dst, a, b) {
			applyVec(op, view[float64](dst), view[float64](a), view[float64](b), sumF64Vec)
		} else {
			portable64[float64](op, dst, a, b)
		}
	case Int64:
		if hostLittleEndian && aligned(unsafe.Alignof(int64(0)), dst, a, b) {
			applyVec(op, view[int64](dst), view[int64](a), view[int64](b), sumI64Vec)
		} else {
			portable64[int64](op, dst, a, b)
		}
	case Uint8:
		if op == Sum || op == Avg {
			sumBytes(dst, a, b)
		} else {
			applyTo(op, dst, a, b)
		}
	case BFloat16, Float16:
		halfTo(dt, op, dst, a, b)
	}
	return nil
}

// Finish completes an Avg reduction over n contributions by dividing every
// element of buf by n; for any other op it does nothing. Floats divide in
// float64 and round once to float32/float64 (bfloat16 and float16 then round to
// their own format); integers truncate toward zero. n must be at least 1 for Avg.
func Finish(dt DType, op Op, buf []byte, n int) error {
	if err := check(dt, op, len(buf)); err != nil {
		return err
	}
	if op != Avg {
		return nil
	}
	if n < 1 {
		return fmt.Errorf("%w: Avg over %d contributions", ErrInvalidArgument, n)
	}
	if n == 1 {
		return nil
	}
	fn := float64(n)
	switch dt {
	case Float32:
		for i := 0; i+4 <= len(buf); i += 4 {
			x := float64(math.Float32frombits(binary.LittleEndian.Uint32(buf[i:])))
			binary.LittleEndian.PutUint32(buf[i:], math.Float32bits(float32(x/fn)))
		}
	case Float64:
		for i := 0; i+8 <= len(buf); i += 8 {
			binary.LittleEndian.PutUint64(buf[i:], math.Float64bits(math.Float64frombits(binary.LittleEndian.Uint64(buf[i:]))/fn))
		}
	case BFloat16:
		for i := 0; i+2 <= len(buf); i += 2 {
			x := float64(BF16ToF32(binary.LittleEndian.Uint16(buf[i:])))
			binary.LittleEndian.PutUint16(buf[i:], F32ToBF16(float32(x/fn)))
		}
	case Float16:
		for i := 0; i+2 <= len(buf); i += 2 {
			x := float64(F16ToF32(binary.LittleEndian.Uint16(buf[i:])))
			binary.LittleEndian.PutUint16(buf[i:], F32ToF16(float32(x/fn)))
		}
	case Int32:
		for i := 0; i+4 <= len(buf); i += 4 {
			binary.LittleEndian.PutUint32(buf[i:], uint32(int32(int64(int32(binary.LittleEndian.Uint32(buf[i:])))/int64(n))))
		}
	case Int64:
		// n fits in int64 on every platform; Go's / truncates toward zero.
		for i := 0; i+8 <= len(buf); i += 8 {
			binary.LittleEndian.PutUint64(buf[i:], uint64(int64(binary.LittleEndian.Uint64(buf[i:]))/int64(n)))
		}
	case Uint8:
		for i := range buf {
			buf[i] = uint8(int(buf[i]) / n)
		}
	}
	return nil
}

// check validates the dtype, the op and that size bytes hold whole elements.
func check(dt DType, op Op, size int) error {
	if !dt.Valid() {
		return fmt.Errorf("%w: invalid dtype %d", ErrInvalidArgument, uint8(dt))
	}
	if !op.Valid() {
		return fmt.Errorf("%w: invalid op %d", ErrInvalidArgument, uint8(op))
	}
	if size%dt.Size() != 0 {
		return fmt.Errorf("%w: %d bytes is not a whole number of %s elements", ErrInvalidArgument, size, dt)
	}
	return nil
}

// partialOverlap reports whether two equal-length, non-empty buffers share
// memory without being the same buffer; elementwise kernels would then read
// elements they already overwrote.
func partialOverlap(x, y []byte) bool {
	px := uintptr(unsafe.Pointer(unsafe.SliceData(x)))
	py := uintptr(unsafe.Pointer(unsafe.SliceData(y)))
	return px != py && px < py+uintptr(len(y)) && py < px+uintptr(len(x))
}

// aligned reports whether every buffer starts at a multiple of align, the
// condition for viewing it as a typed slice: Go requires typed pointers to be
// aligned (checkptr only verifies this for pointerful types, so nothing would
// catch a mistake here on amd64), and some architectures fault otherwise.
func aligned(align uintptr, bufs ...[]byte) bool {
	for _, b := range bufs {
		if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%align != 0 {
			return false
		}
	}
	return true
}

// view reinterprets an aligned buffer as a typed slice sharing its memory.
func view[T native](b []byte) []T {
	var zero T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(zero)))
}

// portable32 handles 4-byte elements that are misaligned or on a big-endian
// host: it decodes a chunk into aligned stack words, runs the typed kernel on
// them in place, and encodes the result.
func portable32[T float32 | int32](op Op, d, a, b []byte) {
	var wa, wb [chunk]uint32
	ta := unsafe.Slice((*T)(unsafe.Pointer(&wa[0])), chunk)
	tb := unsafe.Slice((*T)(unsafe.Pointer(&wb[0])), chunk)
	for len(d) > 0 {
		n := min(len(d)/4, chunk)
		for i := range n {
			wa[i] = binary.LittleEndian.Uint32(a[4*i:])
			wb[i] = binary.LittleEndian.Uint32(b[4*i:])
		}
		applyTo(op, ta[:n], ta[:n], tb[:n])
		for i := range n {
			binary.LittleEndian.PutUint32(d[4*i:], wa[i])
		}
		d, a, b = d[4*n:], a[4*n:], b[4*n:]
	}
}

// portable64 is portable32 for 8-byte elements.
func portable64[T float64 | int64](op Op, d, a, b []byte) {
	var wa, wb [chunk]uint64
	ta := unsafe.Slice((*T)(unsafe.Pointer(&wa[0])), chunk)
	tb := unsafe.Slice((*T)(unsafe.Pointer(&wb[0])), chunk)
	for len(d) > 0 {
		n := min(len(d)/8, chunk)
		for i := range n {
			wa[i] = binary.LittleEndian.Uint64(a[8*i:])
			wb[i] = binary.LittleEndian.Uint64(b[8*i:])
		}
		applyTo(op, ta[:n], ta[:n], tb[:n])
		for i := range n {
			binary.LittleEndian.PutUint64(d[8*i:], wa[i])
		}
		d, a, b = d[8*n:], a[8*n:], b[8*n:]
	}
}

// halfTo reduces bfloat16 or float16 elements: widen both operands to
// float32, combine, round back. Loads and stores go through encoding/binary,
// which compiles to plain unaligned moves, so alignment and host byte order do
// not matter. The switch on op inside the loop (in combine) is perfectly
// predicted and cheap next to the conversions around it.
func halfTo(dt DType, op Op, d, a, b []byte) {
	a, b = a[:len(d)], b[:len(d)]
	if dt == BFloat16 {
		// Four lanes per 64-bit load and store: about 15% faster than one
		// 16-bit move per element.
		for len(d) >= 8 {
			x, y := binary.LittleEndian.Uint64(a), binary.LittleEndian.Uint64(b)
			// Spelled out: a helper for one pair would exceed the inlining
			// budget, and the call would cost more than the lane split saves.
			r0 := F32ToBF16(combine(op, BF16ToF32(uint16(x)), BF16ToF32(uint16(y))))
			r1 := F32ToBF16(combine(op, BF16ToF32(uint16(x>>16)), BF16ToF32(uint16(y>>16))))
			r2 := F32ToBF16(combine(op, BF16ToF32(uint16(x>>32)), BF16ToF32(uint16(y>>32))))
			r3 := F32ToBF16(combine(op, BF16ToF32(uint16(x>>48)), BF16ToF32(uint16(y>>48))))
			r := uint64(r0) | uint64(r1)<<16 | uint64(r2)<<32 | uint64(r3)<<48
			binary.LittleEndian.PutUint64(d, r)
			a, b, d = a[8:], b[8:], d[8:]
		}
		for i := 0; i+2 <= len(d); i += 2 {
			x, y := BF16ToF32(binary.LittleEndian.Uint16(a[i:])), BF16ToF32(binary.LittleEndian.Uint16(b[i:]))
			binary.LittleEndian.PutUint16(d[i:], F32ToBF16(combine(op, x, y)))
		}
		return
	}
	for i := 0; i+2 <= len(d); i += 2 {
		x, y := F16ToF32(binary.LittleEndian.Uint16(a[i:])), F16ToF32(binary.LittleEndian.Uint16(b[i:]))
		// F32ToF16 is too large to inline; its common case is, so spell out
		// the split here.
		r := math.Float32bits(combine(op, x, y))
		var h uint16
		if f16Normal(r) {
			h = f32ToF16Normal(r)
		} else {
			h = f32ToF16Edge(r)
		}
		binary.LittleEndian.PutUint16(d[i:], h)
	}
}

// combine applies op to one pair of widened half-precision elements.
func combine(op Op, x, y float32) float32 {
	switch op {
	case Prod:
		return x * y
	case Max:
		return max(x, y)
	case Min:
		return min(x, y)
	}
	return x + y
}

// sumBytes adds uint8 elements modulo 256 eight lanes at a time in a uint64
// (SWAR): add the low seven bits of every lane, which cannot carry across
// lanes, then fix each top bit with an xor. Byte order is irrelevant since the
// load and the store use the same one.
func sumBytes(d, a, b []byte) {
	const lo7 = 0x7f7f7f7f7f7f7f7f
	const hi = 0x8080808080808080
	a, b = a[:len(d)], b[:len(d)]
	for len(d) >= 8 {
		x, y := binary.LittleEndian.Uint64(a), binary.LittleEndian.Uint64(b)
		binary.LittleEndian.PutUint64(d, (x&lo7)+(y&lo7)^((x^y)&hi))
		a, b, d = a[8:], b[8:], d[8:]
	}
	for i := range d {
		d[i] = a[i] + b[i]
	}
}
