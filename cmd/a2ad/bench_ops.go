package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/a2a-moe/a2a/a2a/reduce"
)

// benchOpNames are the operations `a2ad bench --op` measures. Sizes follow
// nccl-tests: alltoallv/alltoall/gather/scatter/allgather take bytes per peer
// block; allreduce/reduce/broadcast/reducescatter take bytes of the buffer
// each rank passes.
var benchOpNames = []string{"alltoallv", "alltoall", "allreduce", "reducescatter", "allgather", "broadcast",
	"reduce", "gather", "scatter", "barrier"}

// The values of --dtype (package reduce's element types) and --redop.
var (
	dtypeNames = []string{"float32", "float64", "bfloat16", "float16", "int32", "int64", "uint8"}
	redopNames = []string{"sum", "prod", "max", "min", "avg"}
)

// reduction reports whether op combines the ranks' data with a --redop.
func reduction(op string) bool {
	return op == "allreduce" || op == "reduce" || op == "reducescatter"
}

// rooted reports whether op has a root rank.
func rooted(op string) bool {
	return op == "broadcast" || op == "reduce" || op == "gather" || op == "scatter"
}

// busFactor is nccl-tests' bus bandwidth factor of op on n ranks: busbw =
// algbw * factor is the bandwidth each rank's link needs, comparable across
// ops and rank counts (nccl-tests' doc/PERFORMANCE.md).
func busFactor(op string, n int) float64 {
	switch op {
	case "allreduce":
		return 2 * float64(n-1) / float64(n)
	case "broadcast", "reduce":
		return 1
	case "barrier":
		return 0
	}
	// alltoall(v), allgather, reducescatter, gather, scatter.
	return float64(n-1) / float64(n)
}

// collective is one measured operation: the call, the check of its result,
// the bytes counted by algbw (nccl-tests' conventions) and the bytes of the
// size column after rounding to whole elements.
type collective struct {
	call     func(ctx context.Context) error
	wrong    func() int // wrong elements in this rank's result
	algBytes int
	size     int
}

// reduceInput is the value rank r contributes at element i of a reduction
// with op: small integers, so that every dtype holds the inputs, their sums
// and products exactly and a correct result does not depend on the order the
// ranks' contributions are combined in. Sums stay within +-3n (exact in
// bfloat16 up to 85 ranks); products are +-2^k with k <= n/8 (float16 up to
// 120 ranks); integers wrap the same in any order.
func reduceInput(op reduce.Op, r, i int) int64 {
	if op == reduce.Prod {
		switch {
		case (r+i)%8 == 0:
			return 2
		case (r+i)%3 == 0:
			return -1
		}
		return 1
	}
	return int64((r+i)%7 - 3)
}

// putElem stores v as element i of b, of type dt.
func putElem(b []byte, dt reduce.DType, i int, v int64) {
	switch dt {
	case reduce.Float32:
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
	case reduce.Float64:
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(float64(v)))
	case reduce.BFloat16:
		binary.LittleEndian.PutUint16(b[2*i:], reduce.F32ToBF16(float32(v)))
	case reduce.Float16:
		binary.LittleEndian.PutUint16(b[2*i:], reduce.F32ToF16(float32(v)))
	case reduce.Int32:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(v)))
	case reduce.Int64:
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	case reduce.Uint8:
		b[i] = uint8(v)
	}
}

// fillInput lays out rank r's reduction input: its elements first, first+1, ...
func fillInput(b []byte, dt reduce.DType, op reduce.Op, r, first int) {
	for i := range len(b) / dt.Size() {
		putElem(b, dt, i, reduceInput(op, r, first+i))
	}
}

// reduceWant computes into want the correct result of reducing n ranks'
// inputs at elements first, first+1, ...: the contributions combined one rank
// after the other by package reduce, then Avg's division. scratch has
// want's length.
func reduceWant(want, scratch []byte, dt reduce.DType, op reduce.Op, n, first int) error {
	fillInput(want, dt, op, 0, first)
	for r := 1; r < n; r++ {
		fillInput(scratch, dt, op, r, first)
		if err := reduce.Reduce(dt, op, want, scratch); err != nil {
			return err
		}
	}
	return reduce.Finish(dt, op, want, n)
}

// wrongElems counts the elements of es bytes in which got differs from want.
func wrongElems(got, want []byte, es int) int {
	wrong := 0
	for e := 0; e < len(got); e += es {
		end := min(e+es, len(got))
		if string(got[e:end]) != string(want[e:end]) {
			wrong++
		}
	}
	return wrong
}

// wrongPattern counts the elements of es bytes of b, the block src sent dst,
// in which some byte is not pattern(src, dst, k).
func wrongPattern(b []byte, src, dst, es int) int {
	wrong := 0
	for e := 0; e < len(b); e += es {
		for k := e; k < min(e+es, len(b)); k++ {
			if b[k] != pattern(src, dst, k) {
				wrong++
				break
			}
		}
	}
	return wrong
}

