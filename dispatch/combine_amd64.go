//go:build amd64 && !purego

package dispatch

import (
	"unsafe"

	"golang.org/x/sys/cpu"

	"github.com/a2a-moe/a2a/a2a/reduce"
)

// useAVX2 selects the vector kernels of combine_amd64.s. It is fixed when
// the package loads: the CPU does not change under a running process.
var useAVX2 = cpu.X86.HasAVX2

// useAVX512 selects the 512-bit bfloat16 two-row kernel (tests turn it off
// to check the AVX2 one). Besides AVX-512F it requires VBMI2, which the
// kernel does not use, as a sign of a core (Ice Lake, Zen 4 and later) that
// does not slow its clock down for 512-bit arithmetic as the first AVX-512
// Xeons did.
var useAVX512 = useAVX2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512VBMI2

// The vector kernels process n elements, a multiple of 8, and round exactly
// as the Go kernels do: float32 products and sum (no fused multiply-add),
// one round to nearest even into bfloat16.

//go:noescape
func axpbyBF16AVX2(dst, a, b *byte, n int, wa, wb float32, nt bool)

//go:noescape
func axpbyBF16AVX512(dst, a, b *byte, n int, wa, wb float32, nt bool)

//go:noescape
func scaleBF16AVX2(dst, a *byte, n int, w float32)

//go:noescape
func axpbyF32AVX2(dst, a, b *byte, n int, wa, wb float32, nt bool)

//go:noescape
func scaleF32AVX2(dst, a *byte, n int, w float32)

// vecAxpby computes the leading whole vectors of axpbyRow and returns how
// many bytes of dst it wrote (0 without AVX2). With stream, it writes them
// with non-temporal stores if dst is aligned for them (see copyStream).
func vecAxpby(bf16 bool, dst, a, b []byte, wa, wb float32, stream bool) int {
	if !useAVX2 || len(dst) == 0 {
		return 0
	}
	addr := uintptr(unsafe.Pointer(&dst[0]))
	if !bf16 {
		n := len(dst) / 32 * 8
		if n > 0 {
			axpbyF32AVX2(&dst[0], &a[0], &b[0], n, wa, wb, stream && addr&31 == 0)
		}
		return 4 * n
	}
	done := 0
	if useAVX512 {
		if n := len(dst) / 32 * 16; n > 0 {
			axpbyBF16AVX512(&dst[0], &a[0], &b[0], n, wa, wb, stream && addr&63 == 0)
			done = 2 * n
		}
	}
	n := (len(dst) - done) / 16 * 8
	if n > 0 {
		axpbyBF16AVX2(&dst[done], &a[done], &b[done], n, wa, wb, stream && (addr+uintptr(done))&31 == 0)
	}
	return done + 2*n
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

//go:noescape
func copyNTAVX2(dst, src *byte, n int)

// storeFence orders the streaming stores of copyStream before every later
// store, so that another thread (a peer rank reading the send buffer) that
// sees a later store also sees the rows.
func storeFence()

// copyStream copies src into dst (equal lengths) with non-temporal stores,
// which write the lines without reading them into the cache first: for rows
// that another rank reads, or that are read back only after megabytes of
// other traffic, this saves a third of the memory traffic of the copy (no
// read for ownership of the destination). Call storeFence once after the
// last copy.
func copyStream(dst, src []byte) {
	if !useAVX2 || len(dst) < 64 {
		copy(dst, src)
		return
	}
	src = src[:len(dst)]
	if head := int(-uintptr(unsafe.Pointer(&dst[0])) & 31); head > 0 {
		copy(dst[:head], src[:head])
		dst, src = dst[head:], src[head:]
	}
	n := len(dst) &^ 31
	copyNTAVX2(&dst[0], &src[0], n)
	copy(dst[n:], src[n:])
}

//go:noescape
func prefetchT0(p *byte, n int)

// prefetchRow asks for the cache lines of row (a hint: nothing waits).
func prefetchRow(row []byte) {
	if len(row) > 0 {
		prefetchT0(&row[0], len(row))
	}
}

//go:noescape
func accBF16AVX2(acc *float32, a *byte, n int, w float32, first bool)

//go:noescape
func accF32AVX2(acc *float32, a *byte, n int, w float32, first bool)

//go:noescape
func narrowBF16AVX2(dst *byte, acc *float32, n int)

// vecAcc computes the leading whole vectors of one row's term of the
// weighted sum of three or more rows, acc = w*a (first) or acc += w*a, and
// returns how many elements it did (0 without AVX2, and for float16).
func vecAcc(dt reduce.DType, acc []float32, a []byte, w float32, first bool) int {
	n := len(acc) / 8 * 8
	if !useAVX2 || n == 0 {
		return 0
	}
	switch dt {
	case reduce.BFloat16:
		accBF16AVX2(&acc[0], &a[0], n, w, first)
	case reduce.Float32:
		accF32AVX2(&acc[0], &a[0], n, w, first)
	default:
		return 0
	}
	return n
}

// vecNarrow rounds the leading whole vectors of acc into dst, a row of dt
// elements, and returns how many elements it did (0 without AVX2, and for
// float16; float32 needs no rounding but is copied here too).
func vecNarrow(dt reduce.DType, dst []byte, acc []float32) int {
	n := len(acc) / 8 * 8
	if !useAVX2 || n == 0 {
		return 0
	}
	switch dt {
	case reduce.BFloat16:
		narrowBF16AVX2(&dst[0], &acc[0], n)
	case reduce.Float32:
		copy(dst[:4*n], unsafe.Slice((*byte)(unsafe.Pointer(&acc[0])), 4*n))
	default:
		return 0
	}
	return n
}
