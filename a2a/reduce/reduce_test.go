package reduce

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"unsafe"
)

var allDTypes = []DType{Float32, Float64, BFloat16, Float16, Int32, Int64, Uint8}
var allOps = []Op{Sum, Prod, Max, Min, Avg}

func isFloat(dt DType) bool {
	return dt == Float32 || dt == Float64 || dt == BFloat16 || dt == Float16
}

// refOp is the straightforward reference: float64 arithmetic for floats
// (rounded to the element format by putElem), math/big modulo 2^bits for
// integers.
func refOp(dt DType, op Op, x, y elem) elem {
	if isFloat(dt) {
		switch op {
		case Sum, Avg:
			return elem{f: x.f + y.f}
		case Prod:
			return elem{f: x.f * y.f}
		case Max, Min:
			if math.IsNaN(x.f) || math.IsNaN(y.f) {
				return elem{f: math.NaN()}
			}
			if x.f == y.f { // ±0: max prefers +0, min prefers -0
				if (op == Max) == math.Signbit(x.f) {
					return y
				}
				return x
			}
			if (x.f > y.f) == (op == Max) {
				return x
			}
			return y
		}
	}
	switch op {
	case Max:
		return elem{i: max(x.i, y.i)}
	case Min:
		return elem{i: min(x.i, y.i)}
	}
	r := new(big.Int)
	if op == Prod {
		r.Mul(big.NewInt(x.i), big.NewInt(y.i))
	} else {
		r.Add(big.NewInt(x.i), big.NewInt(y.i))
	}
	bits := uint(8 * dt.Size())
	m := new(big.Int).Lsh(big.NewInt(1), bits)
	r.Mod(r, m)
	if dt != Uint8 && r.Cmp(new(big.Int).Rsh(m, 1)) >= 0 {
		r.Sub(r, m)
	}
	return elem{i: r.Int64()}
}

// reference returns a op b computed element by element with refOp.
func reference(dt DType, op Op, a, b []byte) []byte {
	out := make([]byte, len(a))
	for i := 0; i < len(a); i += dt.Size() {
		putElem(dt, out[i:], refOp(dt, op, getElem(dt, a[i:]), getElem(dt, b[i:])))
	}
	return out
}

// sameElems compares element by element: bytes must match exactly (so -0 and
// +0 differ), except that any NaN equals any NaN. It reports the first mismatch.
func sameElems(t *testing.T, dt DType, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("length %d, want %d", len(got), len(want))
	}
	es := dt.Size()
	for i := 0; i < len(got); i += es {
		g, w := got[i:i+es], want[i:i+es]
		if bytes.Equal(g, w) {
			continue
		}
		if isFloat(dt) && math.IsNaN(getElem(dt, g).f) && math.IsNaN(getElem(dt, w).f) {
			continue
		}
		t.Fatalf("element %d: got %x (%v), want %x (%v)", i/es, g, getElem(dt, g), w, getElem(dt, w))
	}
}

func TestReduceMatchesReference(t *testing.T) {
	for _, dt := range allDTypes {
		for _, op := range allOps {
			// 0..9 cover the unrolled loop's tail; 300 spans more than one
			// portable chunk; 1000 is a plain large case.
			for _, n := range []int{0, 1, 7, 8, 9, 37, 300, 1000} {
				t.Run(fmt.Sprintf("%s/%s/%d", dt, op, n), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(dt), uint64(op)<<32|uint64(n)))
					a := randomBufS(rng, dt, n*dt.Size(), true)
					b := randomBufS(rng, dt, n*dt.Size(), true)
					want := reference(dt, op, a, b)
					dst := bytes.Clone(a)
					if err := Reduce(dt, op, dst, b); err != nil {
						t.Fatal(err)
					}
					sameElems(t, dt, dst, want)
				})
			}
		}
	}
}

// enc encodes a single element given as a float64 (floats) or int64 (integers).
func enc(dt DType, v any) []byte {
	b := make([]byte, dt.Size())
	switch v := v.(type) {
	case float64:
		putElem(dt, b, elem{f: v})
	case int:
		putElem(dt, b, elem{i: int64(v)})
	case int64:
		putElem(dt, b, elem{i: v})
	}
	return b
}

