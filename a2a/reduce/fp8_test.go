package reduce

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// e4m3Nearest is the reference rounding: the finite E4M3 value nearest to f
// by brute force, ties to the even encoding, saturating beyond ±448.
func e4m3Nearest(f float32) uint8 {
	best, bestErr := uint8(0), math.Inf(1)
	for b := 0; b < 256; b++ {
		if b&0x7f == e4m3NaN {
			continue
		}
		v := float64(e4m3Decode(uint8(b)))
		if (v < 0) != (f < 0) && v != 0 {
			continue
		}
		d := math.Abs(v - float64(f))
		if d < bestErr || d == bestErr && b&1 == 0 && best&1 == 1 {
			best, bestErr = uint8(b), d
		}
	}
	if math.Signbit(float64(f)) {
		best |= 0x80
	} else {
		best &^= 0x80
	}
	return best
}

func TestE4M3RoundTrip(t *testing.T) {
	for b := 0; b < 256; b++ {
		if b&0x7f == e4m3NaN {
			if got := F32ToE4M3(E4M3ToF32(uint8(b))); got&0x7f != e4m3NaN {
				t.Errorf("NaN %#02x came back as %#02x", b, got)
			}
			continue
		}
		if got := F32ToE4M3(E4M3ToF32(uint8(b))); got != uint8(b) {
			t.Errorf("%#02x = %v came back as %#02x", b, E4M3ToF32(uint8(b)), got)
		}
	}
	for _, tc := range []struct {
		f    float32
		want float32
	}{
		{448, 448}, {1e9, 448}, {float32(math.Inf(-1)), -448}, {-500, -448},
		{2.0 / 512, 2.0 / 512}, {1.0 / 1024, 0}, {3.0 / 1024, 2.0 / 512}, // ties to even among subnormals
		{1, 1}, {1.0625, 1}, {1.1875, 1.25}, // 1+1/16 ties down to 1.0, 1+3/16 up to 1.25
	} {
		if got := E4M3ToF32(F32ToE4M3(tc.f)); got != tc.want {
			t.Errorf("E4M3(%v) = %v, want %v", tc.f, got, tc.want)
		}
	}
}

// TestE4M3Rounding compares the bit-twiddling rounding with the brute-force
// reference over random magnitudes spanning the whole range, subnormals and
// the midpoints between neighbours included.
func TestE4M3Rounding(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var fs []float32
	for i := 0; i < 200000; i++ {
		var f float32
		switch i % 3 {
		case 0: // log-uniform over the range and beyond
			f = float32(math.Ldexp(1+rng.Float64(), rng.IntN(22)-12))
		case 1: // exact midpoints
			b := uint8(rng.IntN(0x7e))
			f = (E4M3ToF32(b) + E4M3ToF32(b+1)) / 2
		default:
			f = float32(rng.NormFloat64() * 8)
		}
		if rng.IntN(2) == 0 {
			f = -f
		}
		if got, want := F32ToE4M3(f), e4m3Nearest(f); got != want {
			t.Fatalf("F32ToE4M3(%v) = %#02x (%v), want %#02x (%v)", f, got, E4M3ToF32(got), want, E4M3ToF32(want))
		}
		fs = append(fs, f)
	}
	// The same values through each path's block kernel, scale 1.
	for _, p := range fp8Paths(t) {
		q := make([]uint8, len(fs))
		quantizeScaled(q, fs, 1, p.vec)
		for i, f := range fs {
			if want := e4m3Nearest(f); q[i] != want {
				t.Fatalf("%s: %v encoded as %#02x (%v), want %#02x (%v)", p.name, f, q[i], E4M3ToF32(q[i]), want, E4M3ToF32(want))
			}
		}
	}
}

// TestQuantizeE4M3Bound: every element of a quantized row comes back within
// |x|/16 plus half the smallest subnormal step of its block (scale * 2^-10),
// from float32 and from bfloat16 rows, for rows of every scale.
func TestQuantizeE4M3Bound(t *testing.T) {
	for _, p := range fp8Paths(t) {
		t.Run(p.name, func(t *testing.T) { testQuantizeE4M3Bound(t, p.vec) })
	}
}

