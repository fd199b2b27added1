//go:build amd64 && !purego

package reduce

// The AVX2 sums of sum_amd64.s take a byte count, a multiple of 128; the
// wrappers below pass the largest such prefix and return its length in
// elements, leaving the tail to the portable loop. The portable loop is
// scalar (Go does not vectorise): 8 bytes per add where AVX2 does 32, which
// is most of a float32 AllReduce's time on one host once the copies are
// gone.

//go:noescape
func sumF32AVX2(d, a, b *float32, bytes int)

//go:noescape
func sumF64AVX2(d, a, b *float64, bytes int)

//go:noescape
func sumI32AVX2(d, a, b *int32, bytes int)

//go:noescape
func sumI64AVX2(d, a, b *int64, bytes int)

func sumF32Vec(d, a, b []float32) (done int) {
	if done = len(d) &^ 31; useAVX2 && done > 0 {
		sumF32AVX2(&d[0], &a[0], &b[0], 4*done)
		return done
	}
	return 0
}

func sumF64Vec(d, a, b []float64) (done int) {
	if done = len(d) &^ 15; useAVX2 && done > 0 {
		sumF64AVX2(&d[0], &a[0], &b[0], 8*done)
		return done
	}
	return 0
}

func sumI32Vec(d, a, b []int32) (done int) {
	if done = len(d) &^ 31; useAVX2 && done > 0 {
		sumI32AVX2(&d[0], &a[0], &b[0], 4*done)
		return done
	}
	return 0
}

func sumI64Vec(d, a, b []int64) (done int) {
	if done = len(d) &^ 15; useAVX2 && done > 0 {
		sumI64AVX2(&d[0], &a[0], &b[0], 8*done)
		return done
	}
	return 0
}
