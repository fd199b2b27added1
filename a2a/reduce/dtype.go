package reduce

import (
	"fmt"
	"strings"
)

// DType is the element type of a reduction buffer. The zero value is invalid so
// that an unset field in a request is caught rather than read as float32.
type DType uint8

// Element types. Every type is encoded little-endian on the wire and in buffers.
const (
	Float32  DType = iota + 1 // IEEE 754 binary32
	Float64                   // IEEE 754 binary64
	BFloat16                  // bfloat16 (top half of a binary32), reduced in float32
	Float16                   // IEEE 754 binary16, reduced in float32
	Int32                     // two's complement, wrap-around
	Int64                     // two's complement, wrap-around
	Uint8                     // unsigned byte, wrap-around
)

var dtypeNames = [...]string{"", "float32", "float64", "bfloat16", "float16", "int32", "int64", "uint8"}
var dtypeSizes = [...]int{0, 4, 8, 2, 2, 4, 8, 1}

// Valid reports whether d is one of the defined element types.
func (d DType) Valid() bool { return d >= Float32 && d <= Uint8 }

// Size is the encoded size of one element in bytes, or 0 for an invalid DType.
func (d DType) Size() int {
	if !d.Valid() {
		return 0
	}
	return dtypeSizes[d]
}

// String returns the canonical lower-case name ("float32", "bfloat16", ...).
func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("DType(%d)", uint8(d))
	}
	return dtypeNames[d]
}

// ParseDType parses a canonical name as returned by String, case-insensitively,
// or one of the common short forms (f32, fp32, f64, fp64, bf16, f16, fp16, half,
// i32, i64, u8, byte).
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "float32", "f32", "fp32":
		return Float32, nil
	case "float64", "f64", "fp64":
		return Float64, nil
	case "bfloat16", "bf16":
		return BFloat16, nil
	case "float16", "f16", "fp16", "half":
		return Float16, nil
	case "int32", "i32":
		return Int32, nil
	case "int64", "i64":
		return Int64, nil
	case "uint8", "u8", "byte":
		return Uint8, nil
	}
	return 0, fmt.Errorf("%w: unknown dtype %q", ErrInvalidArgument, s)
}

// Op is a reduction operator. The zero value is invalid.
type Op uint8

// Reduction operators.
const (
	Sum  Op = iota + 1 // a + b (integers wrap around)
	Prod               // a * b (integers wrap around)
	Max                // larger of a and b; NaN if either is NaN
	Min                // smaller of a and b; NaN if either is NaN
	Avg                // Sum while reducing, then Finish divides by the count
)

var opNames = [...]string{"", "sum", "prod", "max", "min", "avg"}

// Valid reports whether o is one of the defined operators.
func (o Op) Valid() bool { return o >= Sum && o <= Avg }

// String returns the canonical lower-case name ("sum", "prod", ...).
func (o Op) String() string {
	if !o.Valid() {
		return fmt.Sprintf("Op(%d)", uint8(o))
	}
	return opNames[o]
}

// ParseOp parses a name as returned by String, case-insensitively (so the
// MPI/NCCL spellings "SUM", "PROD", "MAX", "MIN", "AVG" work too), plus
// "product", "mean" and "average".
func ParseOp(s string) (Op, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "sum":
		return Sum, nil
	case "prod", "product":
		return Prod, nil
	case "max":
		return Max, nil
	case "min":
		return Min, nil
	case "avg", "mean", "average":
		return Avg, nil
	}
	return 0, fmt.Errorf("%w: unknown op %q", ErrInvalidArgument, s)
}
