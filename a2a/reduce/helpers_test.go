package reduce

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
)

// randomBuf returns size bytes of finite, moderately sized elements of dt
// (size rounded down to whole elements is the caller's business).
func randomBuf(rng *rand.Rand, dt DType, size int) []byte {
	return randomBufS(rng, dt, size, false)
}

// randomBufS is randomBuf with special values mixed in when withSpecials is set.
func randomBufS(rng *rand.Rand, dt DType, size int, withSpecials bool) []byte {
	b := make([]byte, size)
	es := max(dt.Size(), 1)
	for i := 0; i+es <= size; i += es {
		putElem(dt, b[i:], randomElemS(rng, dt, withSpecials))
	}
	return b
}

// elem is a decoded element: floats (bf16/f16 widened exactly) in f, integers in i.
type elem struct {
	f float64
	i int64
}

// specials are float inputs mixed into random data so every kernel meets
// zeros of both signs, infinities, NaN, values that become float16 subnormals
// and values whose sums or products overflow float16.
var specials = []float64{0, math.Copysign(0, -1), math.Inf(1), math.Inf(-1), math.NaN(), 1e-6, -3e-7, 6e4, -6e4, 1e-40}

// randomElem draws an element of dt: mostly moderate values (products of two
// stay within float16 range), with one float in eight drawn from specials when
// withSpecials is set.
func randomElem(rng *rand.Rand, dt DType) elem { return randomElemS(rng, dt, false) }

func randomElemS(rng *rand.Rand, dt DType, withSpecials bool) elem {
	switch dt {
	case Float32, Float64, BFloat16, Float16:
		if withSpecials && rng.IntN(8) == 0 {
			return elem{f: specials[rng.IntN(len(specials))]}
		}
		return elem{f: (rng.Float64()*2 - 1) * 200}
	case Int32:
		if withSpecials && rng.IntN(8) == 0 {
			return elem{i: []int64{math.MaxInt32, math.MinInt32, -1, 0}[rng.IntN(4)]}
		}
		return elem{i: int64(int32(rng.Uint32()))}
	case Int64:
		return elem{i: int64(rng.Uint64())}
	default:
		return elem{i: int64(uint8(rng.Uint32()))}
	}
}

func getElem(dt DType, b []byte) elem {
	switch dt {
	case Float32:
		return elem{f: float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))}
	case Float64:
		return elem{f: math.Float64frombits(binary.LittleEndian.Uint64(b))}
	case BFloat16:
		return elem{f: float64(BF16ToF32(binary.LittleEndian.Uint16(b)))}
	case Float16:
		return elem{f: float64(F16ToF32(binary.LittleEndian.Uint16(b)))}
	case Int32:
		return elem{i: int64(int32(binary.LittleEndian.Uint32(b)))}
	case Int64:
		return elem{i: int64(binary.LittleEndian.Uint64(b))}
	default:
		return elem{i: int64(b[0])}
	}
}

// putElem encodes e, rounding floats with the independent reference rounding
// (refRound) rather than the conversions under test.
func putElem(dt DType, b []byte, e elem) {
	switch dt {
	case Float32:
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(e.f)))
	case Float64:
		binary.LittleEndian.PutUint64(b, math.Float64bits(e.f))
	case BFloat16:
		binary.LittleEndian.PutUint16(b, refRound(e.f, bf16Format))
	case Float16:
		binary.LittleEndian.PutUint16(b, refRound(e.f, f16Format))
	case Int32:
		binary.LittleEndian.PutUint32(b, uint32(e.i))
	case Int64:
		binary.LittleEndian.PutUint64(b, uint64(e.i))
	default:
		b[0] = uint8(e.i)
	}
}

// halfFormat describes a 16-bit binary float: manBits explicit mantissa bits,
// expBits exponent bits.
type halfFormat struct{ manBits, expBits int }

var (
	bf16Format = halfFormat{7, 8}
	f16Format  = halfFormat{10, 5}
)

// refRound rounds x to the nearest value of format f, ties to even, using
// float64 arithmetic only (math.RoundToEven on a scaled value), as an oracle
// independent of the bit tricks in half.go. x must be a value with at most a
// float32's precision or a float64 result that the caller accepts rounding from
// float64 (the double rounding is innocuous for sums and products of two
// float32 values). NaN maps to the canonical quiet NaN.
func refRound(x float64, f halfFormat) uint16 {
	bias := 1<<(f.expBits-1) - 1
	infBits := uint16((1<<f.expBits - 1) << f.manBits)
	var sign uint16
	if math.Signbit(x) {
		sign = 0x8000
		x = -x
	}
	switch {
	case math.IsNaN(x):
		return sign | infBits | 1<<(f.manBits-1)
	case math.IsInf(x, 0):
		return sign | infBits
	case x == 0:
		return sign
	}
	_, e := math.Frexp(x) // x = m*2^e, m in [0.5,1)
	exp := e - 1          // x = 1.xxx * 2^exp
	minExp := 1 - bias
	if exp < minExp {
		exp = minExp // subnormal: fixed quantum 2^(minExp-manBits)
	}
	q := math.RoundToEven(math.Ldexp(x, f.manBits-exp)) // integer significand
	if q >= float64(int(1)<<(f.manBits+1)) {            // rounding carried up a binade
		q /= 2
		exp++
	}
	if exp > bias {
		return sign | infBits
	}
	if q < float64(int(1)<<f.manBits) { // subnormal (or rounded to zero)
		return sign | uint16(q)
	}
	return sign | uint16(exp+bias)<<f.manBits | uint16(q)&(1<<f.manBits-1)
}

// negated returns a copy of buf with every element negated (integers wrap).
func negated(dt DType, buf []byte) []byte {
	out := make([]byte, len(buf))
	es := dt.Size()
	for i := 0; i+es <= len(buf); i += es {
		e := getElem(dt, buf[i:])
		putElem(dt, out[i:], elem{f: -e.f, i: -e.i})
	}
	return out
}
