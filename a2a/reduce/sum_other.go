//go:build !amd64 || purego

package reduce

// Off amd64 (or with purego) the portable loops do every sum.
func sumF32Vec(_, _, _ []float32) (done int) { return 0 }
func sumF64Vec(_, _, _ []float64) (done int) { return 0 }
func sumI32Vec(_, _, _ []int32) (done int)   { return 0 }
func sumI64Vec(_, _, _ []int64) (done int)   { return 0 }
