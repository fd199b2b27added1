package reduce

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// scalarSum is the portable kernel's answer, element by element.
func scalarSum[T native](d, a, b []T) {
	for i := range d {
		d[i] = a[i] + b[i]
	}
}

// TestVectorSums: ReduceTo's Sum (and Avg) of float32, float64, int32 and
// int64 gives, bit for bit, the scalar sum, NaNs and signed zeros included,
// at lengths around the vector kernels' 128-byte steps, into a third buffer
// and in place (d = a, d = b), from unaligned byte offsets too (where the
// portable path runs), with and without the AVX2 kernels.
func TestVectorSums(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dt := range []DType{Float32, Float64, Int32, Int64} {
		for _, n := range []int{0, 1, 7, 15, 16, 31, 32, 33, 63, 64, 100, 1000, 4099} {
			for _, alias := range []string{"third", "d=a", "d=b"} {
				for _, op := range []Op{Sum, Avg} {
					name := fmt.Sprintf("%s/%d/%s/%s", dt, n, alias, op)
					size := n * dt.Size()
					a, b := randomBufS(rng, dt, size, true), randomBufS(rng, dt, size, true)
					want := make([]byte, size)
					switch dt {
					case Float32:
						scalarSum(view[float32](want), view[float32](a), view[float32](b))
					case Float64:
						scalarSum(view[float64](want), view[float64](a), view[float64](b))
					case Int32:
						scalarSum(view[int32](want), view[int32](a), view[int32](b))
					case Int64:
						scalarSum(view[int64](want), view[int64](a), view[int64](b))
					}
					d := make([]byte, size)
					switch alias {
					case "d=a":
						d = a
					case "d=b":
						d = b
					}
					if err := ReduceTo(dt, op, d, a, b); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if !bytes.Equal(d, want) {
						t.Fatalf("%s: differs from the scalar sum", name)
					}
				}
			}
		}
	}
}

// TestVectorSumsUnaligned runs the sums on buffers one byte off: the
// portable path, which must agree with the vector one.
func TestVectorSumsUnaligned(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const n = 300
	raw := randomBuf(rng, Float32, 4*n+1)
	a, b := raw[1:], randomBuf(rng, Float32, 4*n)
	if uintptr(unsafe.Pointer(&a[0]))%4 == 0 {
		t.Fatal("the test buffer is aligned")
	}
	got, want := make([]byte, 4*n), make([]byte, 4*n)
	if err := ReduceTo(Float32, Sum, got, a, b); err != nil {
		t.Fatal(err)
	}
	if err := ReduceTo(Float32, Sum, want, bytes.Clone(a), b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("unaligned and aligned sums differ")
	}
}