func TestReduceEdgeCases(t *testing.T) {
	inf, nan, negZero := math.Inf(1), math.NaN(), math.Copysign(0, -1)
	tiny := math.Ldexp(1, -24) // smallest float16 subnormal
	cases := []struct {
		dt      DType
		op      Op
		a, b    any
		want    any
		wantNaN bool
	}{
		{dt: Float32, op: Sum, a: inf, b: -inf, wantNaN: true},
		{dt: Float32, op: Sum, a: 1.0, b: nan, wantNaN: true},
		{dt: Float32, op: Sum, a: negZero, b: negZero, want: negZero},
		{dt: Float32, op: Sum, a: negZero, b: 0.0, want: 0.0},
		{dt: Float32, op: Sum, a: math.MaxFloat32, b: math.MaxFloat32, want: inf},
		{dt: Float32, op: Prod, a: 0.0, b: inf, wantNaN: true},
		{dt: Float32, op: Prod, a: -2.0, b: 0.0, want: negZero},
		{dt: Float32, op: Max, a: nan, b: 1.0, wantNaN: true},
		{dt: Float32, op: Max, a: 1.0, b: nan, wantNaN: true},
		{dt: Float32, op: Min, a: nan, b: -inf, wantNaN: true},
		{dt: Float32, op: Min, a: -inf, b: nan, wantNaN: true},
		{dt: Float32, op: Max, a: negZero, b: 0.0, want: 0.0},
		{dt: Float32, op: Max, a: 0.0, b: negZero, want: 0.0},
		{dt: Float32, op: Min, a: 0.0, b: negZero, want: negZero},
		{dt: Float32, op: Min, a: negZero, b: 0.0, want: negZero},
		{dt: Float32, op: Max, a: -inf, b: -1e30, want: -1e30},
		{dt: Float32, op: Sum, a: 1e-45, b: 1e-45, want: float64(math.Float32frombits(2))}, // subnormals
		{dt: Float64, op: Sum, a: inf, b: -inf, wantNaN: true},
		{dt: Float64, op: Max, a: nan, b: 1.0, wantNaN: true},
		{dt: Float64, op: Min, a: 2.0, b: nan, wantNaN: true},
		{dt: Float64, op: Min, a: 0.0, b: negZero, want: negZero},
		{dt: Float64, op: Max, a: negZero, b: 0.0, want: 0.0},
		{dt: Float64, op: Sum, a: math.MaxFloat64, b: math.MaxFloat64, want: inf},
		{dt: Float64, op: Sum, a: 0.1, b: 0.2, want: 0.30000000000000004}, // rounded, unlike the constant 0.1 + 0.2
		{dt: BFloat16, op: Sum, a: 3e38, b: 3e38, want: inf},
		{dt: BFloat16, op: Max, a: nan, b: 1.0, wantNaN: true},
		{dt: BFloat16, op: Min, a: 1.0, b: nan, wantNaN: true},
		{dt: BFloat16, op: Sum, a: 256.0, b: 1.0, want: 256.0}, // 257 ties to even 256
		{dt: BFloat16, op: Sum, a: 256.0, b: 3.0, want: 260.0}, // 259 ties to even 260
		{dt: BFloat16, op: Sum, a: negZero, b: negZero, want: negZero},
		{dt: Float16, op: Sum, a: 65504.0, b: 16.0, want: inf}, // 65520 ties away to Inf
		{dt: Float16, op: Sum, a: 65504.0, b: 8.0, want: 65504.0},
		{dt: Float16, op: Sum, a: -65504.0, b: -32.0, want: -inf},
		{dt: Float16, op: Sum, a: tiny, b: tiny, want: 2 * tiny},
		{dt: Float16, op: Prod, a: tiny, b: 0.5, want: 0.0},          // 2^-25 ties to even 0
		{dt: Float16, op: Prod, a: 3 * tiny, b: 0.5, want: 2 * tiny}, // 1.5 quanta ties to 2
		{dt: Float16, op: Prod, a: -tiny, b: 0.75, want: -tiny},
		{dt: Float16, op: Prod, a: -tiny, b: tiny, want: negZero},
		{dt: Float16, op: Sum, a: math.Ldexp(1023, -24), b: tiny, want: math.Ldexp(1, -14)}, // subnormal carries to normal
		{dt: Float16, op: Max, a: nan, b: 1.0, wantNaN: true},
		{dt: Float16, op: Sum, a: inf, b: -inf, wantNaN: true},
		{dt: Int32, op: Sum, a: math.MaxInt32, b: 1, want: math.MinInt32},
		{dt: Int32, op: Sum, a: math.MinInt32, b: -1, want: math.MaxInt32},
		{dt: Int32, op: Prod, a: math.MinInt32, b: -1, want: math.MinInt32},
		{dt: Int32, op: Prod, a: 65536, b: 65536, want: 0},
		{dt: Int32, op: Max, a: -5, b: -7, want: -5},
		{dt: Int32, op: Min, a: -5, b: 3, want: -5},
		{dt: Int64, op: Sum, a: int64(math.MaxInt64), b: 1, want: int64(math.MinInt64)},
		{dt: Int64, op: Prod, a: int64(1) << 62, b: 4, want: 0},
		{dt: Int64, op: Prod, a: int64(math.MaxInt64), b: 2, want: -2},
		{dt: Int64, op: Min, a: int64(math.MinInt64), b: 0, want: int64(math.MinInt64)},
		{dt: Uint8, op: Sum, a: 200, b: 100, want: 44},
		{dt: Uint8, op: Avg, a: 255, b: 255, want: 254},
		{dt: Uint8, op: Prod, a: 16, b: 16, want: 0},
		{dt: Uint8, op: Prod, a: 15, b: 17, want: 255},
		{dt: Uint8, op: Max, a: 255, b: 0, want: 255},
		{dt: Uint8, op: Min, a: 255, b: 1, want: 1},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/%s/%v,%v", c.dt, c.op, c.a, c.b), func(t *testing.T) {
			// Place the pair at every position of a 17-element buffer so both
			// the unrolled body and the tail (and SWAR lanes) see it.
			const n = 17
			for pos := range n {
				es := c.dt.Size()
				dst, src := make([]byte, n*es), make([]byte, n*es)
				copy(dst[pos*es:], enc(c.dt, c.a))
				copy(src[pos*es:], enc(c.dt, c.b))
				if err := Reduce(c.dt, c.op, dst, src); err != nil {
					t.Fatal(err)
				}
				got := dst[pos*es : (pos+1)*es]
				if c.wantNaN {
					if g := getElem(c.dt, got); !math.IsNaN(g.f) {
						t.Fatalf("pos %d: got %v, want NaN", pos, g)
					}
					continue
				}
				if want := enc(c.dt, c.want); !bytes.Equal(got, want) {
					t.Fatalf("pos %d: got %x (%v), want %x (%v)", pos, got, getElem(c.dt, got), want, c.want)
				}
			}
		})
	}
}

