package reduce

// native is the set of element types the kernels operate on directly.
type native interface {
	float32 | float64 | int32 | int64 | uint8
}

// The kernels below compute d[i] = a[i] op b[i] for typed slices of equal
// length (the caller checks). Each element depends only on the same index of a
// and b and is read before it is written, so d may be a or b itself.
//
// Go does not vectorise, so throughput comes from unrolling by eight with
// fixed-length subslices: after `x := x[:8]` the compiler proves every index in
// range and drops the bounds checks, leaving straight-line loads, ops, stores.
// Each instantiation is compiled for its own shape, so the arithmetic is the
// machine instruction for that type (no dictionary indirection).

func sumTo[T native](d, a, b []T) {
	a, b = a[:len(d)], b[:len(d)]
	for len(d) >= 8 {
		x, y, z := a[:8], b[:8], d[:8]
		z[0] = x[0] + y[0]
		z[1] = x[1] + y[1]
		z[2] = x[2] + y[2]
		z[3] = x[3] + y[3]
		z[4] = x[4] + y[4]
		z[5] = x[5] + y[5]
		z[6] = x[6] + y[6]
		z[7] = x[7] + y[7]
		a, b, d = a[8:], b[8:], d[8:]
	}
	for i := range d {
		d[i] = a[i] + b[i]
	}
}

func prodTo[T native](d, a, b []T) {
	a, b = a[:len(d)], b[:len(d)]
	for len(d) >= 8 {
		x, y, z := a[:8], b[:8], d[:8]
		z[0] = x[0] * y[0]
		z[1] = x[1] * y[1]
		z[2] = x[2] * y[2]
		z[3] = x[3] * y[3]
		z[4] = x[4] * y[4]
		z[5] = x[5] * y[5]
		z[6] = x[6] * y[6]
		z[7] = x[7] * y[7]
		a, b, d = a[8:], b[8:], d[8:]
	}
	for i := range d {
		d[i] = a[i] * b[i]
	}
}

// maxTo and minTo use the builtins, whose float semantics are exactly the
// documented ones: NaN if either operand is NaN, and max(-0, +0) = +0,
// min(-0, +0) = -0.
func maxTo[T native](d, a, b []T) {
	a, b = a[:len(d)], b[:len(d)]
	for len(d) >= 8 {
		x, y, z := a[:8], b[:8], d[:8]
		z[0] = max(x[0], y[0])
		z[1] = max(x[1], y[1])
		z[2] = max(x[2], y[2])
		z[3] = max(x[3], y[3])
		z[4] = max(x[4], y[4])
		z[5] = max(x[5], y[5])
		z[6] = max(x[6], y[6])
		z[7] = max(x[7], y[7])
		a, b, d = a[8:], b[8:], d[8:]
	}
	for i := range d {
		d[i] = max(a[i], b[i])
	}
}

func minTo[T native](d, a, b []T) {
	a, b = a[:len(d)], b[:len(d)]
	for len(d) >= 8 {
		x, y, z := a[:8], b[:8], d[:8]
		z[0] = min(x[0], y[0])
		z[1] = min(x[1], y[1])
		z[2] = min(x[2], y[2])
		z[3] = min(x[3], y[3])
		z[4] = min(x[4], y[4])
		z[5] = min(x[5], y[5])
		z[6] = min(x[6], y[6])
		z[7] = min(x[7], y[7])
		a, b, d = a[8:], b[8:], d[8:]
	}
	for i := range d {
		d[i] = min(a[i], b[i])
	}
}

// applyVec is applyTo with a Sum's (or Avg's) prefix done by vec, a vector
// kernel (sum_amd64.go) that returns how many elements it did.
func applyVec[T native](op Op, d, a, b []T, vec func(d, a, b []T) int) {
	if op == Sum || op == Avg {
		n := vec(d, a, b)
		d, a, b = d[n:], a[n:], b[n:]
	}
	applyTo(op, d, a, b)
}

// applyTo dispatches op (already validated; Avg accumulates a Sum).
func applyTo[T native](op Op, d, a, b []T) {
	switch op {
	case Sum, Avg:
		sumTo(d, a, b)
	case Prod:
		prodTo(d, a, b)
	case Max:
		maxTo(d, a, b)
	case Min:
		minTo(d, a, b)
	}
}
