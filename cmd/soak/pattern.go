package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
)

// pattern fills b with the bytes rank src sends rank dst in operation op of
// the run seeded with seed: every byte depends on all four and on its
// position, so a block delivered to the wrong rank, from the wrong rank, in
// the wrong operation or at the wrong offset does not pass the check.
func pattern(b []byte, seed uint64, op int64, src, dst int) {
	s := seed ^ uint64(op)*0x9e3779b97f4a7c15 ^ uint64(src+1)*0xc2b2ae3d27d4eb4f ^ uint64(dst+1)*0x165667b19e3779f9
	for len(b) >= 8 {
		s = s*6364136223846793005 + 1442695040888963407
		binary.LittleEndian.PutUint64(b, s^s>>29)
		b = b[8:]
	}
	s = s*6364136223846793005 + 1442695040888963407
	w := s ^ s>>29
	for i := range b {
		b[i] = byte(w >> (8 * i))
	}
}

// firstDiff is the index of the first byte where got and want differ, or -1.
func firstDiff(got, want []byte) int {
	if len(got) != len(want) {
		return min(len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return i
		}
	}
	return -1
}

// verifyError is a wrong byte, count or length: the soak's own finding, as
// opposed to an error the library returned.
type verifyError struct{ msg string }

func (e *verifyError) Error() string { return e.msg }

func wrong(format string, args ...any) error { return &verifyError{fmt.Sprintf(format, args...)} }

// check compares a received block with the expected one.
func check(what string, got, want []byte) error {
	if i := firstDiff(got, want); i >= 0 {
		if len(got) != len(want) {
			return wrong("%s: %d bytes, want %d", what, len(got), len(want))
		}
		return wrong("%s: byte %d of %d is %#02x, want %#02x", what, i, len(got), got[i], want[i])
	}
	return nil
}

// sizeOf draws a message size: empty, tiny, small (one LL slot or frame),
// medium and large (several 256 KiB frames and 512 KiB AllToAllV blocks),
// capped at limit.
func sizeOf(rng *rand.Rand, limit int) int {
	var n int
	switch x := rng.IntN(100); {
	case x < 6:
		n = 0
	case x < 30:
		n = 1 + rng.IntN(64)
	case x < 62:
		n = 65 + rng.IntN(4096-64)
	case x < 90:
		n = 4097 + rng.IntN(64<<10-4096)
	default:
		n = 64<<10 + 1 + rng.IntN(limit)
	}
	return min(n, limit)
}

// reduction is a reduction a soak operation runs: element type and operator.
type reduction struct {
	dt a2a.DType
	op a2a.Op
}

// drawReduction picks a type and an operator whose result does not depend
// on the order of reduction (small integer inputs keep float and half sums
// exact; products only of integers), so the expected result can be computed
// locally and compared bit for bit.
func drawReduction(rng *rand.Rand) reduction {
	dts := []a2a.DType{reduce.Float32, reduce.Float64, reduce.BFloat16, reduce.Float16, reduce.Int32, reduce.Int64, reduce.Uint8}
	dt := dts[rng.IntN(len(dts))]
	ops := []a2a.Op{reduce.Sum, reduce.Max, reduce.Min, reduce.Avg}
	if dt == reduce.Int32 || dt == reduce.Int64 || dt == reduce.Uint8 {
		ops = append(ops, reduce.Prod)
	}
	return reduction{dt: dt, op: ops[rng.IntN(len(ops))]}
}

// values fills b (whole elements of dt) with small integers, 0..15, that
// rank src contributes in op.
func values(b []byte, dt a2a.DType, seed uint64, op int64, src int) {
	size := dt.Size()
	s := seed ^ uint64(op)*0x9e3779b97f4a7c15 ^ uint64(src+1)*0xd6e8feb86659fd93
	for i := 0; i+size <= len(b); i += size {
		s = s*6364136223846793005 + 1442695040888963407
		v := int64(s>>59) & 15
		e := b[i : i+size]
		switch dt {
		case reduce.Float32:
			binary.LittleEndian.PutUint32(e, math.Float32bits(float32(v)))
		case reduce.Float64:
			binary.LittleEndian.PutUint64(e, math.Float64bits(float64(v)))
		case reduce.BFloat16:
			binary.LittleEndian.PutUint16(e, reduce.F32ToBF16(float32(v)))
		case reduce.Float16:
			binary.LittleEndian.PutUint16(e, reduce.F32ToF16(float32(v)))
		case reduce.Int32:
			binary.LittleEndian.PutUint32(e, uint32(v))
		case reduce.Int64:
			binary.LittleEndian.PutUint64(e, uint64(v))
		case reduce.Uint8:
			e[0] = byte(v)
		}
	}
}

// reduced computes into want the reduction of every rank's values, as the
// collective should, with scratch (len(want)) as working space.
func reduced(want, scratch []byte, r reduction, seed uint64, op int64, size int) error {
	values(want, r.dt, seed, op, 0)
	for src := 1; src < size; src++ {
		values(scratch, r.dt, seed, op, src)
		if err := reduce.Reduce(r.dt, r.op, want, scratch); err != nil {
			return err
		}
	}
	return reduce.Finish(r.dt, r.op, want, size)
}