func TestReduceInvalidArguments(t *testing.T) {
	buf := func(n int) []byte { return bytes.Repeat([]byte{1}, n) }
	shared := buf(64)
	cases := []struct {
		name string
		dst  []byte
		call func(dst []byte) error
	}{
		{"ReduceTo lengths differ", buf(16), func(d []byte) error { return ReduceTo(Float32, Sum, d, buf(16), buf(12)) }},
		{"ReduceTo dst shorter", buf(12), func(d []byte) error { return ReduceTo(Float32, Sum, d, buf(16), buf(16)) }},
		{"Reduce lengths differ", buf(16), func(d []byte) error { return Reduce(Int64, Sum, d, buf(8)) }},
		{"partial float32", buf(6), func(d []byte) error { return Reduce(Float32, Sum, d, buf(6)) }},
		{"partial float64", buf(12), func(d []byte) error { return Reduce(Float64, Max, d, buf(12)) }},
		{"partial float16", buf(3), func(d []byte) error { return ReduceTo(Float16, Sum, d, buf(3), buf(3)) }},
		{"dtype zero", buf(8), func(d []byte) error { return Reduce(0, Sum, d, buf(8)) }},
		{"dtype out of range", buf(8), func(d []byte) error { return Reduce(Uint8+1, Sum, d, buf(8)) }},
		{"op zero", buf(8), func(d []byte) error { return Reduce(Int32, 0, d, buf(8)) }},
		{"op out of range", buf(8), func(d []byte) error { return ReduceTo(Int32, Avg+1, d, buf(8), buf(8)) }},
		{"dst overlaps a", shared[4:36], func(d []byte) error { return ReduceTo(Int32, Sum, d, shared[0:32], buf(32)) }},
		{"dst overlaps b", shared[0:32], func(d []byte) error { return ReduceTo(Uint8, Sum, d, buf(32), shared[31:63]) }},
		{"dst overlaps src", shared[8:24], func(d []byte) error { return Reduce(Float64, Sum, d, shared[16:32]) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := bytes.Clone(c.dst)
			if err := c.call(c.dst); !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("got %v, want ErrInvalidArgument", err)
			}
			if !bytes.Equal(c.dst, before) {
				t.Fatal("dst modified by a rejected call")
			}
		})
	}
}

