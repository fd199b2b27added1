package reduce

import (
	"fmt"
	"math"
)

// FP8 E4M3 (OCP's e4m3fn) is the wire format of MoE dispatch rows, as DeepEP
// sends them: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits, no
// infinities, a single NaN pattern per sign (S.1111.111), largest finite
// ±448, smallest normal 2^-6, subnormals in steps of 2^-9. A row travels as
// its FP8 bytes plus one float32 scale per block of elements, so that each
// block uses the whole FP8 range: scale = amax/448.
const (
	// E4M3Max is the largest finite E4M3 value.
	E4M3Max = 448
	// E4M3Block is the block of elements that shares one scale, DeepEP's 128.
	E4M3Block = 128

	e4m3MaxBits = 0x7e // S.1111.110 = 448
	e4m3NaN     = 0x7f
)

// e4m3Table is every E4M3 byte widened to float32: decoding is one load.
var e4m3Table = func() (t [256]float32) {
	for b := range t {
		t[b] = e4m3Decode(uint8(b))
	}
	return t
}()

// e4m3Decode widens one E4M3 byte (the table's source of truth).
func e4m3Decode(b uint8) float32 {
	sign := float32(1)
	if b&0x80 != 0 {
		sign = -1
	}
	exp, mant := int(b>>3)&0xf, float32(b&7)
	switch {
	case b&0x7f == e4m3NaN:
		return float32(math.NaN())
	case exp == 0:
		return sign * mant * (1.0 / 512) // subnormal: mant * 2^-9
	default:
		return sign * (1 + mant/8) * float32(math.Ldexp(1, exp-7))
	}
}

// E4M3ToF32 widens an E4M3 byte to float32 (exact).
func E4M3ToF32(b uint8) float32 { return e4m3Table[b] }

// F32ToE4M3 rounds a float32 to the nearest E4M3, ties to even, saturating
// at ±448 (e4m3fn has no infinity, and a scaled block never exceeds its
// range by more than a rounding step). NaN becomes the E4M3 NaN.
func F32ToE4M3(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b>>24) & 0x80
	a := b & 0x7fffffff
	if a < 0x3c800000 {
		// Below 2^-6, the smallest normal: a multiple of the subnormal step
		// 2^-9. Adding 2^23 to f*2^9 (exact) leaves the rounded multiple,
		// ties to even, in the low mantissa bits; 8 is 2^-6's encoding.
		return sign | uint8(math.Float32bits(math.Float32frombits(a)*512+0x1p23)-0x4b000000)
	}
	if a >= 0x43e00000 { // 448 and above, Inf included
		if a > 0x7f800000 {
			return sign | e4m3NaN
		}
		return sign | e4m3MaxBits
	}
	// Normal: keep 3 of the 23 mantissa bits, rounding the 20 dropped ones
	// to nearest, ties to even (the bfloat16 trick: add just under half,
	// plus the kept lsb); a carry bumps the exponent, which is right. Then
	// rebias the exponent from 127 to 7 (120 << 3 in the shifted word).
	q := (a+0x7ffff+(a>>20)&1)>>20 - 120<<3
	return sign | uint8(min(q, e4m3MaxBits))
}

// QuantizeE4M3 encodes src into dst as E4M3, one scale per E4M3Block
// elements written to scales (the last block may be shorter): each block is
// divided by its scale, amax/448, so its largest magnitude maps to 448. A
// block of zeros gets scale 0 and zero bytes. len(dst) must be len(src) and
// len(scales) the number of blocks; a non-finite element (Inf, NaN) is
// ErrInvalidArgument, naming its index, and leaves dst undefined. On amd64
// with AVX2 it runs vector kernels whose bytes and scales are those of the
// portable code, bit for bit.
func QuantizeE4M3(dst []uint8, scales []float32, src []float32) error {
	return quantizeE4M3(dst, scales, src, useAVX2)
}

// quantizeE4M3 is QuantizeE4M3, with the vector kernels if vec (tests run
// both paths by passing false and useAVX2).
func quantizeE4M3(dst []uint8, scales []float32, src []float32, vec bool) error {
	if err := checkE4M3(len(dst), len(scales), len(src)); err != nil {
		return err
	}
	for blk := range scales {
		lo := blk * E4M3Block
		hi := min(lo+E4M3Block, len(src))
		amax, err := blockAmax(src[lo:hi], lo, vec)
		if err != nil {
			return err
		}
		scales[blk] = quantizeBlock(dst[lo:hi], src[lo:hi], amax, vec)
	}
	return nil
}

// QuantizeE4M3BF16 is QuantizeE4M3 for a bfloat16 source (the dtype MoE
// activations usually have), widened on the fly.
func QuantizeE4M3BF16(dst []uint8, scales []float32, src []uint16) error {
	return quantizeE4M3BF16(dst, scales, src, useAVX2)
}

