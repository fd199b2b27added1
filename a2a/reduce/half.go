package reduce

import "math"

// BF16ToF32 widens a bfloat16 to float32. It is exact: a bfloat16 is the top
// half of a float32.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 rounds a float32 to the nearest bfloat16, ties to even. Values
// beyond the largest finite bfloat16 become ±Inf, and NaN stays NaN with its
// sign and the top seven payload bits (the quiet bit is set if truncation would
// otherwise leave an all-zero payload, which would read as Inf).
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		h := uint16(b >> 16)
		if h&0x7f == 0 {
			h |= 0x40
		}
		return h
	}
	// Adding 0x7fff plus the lsb of the kept half rounds to nearest with ties to
	// even; a carry out of the mantissa correctly bumps the exponent, up to Inf.
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// F16ToF32 widens an IEEE binary16 to float32. It is exact, including
// subnormals, ±Inf and NaN (the payload is kept).
func F16ToF32(h uint16) float32 {
	// Move exponent and mantissa into float32 position and rebias the exponent
	// (the technique of F. Giesen's half_to_float); Inf/NaN need the exponent
	// pushed to all ones, and subnormals are renormalised exactly by one float
	// subtraction of normal numbers.
	const shiftedExp = 0x7c00 << 13
	o := uint32(h&0x7fff) << 13
	exp := o & shiftedExp
	o += (127 - 15) << 23
	switch exp {
	case shiftedExp:
		o += (128 - 16) << 23
	case 0:
		o += 1 << 23
		o = math.Float32bits(math.Float32frombits(o) - 0x1p-14)
	}
	return math.Float32frombits(o | uint32(h&0x8000)<<16)
}

// F32ToF16 rounds a float32 to the nearest IEEE binary16, ties to even. Values
// beyond the largest finite half (65504, after rounding) become ±Inf, results
// below the normal range are correctly rounded subnormals (or ±0), and NaN stays
// NaN with its sign and the top ten payload bits (quiet bit set if those are 0).
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	if f16Normal(b) {
		return f32ToF16Normal(b)
	}
	return f32ToF16Edge(b)
}

// f16Normal reports whether float32 bits b have a magnitude in [2^-14, 2^16),
// the range f32ToF16Normal handles; one unsigned comparison tests both ends.
// The split keeps the common case inlinable in the reduction loops.
func f16Normal(b uint32) bool {
	return b&0x7fffffff-0x38800000 < 0x47800000-0x38800000
}

// f32ToF16Normal converts float32 bits for which f16Normal holds: rebias, then
// round to nearest-even on the 13 dropped bits. A carry out of the mantissa
// bumps the exponent, up to Inf for magnitudes >= 65520.
func f32ToF16Normal(b uint32) uint16 {
	a := b & 0x7fffffff
	a = a - (127-15)<<23 + 0xfff + (a>>13)&1
	return uint16(b>>16)&0x8000 | uint16(a>>13)
}

// f32ToF16Edge converts the float32 (given as bits) whose magnitude is below
// the smallest normal half (2^-14) or at least 2^16.
//
//go:noinline
func f32ToF16Edge(b uint32) uint16 {
	sign := uint16(b>>16) & 0x8000
	a := b & 0x7fffffff
	switch {
	case a < 0x38800000:
		// Adding 0.5 puts the half's subnormal quantum 2^-24 at the last bit of
		// the float32 mantissa, so the FPU rounds to nearest-even for us; a
		// result of 2^-14 yields 0x400, the smallest normal's encoding.
		const magic = 0.5
		return sign | uint16(math.Float32bits(math.Float32frombits(a)+magic)-math.Float32bits(magic))
	case a <= 0x7f800000:
		return sign | 0x7c00
	}
	m := uint16(a>>13) & 0x3ff
	if m == 0 {
		m = 0x200
	}
	return sign | 0x7c00 | m
}