// TestAligned pins the guard of the typed fast path: amd64 tolerates
// misaligned typed loads, so a wrong guard would not show in results there.
func TestAligned(t *testing.T) {
	b := make([]byte, 72)
	b = b[(8-uintptr(unsafe.Pointer(&b[0]))%8)%8:] // start 8-byte aligned on every platform
	for _, c := range []struct {
		align uintptr
		bufs  [][]byte
		want  bool
	}{
		{4, [][]byte{b, b[4:], b[8:]}, true},
		{4, [][]byte{b, b[4:], b[9:]}, false},
		{8, [][]byte{b[8:], b[16:]}, true},
		{8, [][]byte{b[4:], b[16:]}, false},
		{4, [][]byte{b[2:]}, false},
	} {
		if got := aligned(c.align, c.bufs...); got != c.want {
			t.Errorf("aligned(%d, ...) = %v, want %v", c.align, got, c.want)
		}
	}
}

func TestReduceUnalignedMatchesAligned(t *testing.T) {
	offsets := [][2]int{{1, 0}, {0, 1}, {1, 1}, {3, 2}, {4, 4}, {2, 6}}
	for _, dt := range allDTypes {
		for _, op := range allOps {
			t.Run(fmt.Sprintf("%s/%s", dt, op), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(dt)*7, uint64(op)))
				const n = 300 // more than one portable chunk
				size := n * dt.Size()
				a, b := randomBufS(rng, dt, size, true), randomBufS(rng, dt, size, true)
				want := bytes.Clone(a)
				if err := Reduce(dt, op, want, b); err != nil {
					t.Fatal(err)
				}
				for _, off := range offsets {
					dst := make([]byte, size+8)[off[0]:][:size]
					src := make([]byte, size+8)[off[1]:][:size]
					copy(dst, a)
					copy(src, b)
					if err := Reduce(dt, op, dst, src); err != nil {
						t.Fatal(err)
					}
					sameElems(t, dt, dst, want)
				}
			})
		}
	}
}

func TestReduceToAliasing(t *testing.T) {
	for _, dt := range allDTypes {
		for _, op := range allOps {
			t.Run(fmt.Sprintf("%s/%s", dt, op), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(dt)*13, uint64(op)))
				size := 45 * dt.Size()
				a, b := randomBufS(rng, dt, size, true), randomBufS(rng, dt, size, true)
				aOrig, bOrig := bytes.Clone(a), bytes.Clone(b)
				want := reference(dt, op, a, b)

				dst := make([]byte, size)
				if err := ReduceTo(dt, op, dst, a, b); err != nil {
					t.Fatal(err)
				}
				sameElems(t, dt, dst, want)
				if !bytes.Equal(a, aOrig) || !bytes.Equal(b, bOrig) {
					t.Fatal("ReduceTo modified an operand")
				}

				x := bytes.Clone(a) // dst aliases a
				if err := ReduceTo(dt, op, x, x, b); err != nil {
					t.Fatal(err)
				}
				sameElems(t, dt, x, want)

				y := bytes.Clone(b) // dst aliases b
				if err := ReduceTo(dt, op, y, a, y); err != nil {
					t.Fatal(err)
				}
				sameElems(t, dt, y, want)

				z := bytes.Clone(a) // dst, a and b all alias
				if err := ReduceTo(dt, op, z, z, z); err != nil {
					t.Fatal(err)
				}
				sameElems(t, dt, z, reference(dt, op, a, a))
			})
		}
	}
}

