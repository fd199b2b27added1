package reduce

import (
	"errors"
	"math"
	"testing"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

func TestViewsShareMemory(t *testing.T) {
	fs := []float32{1.5, -2, float32(math.Inf(1))}
	v, err := Float32s(AsBytes(fs))
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 3 || v[0] != 1.5 || v[1] != -2 || !math.IsInf(float64(v[2]), 1) {
		t.Fatalf("Float32s = %v, want %v", v, fs)
	}
	v[1] = 7
	if fs[1] != 7 {
		t.Errorf("a write through the view is not in the bytes: fs[1] = %v", fs[1])
	}

	ds := []float64{3.25, -1}
	if v, err := Float64s(AsBytes(ds)); err != nil || len(v) != 2 || v[0] != 3.25 || v[1] != -1 {
		t.Errorf("Float64s = %v, %v", v, err)
	}
	is := []int32{-5, math.MaxInt32}
	if v, err := Int32s(AsBytes(is)); err != nil || len(v) != 2 || v[0] != -5 || v[1] != math.MaxInt32 {
		t.Errorf("Int32s = %v, %v", v, err)
	}
	ls := []int64{math.MinInt64, 9}
	if v, err := Int64s(AsBytes(ls)); err != nil || len(v) != 2 || v[0] != math.MinInt64 || v[1] != 9 {
		t.Errorf("Int64s = %v, %v", v, err)
	}

	// Half precision: the bits as encoded, little-endian.
	b := []byte{0x80, 0x3f, 0x00, 0xc0} // bfloat16 1, -2
	h, err := BFloat16s(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 2 || BF16ToF32(h[0]) != 1 || BF16ToF32(h[1]) != -2 {
		t.Errorf("BFloat16s = %#x, want 1 and -2", h)
	}
	h[0] = F32ToBF16(0.5)
	if b[0] != 0x00 || b[1] != 0x3f {
		t.Errorf("bfloat16 0.5 written through the view: bytes % x, want 00 3f", b[:2])
	}
	if h, err := Float16s([]byte{0x00, 0x3c}); err != nil || len(h) != 1 || F16ToF32(h[0]) != 1 {
		t.Errorf("Float16s = %#x, %v; want float16 1", h, err)
	}
}

func TestViewsRefuseMisalignedAndPartial(t *testing.T) {
	buf := make([]byte, 64) // 8-aligned
	views := map[string]func([]byte) (int, error){
		"Float32s":  func(b []byte) (int, error) { v, err := Float32s(b); return len(v), err },
		"Float64s":  func(b []byte) (int, error) { v, err := Float64s(b); return len(v), err },
		"BFloat16s": func(b []byte) (int, error) { v, err := BFloat16s(b); return len(v), err },
		"Float16s":  func(b []byte) (int, error) { v, err := Float16s(b); return len(v), err },
		"Int32s":    func(b []byte) (int, error) { v, err := Int32s(b); return len(v), err },
		"Int64s":    func(b []byte) (int, error) { v, err := Int64s(b); return len(v), err },
	}
	sizes := map[string]int{"Float32s": 4, "Float64s": 8, "BFloat16s": 2, "Float16s": 2, "Int32s": 4, "Int64s": 8}
	for name, view := range views {
		size := sizes[name]
		if n, err := view(buf[size : 5*size]); err != nil || n != 4 {
			t.Errorf("%s of 4 aligned elements: %d, %v", name, n, err)
		}
		for _, bad := range [][]byte{buf[1 : 1+size], buf[:size+1], buf[:size-1]} {
			n, err := view(bad)
			if !errors.Is(err, ErrInvalidArgument) || !errors.Is(err, fault.ErrInvalidArgument) {
				t.Errorf("%s of %d bytes at offset %d: %d, %v; want an invalid-argument error", name, len(bad), cap(buf)-cap(bad), n, err)
			}
		}
		if n, err := view(nil); err != nil || n != 0 {
			t.Errorf("%s(nil): %d, %v", name, n, err)
		}
	}
}

// TestViewsOfMadeBuffers: what the view's doc promises of make, for every
// element count a small row might have.
func TestViewsOfMadeBuffers(t *testing.T) {
	for n := 1; n <= 40; n++ {
		if _, err := Float32s(make([]byte, 4*n)); err != nil {
			t.Fatalf("make([]byte, %d): %v", 4*n, err)
		}
		if _, err := Float64s(make([]byte, 8*n)); err != nil {
			t.Fatalf("make([]byte, %d): %v", 8*n, err)
		}
		if _, err := BFloat16s(make([]byte, 2*n)); err != nil {
			t.Fatalf("make([]byte, %d): %v", 2*n, err)
		}
	}
}

// TestErrorsMatchTheLibraryKind: a caller holding only a2a's sentinel
// (fault's) recognises every error of this package.
func TestErrorsMatchTheLibraryKind(t *testing.T) {
	_, perr := ParseDType("float8")
	for _, err := range []error{
		Reduce(Float32, Sum, make([]byte, 4), make([]byte, 8)),
		Reduce(0, Sum, nil, nil),
		perr,
	} {
		if !errors.Is(err, fault.ErrInvalidArgument) || !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%v: does not match both invalid-argument sentinels", err)
		}
		if errors.Is(err, fault.ErrMismatch) {
			t.Errorf("%v matches ErrMismatch", err)
		}
	}
	if errors.Is(fault.ErrInvalidArgument, ErrInvalidArgument) {
		t.Error("an a2a error outside this package matches reduce.ErrInvalidArgument")
	}
}
