package reduce

import (
	"math"
	"math/rand/v2"
	"testing"
)

// fp8Path names one implementation of the FP8 kernels: portable Go, or the
// vector kernels (AVX2 on amd64), which must agree with it bit for bit.
type fp8Path struct {
	name string
	vec  bool
}

// fp8Paths lists the paths this machine can run.
func fp8Paths(t testing.TB) []fp8Path {
	paths := []fp8Path{{"portable", false}}
	if useAVX2 {
		paths = append(paths, fp8Path{"avx2", true})
	} else {
		t.Log("no AVX2 here: the vector path is not tested")
	}
	return paths
}

// fp8Lengths are row lengths around the vector width (8) and the block (128).
var fp8Lengths = []int{1, 7, 8, 9, 15, 127, 128, 129, 135, 255, 1000, 7168}

// randomFP8Row fills a row of one of several kinds: magnitudes over the whole
// float32 range, normals, blocks scaled by exactly 1 (a 448 in each) so that
// midpoints between E4M3 neighbours, subnormals and ±448 stay exact, zeros,
// and float32 subnormals (whose inverse scale is infinite).
func randomFP8Row(rng *rand.Rand, kind, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch kind {
		case 0:
			x[i] = float32(math.Ldexp(1+rng.Float64(), rng.IntN(250)-140))
		case 1:
			x[i] = float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(40)-20))
		case 2:
			b := uint8(rng.IntN(0x7e))
			switch rng.IntN(4) {
			case 0:
				x[i] = E4M3ToF32(b)
			case 1:
				x[i] = (E4M3ToF32(b) + E4M3ToF32(b+1)) / 2
			case 2: // one float32 step either side of a midpoint
				m := (E4M3ToF32(b) + E4M3ToF32(b+1)) / 2
				x[i] = math.Nextafter32(m, float32(rng.IntN(2)*1000-500))
			default:
				x[i] = float32(rng.IntN(2)) * 448
			}
			if i%E4M3Block == 0 {
				x[i] = 448
			}
		case 3:
			if rng.IntN(8) == 0 {
				x[i] = float32(rng.NormFloat64())
			}
		default:
			x[i] = math.Float32frombits(uint32(rng.IntN(1 << 23)))
		}
		if rng.IntN(2) == 0 {
			x[i] = -x[i]
		}
	}
	return x
}

// TestE4M3VecMatchesPortable checks that the vector kernels produce the
// portable code's bytes, scales and decoded values, bit for bit.
func TestE4M3VecMatchesPortable(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2 on this machine")
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for iter := 0; iter < 40; iter++ {
		for _, n := range fp8Lengths {
			for kind := 0; kind < 5; kind++ {
				src := randomFP8Row(rng, kind, n)
				bf := make([]uint16, n)
				for i, v := range src {
					bf[i] = F32ToBF16(v)
				}
				checkQuantizeSame(t, n, kind, src, bf)
			}
			checkDequantizeSame(t, rng, n)
		}
	}
}

func checkQuantizeSame(t *testing.T, n, kind int, src []float32, bf []uint16) {
	t.Helper()
	var q, s [2][]uint8
	var sc, sc16 [2][]float32
	for p, vec := range []bool{false, true} {
		q[p], sc[p] = make([]uint8, n), make([]float32, E4M3Scales(n))
		s[p], sc16[p] = make([]uint8, n), make([]float32, E4M3Scales(n))
		if err := quantizeE4M3(q[p], sc[p], src, vec); err != nil {
			t.Fatal(err)
		}
		if err := quantizeE4M3BF16(s[p], sc16[p], bf, vec); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		if q[0][i] != q[1][i] || s[0][i] != s[1][i] {
			t.Fatalf("n=%d kind %d element %d = %v: portable %#02x, avx2 %#02x (bfloat16 row: %#02x, %#02x)",
				n, kind, i, src[i], q[0][i], q[1][i], s[0][i], s[1][i])
		}
	}
	for b := range sc[0] {
		if math.Float32bits(sc[0][b]) != math.Float32bits(sc[1][b]) || math.Float32bits(sc16[0][b]) != math.Float32bits(sc16[1][b]) {
			t.Fatalf("n=%d kind %d block %d: scales differ", n, kind, b)
		}
	}
	// The kernel alone, with scales of every size (saturation included).
	inv := float32(math.Ldexp(1+rng01(src), int(n%9)-4))
	a, v := make([]uint8, n), make([]uint8, n)
	fin := make([]float32, n)
	for i, x := range src {
		fin[i] = min(max(x, -1e30), 1e30)
	}
	quantizeScaled(a, fin, inv, false)
	quantizeScaled(v, fin, inv, true)
	for i := range n {
		if a[i] != v[i] {
			t.Fatalf("n=%d kind %d: %v*%v: portable %#02x, avx2 %#02x", n, kind, fin[i], inv, a[i], v[i])
		}
	}
}

// rng01 derives a number in [0, 1) from a row, to vary the inverse scale.
func rng01(x []float32) float64 {
	return float64(math.Float32bits(x[0])%1000) / 1000
}

// checkDequantizeSame decodes random bytes (NaN codes included) with random
// scales (zero, negative, tiny, huge) on both paths.
func checkDequantizeSame(t *testing.T, rng *rand.Rand, n int) {
	t.Helper()
	q, scales := make([]uint8, n), make([]float32, E4M3Scales(n))
	for i := range q {
		q[i] = uint8(rng.IntN(256))
	}
	for i := range scales {
		scales[i] = float32(math.Ldexp(rng.NormFloat64(), rng.IntN(280)-150))
		if rng.IntN(10) == 0 {
			scales[i] = 0
		}
	}
	var f [2][]float32
	var h [2][]uint16
	for p, vec := range []bool{false, true} {
		f[p], h[p] = make([]float32, n), make([]uint16, n)
		if err := dequantizeE4M3(f[p], q, scales, vec); err != nil {
			t.Fatal(err)
		}
		if err := dequantizeE4M3BF16(h[p], q, scales, vec); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		if math.Float32bits(f[0][i]) != math.Float32bits(f[1][i]) || h[0][i] != h[1][i] {
			t.Fatalf("n=%d element %d (%#02x * %v): portable %#x/%#04x, avx2 %#x/%#04x", n, i, q[i], scales[i/E4M3Block],
				math.Float32bits(f[0][i]), h[0][i], math.Float32bits(f[1][i]), h[1][i])
		}
	}
}