func TestFinish(t *testing.T) {
	negZero := math.Copysign(0, -1)
	cases := []struct {
		dt   DType
		in   []any
		n    int
		want []any
	}{
		{Float32, []any{3.0, -7.0, 1.0, negZero}, 2, []any{1.5, -3.5, 0.5, negZero}},
		{Float32, []any{1.0}, 3, []any{float64(float32(1.0 / 3))}},
		{Float64, []any{1.0, -9.0}, 3, []any{1.0 / 3, -3.0}},
		{BFloat16, []any{3.0, -1.0}, 2, []any{1.5, -0.5}},
		{BFloat16, []any{1.0}, 3, []any{float64(BF16ToF32(0x3eab))}},  // 1/3 rounded
		{Float16, []any{3.0, math.Ldexp(1, -24)}, 2, []any{1.5, 0.0}}, // tie to even 0
		{Float16, []any{1.0}, 3, []any{float64(F16ToF32(0x3555))}},
		{Int32, []any{-7, 7, 5, math.MinInt32}, 2, []any{-3, 3, 2, math.MinInt32 / 2}},
		{Int32, []any{-1, 1, math.MaxInt32}, math.MaxInt, []any{0, 0, math.MaxInt32 / math.MaxInt}},
		{Int64, []any{int64(math.MinInt64), int64(-10)}, 3, []any{int64(math.MinInt64 / 3), int64(-3)}},
		{Uint8, []any{255, 7}, 2, []any{127, 3}},
		{Uint8, []any{255}, 1000, []any{0}},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/%v/%d", c.dt, c.in, c.n), func(t *testing.T) {
			var buf, want []byte
			for i := range c.in {
				buf = append(buf, enc(c.dt, c.in[i])...)
				want = append(want, enc(c.dt, c.want[i])...)
			}
			unchanged := bytes.Clone(buf)
			for _, op := range []Op{Sum, Prod, Max, Min} {
				if err := Finish(c.dt, op, buf, c.n); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(buf, unchanged) {
					t.Fatalf("Finish with %s changed the buffer", op)
				}
			}
			if err := Finish(c.dt, Avg, buf, c.n); err != nil {
				t.Fatal(err)
			}
			sameElems(t, c.dt, buf, want)
		})
	}
}

func TestFinishErrors(t *testing.T) {
	buf := []byte{1, 2, 3, 4}
	for _, c := range []struct {
		name string
		dt   DType
		op   Op
		buf  []byte
		n    int
	}{
		{"n zero", Float32, Avg, buf, 0},
		{"n negative", Int32, Avg, buf, -2},
		{"partial element", Float64, Avg, buf, 2},
		{"partial element, not avg", Float64, Sum, buf, 2},
		{"bad dtype", 0, Avg, buf, 2},
		{"bad op", Float32, 0, buf, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := Finish(c.dt, c.op, c.buf, c.n); !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("got %v, want ErrInvalidArgument", err)
			}
			if !bytes.Equal(buf, []byte{1, 2, 3, 4}) {
				t.Fatal("buffer modified by a rejected call")
			}
		})
	}
	// n is irrelevant, and therefore not checked, for ops other than Avg.
	if err := Finish(Float32, Max, buf, 0); err != nil {
		t.Fatalf("Finish(Max, n=0): %v", err)
	}
}

// TestAvgEndToEnd accumulates k contributions with Avg, as a collective would,
// and checks Finish yields the mean.
func TestAvgEndToEnd(t *testing.T) {
	const k, n = 5, 33
	for _, dt := range allDTypes {
		t.Run(dt.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(dt), 99))
			contrib := make([][]byte, k)
			for i := range contrib {
				contrib[i] = randomBuf(rng, dt, n*dt.Size())
			}
			acc := bytes.Clone(contrib[0])
			want := bytes.Clone(contrib[0])
			for _, c := range contrib[1:] {
				if err := Reduce(dt, Avg, acc, c); err != nil {
					t.Fatal(err)
				}
				want = reference(dt, Sum, want, c)
			}
			if err := Finish(dt, Avg, acc, k); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < len(want); i += dt.Size() {
				e := getElem(dt, want[i:])
				if isFloat(dt) {
					e.f /= k
				} else {
					e.i /= k // truncates toward zero, like the kernel
				}
				putElem(dt, want[i:], e)
			}
			sameElems(t, dt, acc, want)
		})
	}
}

func TestZeroAllocations(t *testing.T) {
	for _, dt := range allDTypes {
		for _, off := range []int{0, 1} {
			size := 1000 * dt.Size()
			rng := rand.New(rand.NewPCG(1, uint64(dt)))
			a := randomBuf(rng, dt, size+1)[off:][:size]
			b := randomBuf(rng, dt, size)
			dst := make([]byte, size)
			for _, op := range allOps {
				allocs := testing.AllocsPerRun(20, func() {
					if err := Reduce(dt, op, a, b); err != nil {
						t.Fatal(err)
					}
					if err := ReduceTo(dt, op, dst, a, b); err != nil {
						t.Fatal(err)
					}
					if err := Finish(dt, op, dst, 3); err != nil {
						t.Fatal(err)
					}
				})
				if allocs != 0 {
					t.Errorf("%s/%s offset %d: %v allocations per run, want 0", dt, op, off, allocs)
				}
			}
		}
	}
}
