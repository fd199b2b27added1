//go:build amd64 && !purego

package dispatch

import "golang.org/x/sys/cpu"

// useAVX2 selects the vector kernels of combine_amd64.s. It is fixed when
// the package loads: the CPU does not change under a running process.
var useAVX2 = cpu.X86.HasAVX2

// The vector kernels process n elements, a multiple of 8, and round exactly
// as the Go kernels do: float32 products and sum (no fused multiply-add),
// one round to nearest even into bfloat16.

//go:noescape
func axpbyBF16AVX2(dst, a, b *byte, n int, wa, wb float32)

//go:noescape
func scaleBF16AVX2(dst, a *byte, n int, w float32)

//go:noescape
func axpbyF32AVX2(dst, a, b *byte, n int, wa, wb float32)

//go:noescape
func scaleF32AVX2(dst, a *byte, n int, w float32)

// vecAxpby computes the leading whole vectors of axpbyRow and returns how
// many bytes of dst it wrote (0 without AVX2).
func vecAxpby(bf16 bool, dst, a, b []byte, wa, wb float32) int {
	if !useAVX2 {
		return 0
	}
	if bf16 {
		n := len(dst) / 16 * 8
		if n > 0 {
			axpbyBF16AVX2(&dst[0], &a[0], &b[0], n, wa, wb)
		}
		return 2 * n
	}
	n := len(dst) / 32 * 8
	if n > 0 {
		axpbyF32AVX2(&dst[0], &a[0], &b[0], n, wa, wb)
	}
	return 4 * n
}

// vecScale is vecAxpby for scaleRow.
func vecScale(bf16 bool, dst, a []byte, w float32) int {
	if !useAVX2 {
		return 0
	}
	if bf16 {
		n := len(dst) / 16 * 8
		if n > 0 {
			scaleBF16AVX2(&dst[0], &a[0], n, w)
		}
		return 2 * n
	}
	n := len(dst) / 32 * 8
	if n > 0 {
		scaleF32AVX2(&dst[0], &a[0], n, w)
	}
	return 4 * n
}
