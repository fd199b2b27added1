package reduce

import (
	"math"
	"math/rand/v2"
	"testing"
)

// refDecode widens a 16-bit float of format f by arithmetic (math.Ldexp),
// independently of the bit manipulation in half.go.
func refDecode(h uint16, f halfFormat) float64 {
	bias := 1<<(f.expBits-1) - 1
	exp := int(h>>f.manBits) & (1<<f.expBits - 1)
	man := float64(h & (1<<f.manBits - 1))
	var v float64
	switch exp {
	case 1<<f.expBits - 1:
		if man != 0 {
			v = math.NaN()
		} else {
			v = math.Inf(1)
		}
	case 0:
		v = math.Ldexp(man, 1-bias-f.manBits)
	default:
		v = math.Ldexp(man+float64(int(1)<<f.manBits), exp-bias-f.manBits)
	}
	if h&0x8000 != 0 {
		v = -v
	}
	return v
}

type halfConv struct {
	name   string
	format halfFormat
	toF32  func(uint16) float32
	fromF  func(float32) uint16
}

var halfConvs = []halfConv{
	{"bfloat16", bf16Format, BF16ToF32, F32ToBF16},
	{"float16", f16Format, F16ToF32, F32ToF16},
}

func isNaN16(h uint16, f halfFormat) bool {
	expMask := uint16(1<<f.expBits-1) << f.manBits
	return h&expMask == expMask && h&(1<<f.manBits-1) != 0
}

// TestHalfRoundTripExhaustive widens every one of the 65536 encodings, checks
// the value against refDecode, and checks that narrowing returns the same
// encoding. NaNs must stay NaN with their sign; this implementation also keeps
// their payload, which is checked too.
func TestHalfRoundTripExhaustive(t *testing.T) {
	for _, c := range halfConvs {
		t.Run(c.name, func(t *testing.T) {
			for i := range 1 << 16 {
				h := uint16(i)
				f := c.toF32(h)
				want := refDecode(h, c.format)
				if isNaN16(h, c.format) {
					if !math.IsNaN(float64(f)) || math.Signbit(float64(f)) != (h&0x8000 != 0) {
						t.Fatalf("%#04x: widened to %v, want NaN with the same sign", h, f)
					}
				} else if math.Float64bits(float64(f)) != math.Float64bits(want) {
					t.Fatalf("%#04x: widened to %v, want %v", h, f, want)
				}
				if back := c.fromF(f); back != h {
					t.Fatalf("%#04x -> %v -> %#04x: round trip not identity", h, f, back)
				}
			}
		})
	}
}

// TestHalfRoundingExhaustive narrows, for every finite encoding h, the float32
// values at and one float32 ulp either side of the midpoint to the next
// encoding away from zero (ties to even decide the midpoint), plus h itself
// and its float32 neighbours, and compares with refRound.
func TestHalfRoundingExhaustive(t *testing.T) {
	for _, c := range halfConvs {
		t.Run(c.name, func(t *testing.T) {
			for i := range 1 << 16 {
				h := uint16(i)
				if isNaN16(h, c.format) || math.IsInf(refDecode(h, c.format), 0) {
					continue
				}
				v := refDecode(h, c.format)
				next := refDecode(h+1, c.format) // next magnitude, may be Inf
				if math.IsInf(next, 0) {
					// Rounding overflows where the next binade's first value
					// would be, so the midpoint is v + ulp(v)/2.
					next = v + (v - refDecode(h-1, c.format))
				}
				mid := float32((v + next) / 2) // exact: needs one more bit than the format
				if float64(mid) != (v+next)/2 {
					t.Fatalf("%#04x: midpoint %v not exact in float32", h, (v+next)/2)
				}
				fv := float32(v)
				for _, x := range []float32{
					fv, math.Nextafter32(fv, 0), math.Nextafter32(fv, float32(math.Inf(1))),
					mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, float32(math.Inf(1))),
					math.Nextafter32(mid, float32(math.Inf(-1))),
				} {
					if got, want := c.fromF(x), refRound(float64(x), c.format); got != want {
						t.Fatalf("%v (%#08x): got %#04x, want %#04x", x, math.Float32bits(x), got, want)
					}
				}
			}
		})
	}
}