func testQuantizeE4M3Bound(t *testing.T, vec bool) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 127, 128, 129, 7168} {
		for _, mag := range []float64{1e-6, 1, 3e4} {
			src := make([]float32, n)
			bf := make([]uint16, n)
			for i := range src {
				bf[i] = F32ToBF16(float32(rng.NormFloat64() * mag))
				src[i] = BF16ToF32(bf[i])
			}
			q, scales, back := make([]uint8, n), make([]float32, E4M3Scales(n)), make([]float32, n)
			if err := quantizeE4M3(q, scales, src, vec); err != nil {
				t.Fatal(err)
			}
			if err := dequantizeE4M3(back, q, scales, vec); err != nil {
				t.Fatal(err)
			}
			checkBound(t, src, back, scales)
			q2, scales2 := make([]uint8, n), make([]float32, E4M3Scales(n))
			if err := quantizeE4M3BF16(q2, scales2, bf, vec); err != nil {
				t.Fatal(err)
			}
			if string(q2) != string(q) {
				t.Errorf("n=%d: the bfloat16 path encodes differently from the float32 one", n)
			}
			back16 := make([]uint16, n)
			if err := dequantizeE4M3BF16(back16, q2, scales2, vec); err != nil {
				t.Fatal(err)
			}
			for i := range back16 {
				if got, want := BF16ToF32(back16[i]), F32ToBF16(back[i]); back16[i] != want {
					t.Fatalf("n=%d element %d: bfloat16 %v, want %v", n, i, got, BF16ToF32(want))
				}
			}
		}
	}
}

func checkBound(t *testing.T, src, back, scales []float32) {
	t.Helper()
	for i, x := range src {
		s := float64(scales[i/E4M3Block])
		bound := math.Abs(float64(x))/16 + s*math.Ldexp(1, -10)
		if d := math.Abs(float64(back[i]) - float64(x)); d > bound {
			t.Fatalf("element %d: %v came back as %v, off by %g > %g", i, x, back[i], d, bound)
		}
	}
}

func TestQuantizeE4M3Edges(t *testing.T) {
	for _, p := range fp8Paths(t) {
		t.Run(p.name, func(t *testing.T) { testQuantizeE4M3Edges(t, p.vec) })
	}
}

func testQuantizeE4M3Edges(t *testing.T, vec bool) {
	// A block of zeros: scale 0, zero bytes, zeros back.
	src := make([]float32, 200)
	for i := 128; i < 200; i++ {
		src[i] = float32(i)
	}
	q := make([]uint8, 200)
	for i := range q {
		q[i] = 0xff
	}
	scales := make([]float32, 2)
	if err := quantizeE4M3(q, scales, src, vec); err != nil {
		t.Fatal(err)
	}
	if scales[0] != 0 || strings.Trim(string(q[:128]), "\x00") != "" {
		t.Errorf("zero block: scale %v, bytes %v", scales[0], q[:8])
	}
	if scales[1] != 199.0/448 || E4M3ToF32(q[199])*scales[1] != 199 {
		t.Errorf("block 1: scale %v, its largest %v", scales[1], E4M3ToF32(q[199])*scales[1])
	}
	// Non-finite elements and wrong lengths are invalid arguments.
	for _, tc := range []struct {
		name           string
		n8, nScales, n int
		bad            float32
		want           string
	}{
		{"NaN", 130, 2, 130, float32(math.NaN()), "element 129 is NaN"},
		{"Inf", 130, 2, 130, float32(math.Inf(1)), "element 129 is +Inf"},
		{"short bytes", 129, 2, 130, 0, "needs 130 bytes and 2 scales, got 129 and 2"},
		{"scales", 130, 1, 130, 0, "needs 130 bytes and 2 scales, got 130 and 1"},
	} {
		src := make([]float32, tc.n)
		src[tc.n-1] = tc.bad
		err := quantizeE4M3(make([]uint8, tc.n8), make([]float32, tc.nScales), src, vec)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidArgument saying %q", tc.name, err, tc.want)
		}
	}
}

// BenchmarkQuantizeE4M3 times one 7168-wide row through each path:
// portable, and avx2 where the CPU has it.
func BenchmarkQuantizeE4M3(b *testing.B) {
	const n = 7168 // DeepSeek-V3's hidden size
	rng := rand.New(rand.NewPCG(5, 6))
	src, bf := make([]float32, n), make([]uint16, n)
	for i := range src {
		src[i] = float32(rng.NormFloat64())
		bf[i] = F32ToBF16(src[i])
	}
	q, scales, back, back16 := make([]uint8, n), make([]float32, E4M3Scales(n)), make([]float32, n), make([]uint16, n)
	paths := []fp8Path{{"portable", false}}
	if useAVX2 {
		paths = append(paths, fp8Path{"avx2", true})
	}
	for _, p := range paths {
		b.Run("float32/"+p.name, func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				quantizeE4M3(q, scales, src, p.vec)
			}
		})
		b.Run("bfloat16/"+p.name, func(b *testing.B) {
			b.SetBytes(2 * n)
			for b.Loop() {
				quantizeE4M3BF16(q, scales, bf, p.vec)
			}
		})
		b.Run("dequantize/"+p.name, func(b *testing.B) {
			b.SetBytes(n)
			for b.Loop() {
				dequantizeE4M3(back, q, scales, p.vec)
			}
		})
		b.Run("dequantizeBF16/"+p.name, func(b *testing.B) {
			b.SetBytes(n)
			for b.Loop() {
				dequantizeE4M3BF16(back16, q, scales, p.vec)
			}
		})
	}
}