// wrongRecv counts the wrong elements of rank's AllToAllV receive buffer,
// laid out by the counts col (whole elements).
func wrongRecv(buf []byte, rank int, col []int, es int) int {
	wrong, off := 0, 0
	for src, n := range col {
		wrong += wrongPattern(buf[off:off+n], src, rank, es)
		off += n
	}
	return wrong
}

func fillBlock(b []byte, src int) {
	for k := range b {
		b[k] = pattern(src, 0, k)
	}
}

// wrongBlocks counts the wrong elements of b, n blocks of size bytes, block
// i from rank i.
func wrongBlocks(b []byte, n, size, es int) int {
	wrong := 0
	for i := range n {
		wrong += wrongPattern(b[i*size:(i+1)*size], i, 0, es)
	}
	return wrong
}

// collectiveFor sets up the buffers of a non-alltoall op at one size,
// rounded down to whole elements (of n blocks for reducescatter).
func (b *bench) collectiveFor(size int) (collective, error) {
	c, n, r := b.c, b.c.Size(), b.c.Rank()
	dt, op, root, es := b.dtype, b.redop, b.f.root, b.dtype.Size()
	switch b.f.op {
	case "allreduce", "reduce", "reducescatter":
		size -= size % es
		out := size
		first := 0 // the result's first element
		if b.f.op == "reducescatter" {
			size -= size % (es * n)
			out, first = size/n, r*size/n/es
		}
		b.send, b.recv = b.data(b.send, size), b.data(b.recv, out)
		fillInput(b.send, dt, op, r, 0)
		b.want, b.scratch = grow(b.want, out), grow(b.scratch, out)
		if err := reduceWant(b.want, b.scratch, dt, op, n, first); err != nil {
			return collective{}, err
		}
		co := collective{algBytes: size, size: size, wrong: func() int { return wrongElems(b.recv, b.want, es) }}
		switch b.f.op {
		case "allreduce":
			co.call = func(ctx context.Context) error { return c.AllReduce(ctx, b.send, b.recv, dt, op) }
		case "reduce":
			co.call = func(ctx context.Context) error { return c.Reduce(ctx, b.send, b.recv, dt, op, root) }
			if r != root {
				co.wrong = func() int { return 0 }
			}
		default:
			co.call = func(ctx context.Context) error { return c.ReduceScatter(ctx, b.send, b.recv, dt, op) }
		}
		return co, nil
	case "allgather":
		size -= size % es
		b.send, b.recv = b.data(b.send, size), b.data(b.recv, n*size)
		fillBlock(b.send, r)
		return collective{algBytes: n * size, size: size,
			call:  func(ctx context.Context) error { return c.AllGather(ctx, b.send, b.recv) },
			wrong: func() int { return wrongBlocks(b.recv, n, size, es) }}, nil
	case "broadcast":
		size -= size % es
		b.recv = b.data(b.recv, size)
		return collective{algBytes: size, size: size,
			call: func(ctx context.Context) error {
				if r == root {
					fillBlock(b.recv, root)
				}
				return c.Broadcast(ctx, b.recv, root)
			},
			wrong: func() int { return wrongPattern(b.recv, root, 0, es) }}, nil
	case "gather":
		size -= size % es
		b.send, b.recv = b.data(b.send, size), b.data(b.recv, n*size)
		fillBlock(b.send, r)
		return collective{algBytes: n * size, size: size,
			call: func(ctx context.Context) error { return c.Gather(ctx, b.send, b.recv, root) },
			wrong: func() int {
				if r != root {
					return 0
				}
				return wrongBlocks(b.recv, n, size, es)
			}}, nil
	case "scatter":
		size -= size % es
		b.send, b.recv = b.data(b.send, n*size), b.data(b.recv, size)
		if r == root {
			for i := range n {
				fillBlock(b.send[i*size:(i+1)*size], i)
			}
		}
		return collective{algBytes: n * size, size: size,
			call:  func(ctx context.Context) error { return c.Scatter(ctx, b.send, b.recv, root) },
			wrong: func() int { return wrongPattern(b.recv, r, 0, es) }}, nil
	case "barrier":
		return collective{call: c.Barrier, wrong: func() int { return 0 }}, nil
	}
	return collective{}, fmt.Errorf("no setup for --op %s", b.f.op)
}

// parseDType reads --dtype: empty is the op's default, float32 for the
// reductions (as nccl-tests) and uint8 for the ops that move bytes, so
// that every size is whole elements.
func parseDType(name, op string) (reduce.DType, error) {
	if name == "" {
		if reduction(op) {
			return reduce.Float32, nil
		}
		return reduce.Uint8, nil
	}
	dt, err := reduce.ParseDType(name)
	if err != nil {
		return 0, fmt.Errorf("--dtype %q: %s", name, oneOf(dtypeNames))
	}
	return dt, nil
}

// parseRedop reads --redop.
func parseRedop(name string) (reduce.Op, error) {
	op, err := reduce.ParseOp(name)
	if err != nil || !slices.Contains(redopNames, op.String()) {
		return 0, fmt.Errorf("--redop %q: %s", name, oneOf(redopNames))
	}
	return op, nil
}
