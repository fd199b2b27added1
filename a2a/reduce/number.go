package reduce

import "unsafe"

// Number is the set of Go element types with a native DType (bfloat16 and
// float16 have no Go type; callers pass them as raw bytes).
type Number interface {
	~float32 | ~float64 | ~int32 | ~int64 | ~uint8
}

// DTypeOf returns the DType whose encoding matches T's memory layout.
func DTypeOf[T Number]() DType {
	var zero T
	// Size tells 1, 4 and 8 byte types apart; halving one tells floats from
	// integers. Both fold to constants in each instantiation.
	one := T(1)
	isFloat := one/2 != 0
	switch unsafe.Sizeof(zero) {
	case 1:
		return Uint8
	case 4:
		if isFloat {
			return Float32
		}
		return Int32
	default:
		if isFloat {
			return Float64
		}
		return Int64
	}
}

// AsBytes returns the memory of s as bytes, without copying: writes through
// either slice are visible in the other. The bytes are the host's in-memory
// encoding, which equals the little-endian encoding Reduce expects only on
// little-endian hosts (amd64, arm64 and the other platforms Go supports except
// s390x, ppc64 and big-endian mips); the collectives are only supported there.
func AsBytes[T Number](s []T) []byte {
	var zero T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(zero)))
}
