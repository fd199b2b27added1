//go:build !amd64 || purego

package dispatch

// Without vector kernels the Go kernels do all the work.

func vecAxpby(bf16 bool, dst, a, b []byte, wa, wb float32) int { return 0 }

func vecScale(bf16 bool, dst, a []byte, w float32) int { return 0 }