// TestHalfNarrowingRandom compares narrowing of random float32 bit patterns
// (every class: NaN, Inf, normals, subnormals, zeros) with refRound.
func TestHalfNarrowingRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, c := range halfConvs {
		t.Run(c.name, func(t *testing.T) {
			for range 1 << 20 {
				bits := rng.Uint32()
				if rng.IntN(2) == 0 {
					// Concentrate half the draws on the exponents near the
					// format's range, where rounding decisions happen.
					bits = bits&0x80ffffff | uint32(100+rng.IntN(60))<<23
				}
				x := math.Float32frombits(bits)
				got, want := c.fromF(x), refRound(float64(x), c.format)
				if math.IsNaN(float64(x)) {
					if !isNaN16(got, c.format) || got&0x8000 != want&0x8000 {
						t.Fatalf("%#08x: got %#04x, want a NaN with the same sign", bits, got)
					}
					continue
				}
				if got != want {
					t.Fatalf("%v (%#08x): got %#04x, want %#04x", x, bits, got, want)
				}
			}
		})
	}
}

func TestHalfNarrowingCases(t *testing.T) {
	cases := []struct {
		name string
		conv func(float32) uint16
		in   float32
		want uint16
	}{
		{"f16 max", F32ToF16, 65504, 0x7bff},
		{"f16 below overflow tie", F32ToF16, math.Nextafter32(65520, 0), 0x7bff},
		{"f16 overflow tie", F32ToF16, 65520, 0x7c00},
		{"f16 large", F32ToF16, 1e10, 0x7c00},
		{"f16 -large", F32ToF16, -1e10, 0xfc00},
		{"f16 min subnormal", F32ToF16, 0x1p-24, 0x0001},
		{"f16 half min subnormal ties to 0", F32ToF16, 0x1p-25, 0x0000},
		{"f16 above half min subnormal", F32ToF16, math.Nextafter32(0x1p-25, 1), 0x0001},
		{"f16 1.5 quanta ties to 2", F32ToF16, 3 * 0x1p-25, 0x0002},
		{"f16 negative subnormal", F32ToF16, -0x1p-24, 0x8001},
		{"f16 float32 subnormal", F32ToF16, 1e-45, 0x0000},
		{"f16 -0", F32ToF16, float32(math.Copysign(0, -1)), 0x8000},
		{"f16 largest subnormal to min normal", F32ToF16, 0x1p-14 - 0x1p-26, 0x0400},
		{"f16 NaN", F32ToF16, float32(math.NaN()), 0x7e00},
		{"f16 NaN low payload only", F32ToF16, math.Float32frombits(0x7f800001), 0x7e00},
		{"f16 -NaN", F32ToF16, math.Float32frombits(0xffc00000), 0xfe00},
		{"f16 1+2^-11 ties to even 1", F32ToF16, 1 + 0x1p-11, 0x3c00},
		{"f16 1+3*2^-11 ties to even", F32ToF16, 1 + 3*0x1p-11, 0x3c02},
		{"bf16 257 ties to 256", F32ToBF16, 257, 0x4380},
		{"bf16 259 ties to 260", F32ToBF16, 259, 0x4382},
		{"bf16 overflow", F32ToBF16, math.MaxFloat32, 0x7f80},
		{"bf16 -overflow", F32ToBF16, -math.MaxFloat32, 0xff80},
		{"bf16 NaN low payload only", F32ToBF16, math.Float32frombits(0x7f800001), 0x7fc0},
		{"bf16 -NaN", F32ToBF16, math.Float32frombits(0xffc00000), 0xffc0},
		{"bf16 subnormal", F32ToBF16, math.Float32frombits(0x00018000), 0x0002},
	}
	for _, c := range cases {
		if got := c.conv(c.in); got != c.want {
			t.Errorf("%s: %v -> %#04x, want %#04x", c.name, c.in, got, c.want)
		}
	}
}
