package reduce

import (
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestDTypeNames(t *testing.T) {
	sizes := map[DType]int{Float32: 4, Float64: 8, BFloat16: 2, Float16: 2, Int32: 4, Int64: 8, Uint8: 1}
	for _, dt := range allDTypes {
		if got := dt.Size(); got != sizes[dt] {
			t.Errorf("%s.Size() = %d, want %d", dt, got, sizes[dt])
		}
		for _, s := range []string{dt.String(), strings.ToUpper(dt.String()), " " + dt.String() + "\n"} {
			if got, err := ParseDType(s); err != nil || got != dt {
				t.Errorf("ParseDType(%q) = %v, %v; want %v", s, got, err, dt)
			}
		}
	}
	if len(sizes) != len(allDTypes) || Float32 != 1 || Uint8 != 7 {
		t.Fatal("dtype numbering changed; it is part of the wire format")
	}
	for s, want := range map[string]DType{"bf16": BFloat16, "fp16": Float16, "half": Float16, "f32": Float32, "FP64": Float64, "i32": Int32, "i64": Int64, "u8": Uint8, "byte": Uint8} {
		if got, err := ParseDType(s); err != nil || got != want {
			t.Errorf("ParseDType(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, dt := range []DType{0, 8, 255} {
		if dt.Valid() || dt.Size() != 0 || !strings.HasPrefix(dt.String(), "DType(") {
			t.Errorf("DType(%d): Valid %v, Size %d, String %q", uint8(dt), dt.Valid(), dt.Size(), dt.String())
		}
	}
	for _, s := range []string{"", "float8", "int16", "DType(1)"} {
		if _, err := ParseDType(s); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ParseDType(%q): got %v, want ErrInvalidArgument", s, err)
		}
	}
}

func TestOpNames(t *testing.T) {
	want := map[Op]string{Sum: "sum", Prod: "prod", Max: "max", Min: "min", Avg: "avg"}
	for _, op := range allOps {
		if op.String() != want[op] {
			t.Errorf("Op %d String %q, want %q", uint8(op), op.String(), want[op])
		}
		for _, s := range []string{op.String(), strings.ToUpper(op.String())} {
			if got, err := ParseOp(s); err != nil || got != op {
				t.Errorf("ParseOp(%q) = %v, %v; want %v", s, got, err, op)
			}
		}
	}
	if Sum != 1 || Avg != 5 {
		t.Fatal("op numbering changed; it is part of the wire format")
	}
	for s, op := range map[string]Op{"product": Prod, "mean": Avg, "Average": Avg} {
		if got, err := ParseOp(s); err != nil || got != op {
			t.Errorf("ParseOp(%q) = %v, %v; want %v", s, got, err, op)
		}
	}
	for _, op := range []Op{0, 6} {
		if op.Valid() || !strings.HasPrefix(op.String(), "Op(") {
			t.Errorf("Op(%d): Valid %v, String %q", uint8(op), op.Valid(), op.String())
		}
	}
	for _, s := range []string{"", "xor", "band"} {
		if _, err := ParseOp(s); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ParseOp(%q): got %v, want ErrInvalidArgument", s, err)
		}
	}
}

type myFloat float64
type myByte uint8

func TestDTypeOf(t *testing.T) {
	for _, c := range []struct {
		got, want DType
	}{
		{DTypeOf[float32](), Float32},
		{DTypeOf[float64](), Float64},
		{DTypeOf[int32](), Int32},
		{DTypeOf[int64](), Int64},
		{DTypeOf[uint8](), Uint8},
		{DTypeOf[myFloat](), Float64},
		{DTypeOf[myByte](), Uint8},
	} {
		if c.got != c.want {
			t.Errorf("got %v, want %v", c.got, c.want)
		}
	}
}

func TestAsBytes(t *testing.T) {
	fs := []float32{1.5, -2, float32(math.Inf(1))}
	b := AsBytes(fs)
	if len(b) != 12 {
		t.Fatalf("len %d, want 12", len(b))
	}
	for i, f := range fs {
		if got := binary.LittleEndian.Uint32(b[4*i:]); got != math.Float32bits(f) {
			t.Errorf("element %d: bytes %#x, want little-endian %#x", i, got, math.Float32bits(f))
		}
	}
	b[0], b[1], b[2], b[3] = 0, 0, 0x80, 0x3f // 1.0, written through the view
	if fs[0] != 1 {
		t.Errorf("write through AsBytes not visible: fs[0] = %v", fs[0])
	}
	if got := AsBytes([]int64(nil)); len(got) != 0 {
		t.Errorf("AsBytes(nil) has length %d", len(got))
	}

	// The typed path the a2a package will use: reduce typed slices in place.
	xs, ys := []int64{1, -2, math.MaxInt64}, []int64{10, 20, 1}
	if err := Reduce(DTypeOf[int64](), Sum, AsBytes(xs), AsBytes(ys)); err != nil {
		t.Fatal(err)
	}
	if xs[0] != 11 || xs[1] != 18 || xs[2] != math.MinInt64 {
		t.Errorf("typed Reduce: got %v", xs)
	}
	ms := []myFloat{1, 2}
	if err := Reduce(DTypeOf[myFloat](), Max, AsBytes(ms), AsBytes([]myFloat{3, -1})); err != nil {
		t.Fatal(err)
	}
	if ms[0] != 3 || ms[1] != 2 {
		t.Errorf("typed Max: got %v", ms)
	}
}
