//go:build !amd64 || purego

package dispatch

import "github.com/a2a-moe/a2a/a2a/reduce"

// Without vector kernels the Go kernels do all the work.

var useAVX512 bool // what the amd64 kernels' tests toggle

func vecAxpby(bf16 bool, dst, a, b []byte, wa, wb float32, stream bool) int { return 0 }

func vecScale(bf16 bool, dst, a []byte, w float32) int { return 0 }

func copyStream(dst, src []byte) { copy(dst, src) }

func storeFence() {}

func prefetchRow(row []byte) {}

func vecAcc(dt reduce.DType, acc []float32, a []byte, w float32, first bool) int { return 0 }

func vecNarrow(dt reduce.DType, dst []byte, acc []float32) int { return 0 }