// quantizeE4M3BF16 is QuantizeE4M3BF16, with the vector kernels if vec.
func quantizeE4M3BF16(dst []uint8, scales []float32, src []uint16, vec bool) error {
	if err := checkE4M3(len(dst), len(scales), len(src)); err != nil {
		return err
	}
	var wide [E4M3Block]float32
	for blk := range scales {
		lo := blk * E4M3Block
		hi := min(lo+E4M3Block, len(src))
		w := wide[:hi-lo]
		i := 0
		if vec {
			i = widenVec(w, src[lo:hi])
		}
		for ; i < len(w); i++ {
			w[i] = BF16ToF32(src[lo+i])
		}
		amax, err := blockAmax(w, lo, vec)
		if err != nil {
			return err
		}
		scales[blk] = quantizeBlock(dst[lo:hi], w, amax, vec)
	}
	return nil
}

// DequantizeE4M3 widens src, quantized with scales, back into dst (float32).
func DequantizeE4M3(dst []float32, src []uint8, scales []float32) error {
	return dequantizeE4M3(dst, src, scales, useAVX2)
}

// dequantizeE4M3 is DequantizeE4M3, with the vector kernels if vec.
func dequantizeE4M3(dst []float32, src []uint8, scales []float32, vec bool) error {
	if err := checkE4M3(len(src), len(scales), len(dst)); err != nil {
		return err
	}
	for blk, s := range scales {
		lo := blk * E4M3Block
		hi := min(lo+E4M3Block, len(dst))
		d, q := dst[lo:hi], src[lo:hi]
		i := 0
		if vec {
			i = dequantizeVec(d, q, s)
		}
		for ; i < len(d); i++ {
			d[i] = e4m3Table[q[i]] * s
		}
	}
	return nil
}

// DequantizeE4M3BF16 is DequantizeE4M3 into bfloat16, rounded to nearest.
func DequantizeE4M3BF16(dst []uint16, src []uint8, scales []float32) error {
	return dequantizeE4M3BF16(dst, src, scales, useAVX2)
}

// dequantizeE4M3BF16 is DequantizeE4M3BF16, with the vector kernels if vec.
func dequantizeE4M3BF16(dst []uint16, src []uint8, scales []float32, vec bool) error {
	if err := checkE4M3(len(src), len(scales), len(dst)); err != nil {
		return err
	}
	for blk, s := range scales {
		lo := blk * E4M3Block
		hi := min(lo+E4M3Block, len(dst))
		d, q := dst[lo:hi], src[lo:hi]
		i := 0
		if vec {
			i = dequantizeBF16Vec(d, q, s)
		}
		for ; i < len(d); i++ {
			d[i] = F32ToBF16(e4m3Table[q[i]] * s)
		}
	}
	return nil
}

// E4M3Scales is the number of scales a row of n elements carries.
func E4M3Scales(n int) int { return (n + E4M3Block - 1) / E4M3Block }

// checkE4M3 checks that n8 FP8 bytes and nScales scales fit n elements.
func checkE4M3(n8, nScales, n int) error {
	if n8 != n || nScales != E4M3Scales(n) {
		return fmt.Errorf("%w: FP8 E4M3 of %d elements needs %d bytes and %d scales, got %d and %d",
			ErrInvalidArgument, n, n, E4M3Scales(n), n8, nScales)
	}
	return nil
}

// blockAmax returns the largest magnitude of a block whose first element is
// element first of the row, or an error naming a non-finite one. It compares
// bit patterns: for non-negative floats their order is the integers' order,
// and Inf and NaN lie above every finite pattern, so one check after the
// loop finds them, and the loop has no branch. With vec, the vector kernel
// takes all but the last len(x)%8 elements.
func blockAmax(x []float32, first int, vec bool) (float32, error) {
	var amax uint32
	i := 0
	if vec {
		amax, i = amaxVec(x)
	}
	for _, v := range x[i:] {
		amax = max(amax, math.Float32bits(v)&0x7fffffff)
	}
	if amax >= 0x7f800000 {
		for i, v := range x {
			if math.Float32bits(v)&0x7fffffff >= 0x7f800000 {
				return 0, fmt.Errorf("%w: element %d is %v: FP8 rows must be finite", ErrInvalidArgument, first+i, v)
			}
		}
	}
	return math.Float32frombits(amax), nil
}

// quantizeBlock encodes x scaled so that amax maps to 448, and returns the
// scale, amax/448 (0 for a block of zeros, whose bytes are all zero).
func quantizeBlock(dst []uint8, x []float32, amax float32, vec bool) float32 {
	if amax == 0 {
		clear(dst)
		return 0
	}
	quantizeScaled(dst, x, E4M3Max/amax, vec)
	return amax / E4M3Max
}

// quantizeScaled encodes x[i]*inv into dst[i], x being finite. The vector
// kernel leaves NaN out of its rounding, so it does not take an infinite inv
// (amax a tiny subnormal), for which 0*inv is NaN: the portable loop does.
func quantizeScaled(dst []uint8, x []float32, inv float32, vec bool) {
	i := 0
	if vec && inv <= math.MaxFloat32 {
		i = quantizeVec(dst, x, inv)
	}
	for ; i < len(x); i++ {
		dst[i] = F32ToE4M3(x[i] * inv)
	}
}
