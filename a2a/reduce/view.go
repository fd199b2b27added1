package reduce

import (
	"errors"
	"fmt"
	"unsafe"
)

// Typed views: the inverse of AsBytes. Token rows, receive buffers and expert
// outputs are []byte (a collective moves bytes); these functions give back
// the elements without copying, so writes through either slice are visible
// in the other, for as long as the bytes are valid (for a dispatch.Handle's
// buffers: until its Release).
//
// A view needs the bytes to start at a multiple of the element's alignment
// and to hold whole elements. Buffers from a2a.AllocBuffer (page-aligned),
// from make (Go's allocator places a buffer of whole elements at a multiple
// of the element's alignment) and a dispatch.Handle's Recv and Output,
// whose rows are a whole number of elements from an aligned start, all
// qualify, as do their row slices. A misaligned or partial buffer is an
// error matching ErrInvalidArgument (and a2a.ErrInvalidArgument) rather than
// a view that would fault or read torn elements on some architectures.
//
// The elements are the host's in-memory encoding, which is the little-endian
// encoding of the buffers only on little-endian hosts, the only ones the
// collectives support; on the others every view fails with
// errors.ErrUnsupported. bfloat16 and float16 have no Go type: their views
// are the raw bits as uint16 (convert with BF16ToF32, F32ToBF16, F16ToF32
// and F32ToF16). uint8 buffers need no view: they are the []byte itself.

// Float32s returns b as float32 elements (DType Float32), sharing b's memory.
func Float32s(b []byte) ([]float32, error) { return viewOf[float32](Float32, b) }

// Float64s returns b as float64 elements (DType Float64), sharing b's memory.
func Float64s(b []byte) ([]float64, error) { return viewOf[float64](Float64, b) }

// BFloat16s returns b as bfloat16 elements (DType BFloat16), each the raw
// bits in a uint16, sharing b's memory.
func BFloat16s(b []byte) ([]uint16, error) { return viewOf[uint16](BFloat16, b) }

// Float16s returns b as IEEE binary16 elements (DType Float16), each the raw
// bits in a uint16, sharing b's memory.
func Float16s(b []byte) ([]uint16, error) { return viewOf[uint16](Float16, b) }

// Int32s returns b as int32 elements (DType Int32), sharing b's memory.
func Int32s(b []byte) ([]int32, error) { return viewOf[int32](Int32, b) }

// Int64s returns b as int64 elements (DType Int64), sharing b's memory.
func Int64s(b []byte) ([]int64, error) { return viewOf[int64](Int64, b) }

// viewOf checks that b can be seen as elements of dt, whose Go type is T,
// and returns the view. An empty b gives a nil view.
func viewOf[T float32 | float64 | int32 | int64 | uint16](dt DType, b []byte) ([]T, error) {
	var zero T
	size, align := int(unsafe.Sizeof(zero)), unsafe.Alignof(zero)
	switch {
	case !hostLittleEndian:
		return nil, fmt.Errorf("reduce: a %s view of bytes needs a little-endian host: %w", dt, errors.ErrUnsupported)
	case len(b)%size != 0:
		return nil, fmt.Errorf("%w: %d bytes is not a whole number of %d-byte %s elements", ErrInvalidArgument, len(b), size, dt)
	case len(b) == 0:
		return nil, nil
	case !aligned(align, b):
		return nil, fmt.Errorf("%w: a %s view needs bytes aligned to %d, these start at address %#x (slice the buffer at a multiple of %d bytes from an aligned start)",
			ErrInvalidArgument, dt, align, uintptr(unsafe.Pointer(unsafe.SliceData(b))), size)
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/size), nil
}
