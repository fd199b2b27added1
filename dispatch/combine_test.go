package dispatch

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/a2a-moe/a2a/a2a/reduce"
)

// TestKernelsMatchReference checks the fused one- and two-row kernels
// against the plain float32 formula rounded once, element by element and
// bit for bit, including the tails of rows that are not a multiple of the
// 64-bit lane width and the special values (NaN, ±Inf, ±0, subnormals,
// values that round up to Inf), with and without streaming stores (on
// aligned and unaligned outputs).
func TestKernelsMatchReference(t *testing.T) {
	for _, wide := range []bool{false, true} {
		if wide && !useAVX512 {
			continue
		}
		t.Run(map[bool]string{false: "avx2", true: "avx512"}[wide], func(t *testing.T) {
			defer func(saved bool) { useAVX512 = saved }(useAVX512)
			useAVX512 = wide
			testKernels(t)
		})
	}
}

func testKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	specials := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
		float32(math.NaN()), 1e-40, -3e-39, math.MaxFloat32, 3.3895e38, 1, -1}
	for _, dt := range []reduce.DType{reduce.Float32, reduce.BFloat16} {
		for _, hidden := range []int{1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 31, 33, 48, 64, 80, 1027} {
			rb := hidden * dt.Size()
			a, b := make([]byte, rb), make([]byte, rb)
			store := make([]byte, rb+128)
			aligned := int(-uintptr(unsafe.Pointer(&store[0])) & 63)
			for trial := range 50 {
				for j := range hidden {
					va, vb := float32(rng.NormFloat64()*10), float32(rng.NormFloat64())
					if trial%5 == 0 {
						va = specials[rng.IntN(len(specials))]
					}
					putElem(dt, a, j, va)
					putElem(dt, b, j, vb)
				}
				wa, wb := float32(rng.Float64()), float32(rng.Float64())
				if trial%7 == 0 {
					wa = 0
				}
				if dt == reduce.BFloat16 && trial%3 == 1 {
					// Exact ties: b is half a unit in the last place of a, so
					// a+b sits halfway between two bfloat16 values.
					wa, wb = 1, 1
					for j := range hidden {
						h := uint16(rng.Uint32())&0x807f | uint16(9+rng.IntN(200))<<7
						binary.LittleEndian.PutUint16(a[2*j:], h)
						binary.LittleEndian.PutUint16(b[2*j:], h&0x8000|(h>>7&0xff-8)<<7)
					}
				}
				stream := trial%2 == 1
				got := store[aligned : aligned+rb] // 64-byte aligned
				switch trial % 8 {
				case 3:
					got = store[aligned+4 : aligned+4+rb]
				case 5:
					got = store[aligned+32 : aligned+32+rb]
				}
				axpbyRow(dt, got, a, b, wa, wb, stream)
				if stream {
					storeFence()
				}
				for j := range hidden {
					want := float32(wa*getElem(dt, a, j)) + float32(wb*getElem(dt, b, j))
					if !sameBits(dt, got, j, want) {
						t.Fatalf("%v hidden %d axpby element %d: got %v, want %v (a %v b %v wa %v wb %v)",
							dt, hidden, j, getElem(dt, got, j), roundTo(dt, want), getElem(dt, a, j), getElem(dt, b, j), wa, wb)
					}
				}
				scaleRow(dt, got, a, wa)
				for j := range hidden {
					if want := wa * getElem(dt, a, j); !sameBits(dt, got, j, want) {
						t.Fatalf("%v hidden %d scale element %d: got %v, want %v", dt, hidden, j, getElem(dt, got, j), roundTo(dt, want))
					}
				}
			}
		}
	}
}

// TestAccumulateMatchesReference checks the weighted sum of three or more
// rows (accumulate, then narrowAcc) against the plain float32 formula,
// rounded once, bit for bit: rows with tails off the vector width and
// special values, float32, bfloat16 and float16 (no vector kernel).
func TestAccumulateMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	specials := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.NaN()), 1e-40, math.MaxFloat32, -1}
	for _, dt := range []reduce.DType{reduce.Float32, reduce.BFloat16, reduce.Float16} {
		for _, hidden := range []int{1, 7, 8, 9, 16, 23, 64, 1027} {
			for trial := range 30 {
				k := 3 + trial%6
				rows, ws := make([][]byte, k), make([]float32, k)
				for i := range rows {
					rows[i], ws[i] = make([]byte, hidden*dt.Size()), float32(rng.Float64())
					for j := range hidden {
						v := float32(rng.NormFloat64() * 4)
						if trial%5 == 0 && rng.IntN(4) == 0 {
							v = specials[rng.IntN(len(specials))]
						}
						putElem(dt, rows[i], j, v)
					}
				}
				acc, tmp, got := make([]float32, hidden), make([]float32, hidden), make([]byte, hidden*dt.Size())
				for i := range rows {
					accumulate(dt, acc, tmp, rows[i], ws[i], i == 0)
				}
				narrowAcc(dt, got, acc)
				for j := range hidden {
					want := ws[0] * getElem(dt, rows[0], j)
					for i := 1; i < k; i++ {
						want += float32(ws[i] * getElem(dt, rows[i], j))
					}
					if !sameBits(dt, got, j, want) && !(want != want && getElem(dt, got, j) != getElem(dt, got, j)) {
						t.Fatalf("%v hidden %d k %d element %d: got %v, want %v", dt, hidden, k, j, getElem(dt, got, j), roundTo(dt, want))
					}
				}
			}
		}
	}
}

// sameBits reports whether element j of buf is want encoded in dt.
func sameBits(dt reduce.DType, buf []byte, j int, want float32) bool {
	enc := make([]byte, 4)
	putElem(dt, enc, 0, want)
	n := dt.Size()
	return string(buf[j*n:(j+1)*n]) == string(enc[:n])
}

// TestWidenNarrow round-trips every bfloat16 and float16 bit pattern except
// NaNs (whose payloads the float32 trip may quieten).
func TestWidenNarrow(t *testing.T) {
	for _, dt := range []reduce.DType{reduce.BFloat16, reduce.Float16} {
		src := make([]byte, 2<<16)
		for i := range 1 << 16 {
			binary.LittleEndian.PutUint16(src[2*i:], uint16(i))
		}
		f := make([]float32, 1<<16)
		widen(dt, f, src)
		dst := make([]byte, len(src))
		narrow(dt, dst, f)
		for i := range 1 << 16 {
			if v := f[i]; v != v {
				continue
			}
			if got := binary.LittleEndian.Uint16(dst[2*i:]); got != uint16(i) {
				t.Fatalf("%v: 0x%04x came back as 0x%04x", dt, i, got)
			}
		}
	}
}

// TestCopyStream checks the streaming row copy on every alignment of the
// destination and lengths around the vector widths.
func TestCopyStream(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	src := make([]byte, 4096+64)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	dst := make([]byte, len(src)+64)
	for _, n := range []int{0, 1, 31, 32, 33, 63, 64, 65, 127, 128, 129, 160, 2000, 2048, 4095, 4096} {
		for doff := range 33 {
			soff := rng.IntN(64)
			clear(dst)
			copyStream(dst[doff:doff+n], src[soff:soff+n])
			storeFence()
			if string(dst[doff:doff+n]) != string(src[soff:soff+n]) {
				t.Fatalf("length %d, destination offset %d: copy differs", n, doff)
			}
			for i, c := range dst {
				if (i < doff || i >= doff+n) && c != 0 {
					t.Fatalf("length %d, destination offset %d: byte %d outside the row written", n, doff, i)
				}
			}
		}
	}
}
