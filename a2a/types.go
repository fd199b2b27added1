package a2a

import (
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// DType is the element type of reduction collectives: the same type as
// reduce.DType, whose constants (reduce.Float32, reduce.BFloat16, ...) name
// its values. Package reduce is the one home of the dtypes, with their typed
// views (reduce.Float32s, ...) and half-precision conversions.
type DType = reduce.DType

// Element types, kept so that existing calls compile.
//
// Deprecated: use reduce.Float32, reduce.Float64, ... (the same values: the
// library names each dtype once, in package reduce).
const (
	Float32  = reduce.Float32
	Float64  = reduce.Float64
	BFloat16 = reduce.BFloat16
	Float16  = reduce.Float16
	Int32    = reduce.Int32
	Int64    = reduce.Int64
	Uint8    = reduce.Uint8
)

// Op is a reduction operation, the same type as reduce.Op. Integer ops are
// exact (wrapping); bfloat16 and float16 reduce in float32 and round to
// nearest-even; Avg is Sum divided by the number of ranks at the end (integer
// division truncates toward zero).
type Op = reduce.Op

// Reduction operations, kept so that existing calls compile.
//
// Deprecated: use reduce.Sum, reduce.Prod, reduce.Max, reduce.Min and
// reduce.Avg (the same values).
const (
	Sum  = reduce.Sum
	Prod = reduce.Prod
	Max  = reduce.Max
	Min  = reduce.Min
	Avg  = reduce.Avg
)

// coll describes one collective call for validation, planning and reporting.
type coll struct {
	name      string // for reports and metrics ("allreduce")
	title     string // the API's name, for errors ("AllReduce")
	kind      transport.OpKind
	send      []byte
	recv      []byte
	counts    []int // V variants
	dt        DType
	op        Op
	root      int
	rooted    bool
	segmented bool // a segment of a large AllReduce
	reduction bool
	bytes     int // the planner's CollArgs.Bytes
}

// signature is carried in every frame of the collective (header Aux) so that
// ranks passing different roots, ops, dtypes or sizes fail with ErrMismatch.
func (k *coll) signature() uint64 {
	sig := uint64(uint16(k.root)) | uint64(k.op)<<16 | uint64(k.dt)<<24
	if k.counts == nil {
		sig |= uint64(uint32(k.bytes)) << 32
	}
	return sig
}
