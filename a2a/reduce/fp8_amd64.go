//go:build amd64 && !purego

package reduce

import "golang.org/x/sys/cpu"

// useAVX2 selects the vector FP8 kernels of fp8_amd64.s. It is fixed when the
// package loads: the CPU does not change under a running process.
var useAVX2 = cpu.X86.HasAVX2

// The kernels take n, a multiple of 8; the wrappers below pass the largest
// such prefix and return its length, leaving the tail to the portable loop.

//go:noescape
func amaxF32AVX2(x *float32, n int) uint32

//go:noescape
func widenBF16AVX2(dst *float32, src *uint16, n int)

//go:noescape
func quantizeE4M3AVX2(dst *uint8, src *float32, n int, inv float32)

//go:noescape
func dequantizeE4M3AVX2(dst *float32, src *uint8, n int, scale float32)

//go:noescape
func dequantizeE4M3BF16AVX2(dst *uint16, src *uint8, n int, scale float32)

// amaxVec returns the largest magnitude bit pattern of x's first done elements.
func amaxVec(x []float32) (amax uint32, done int) {
	if done = len(x) &^ 7; done > 0 {
		amax = amaxF32AVX2(&x[0], done)
	}
	return amax, done
}

// widenVec widens the first done elements of src into dst.
func widenVec(dst []float32, src []uint16) (done int) {
	if done = min(len(dst), len(src)) &^ 7; done > 0 {
		widenBF16AVX2(&dst[0], &src[0], done)
	}
	return done
}

// quantizeVec encodes x[i]*inv into dst[i] for the first done elements.
func quantizeVec(dst []uint8, x []float32, inv float32) (done int) {
	if done = min(len(dst), len(x)) &^ 7; done > 0 {
		quantizeE4M3AVX2(&dst[0], &x[0], done, inv)
	}
	return done
}

// dequantizeVec decodes src[i]*scale into dst[i] for the first done elements.
func dequantizeVec(dst []float32, src []uint8, scale float32) (done int) {
	if done = min(len(dst), len(src)) &^ 7; done > 0 {
		dequantizeE4M3AVX2(&dst[0], &src[0], done, scale)
	}
	return done
}

// dequantizeBF16Vec is dequantizeVec rounding into bfloat16.
func dequantizeBF16Vec(dst []uint16, src []uint8, scale float32) (done int) {
	if done = min(len(dst), len(src)) &^ 7; done > 0 {
		dequantizeE4M3BF16AVX2(&dst[0], &src[0], done, scale)
	}
	return done
}
