package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/a2a-moe/a2a/a2a"
)

// benchOpNames are the operations `a2ad bench --op` measures. Sizes follow
// nccl-tests: alltoallv/alltoall/gather/scatter/allgather take bytes per peer
// block; allreduce/reduce/broadcast/reducescatter take bytes of the buffer
// each rank passes.
var benchOpNames = []string{"alltoallv", "alltoall", "allreduce", "reducescatter", "allgather", "broadcast",
	"reduce", "gather", "scatter", "barrier"}

// collective is one measured operation: the call, the check of its result,
// the bytes counted by algbw, and busbw's factor (nccl-tests' conventions).
type collective struct {
	call      func(ctx context.Context) error
	verify    func() bool
	algBytes  int
	busFactor float64
}

// floatInput is element i of rank r's reduction input: a small integer, so
// float32 sums are exact and the check can be exact too.
func floatInput(r, i int) float32 { return float32((r+i)%7 - 3) }

func fillFloats(b []byte, r, first int) {
	for i := 0; i < len(b)/4; i++ {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(floatInput(r, first+i)))
	}
}

// sumOK checks b against the sum over ranks of floatInput(r, first+i).
func sumOK(b []byte, n, first int) bool {
	for i := 0; i < len(b)/4; i++ {
		var want float32
		for r := range n {
			want += floatInput(r, first+i)
		}
		if math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) != want {
			return false
		}
	}
	return true
}

func blockOK(b []byte, src int) bool {
	for k := range b {
		if b[k] != pattern(src, 0, k) {
			return false
		}
	}
	return true
}

func fillBlock(b []byte, src int) {
	for k := range b {
		b[k] = pattern(src, 0, k)
	}
}

// collectiveFor sets up the buffers of a non-alltoall op at one size.
func (b *bench) collectiveFor(size int) (collective, error) {
	c, n, r := b.c, b.c.Size(), b.c.Rank()
	root := 0
	nf := n - 1
	switch b.f.op {
	case "allreduce", "reduce":
		size -= size % 4
		b.send, b.recv = b.data(b.send, size), b.data(b.recv, size)
		fillFloats(b.send, r, 0)
		op := collective{algBytes: size, busFactor: 1}
		if b.f.op == "allreduce" {
			op.busFactor = 2 * float64(nf) / float64(n)
			op.call = func(ctx context.Context) error { return c.AllReduce(ctx, b.send, b.recv, a2a.Float32, a2a.Sum) }
			op.verify = func() bool { return sumOK(b.recv, n, 0) }
		} else {
			op.call = func(ctx context.Context) error { return c.Reduce(ctx, b.send, b.recv, a2a.Float32, a2a.Sum, root) }
			op.verify = func() bool { return r != root || sumOK(b.recv, n, 0) }
		}
		return op, nil
	case "reducescatter":
		size -= size % (4 * n)
		b.send, b.recv = b.data(b.send, size), b.data(b.recv, size/n)
		fillFloats(b.send, r, 0)
		return collective{algBytes: size, busFactor: float64(nf) / float64(n),
			call:   func(ctx context.Context) error { return c.ReduceScatter(ctx, b.send, b.recv, a2a.Float32, a2a.Sum) },
			verify: func() bool { return sumOK(b.recv, n, r*len(b.recv)/4) }}, nil
	case "allgather":
		b.send, b.recv = b.data(b.send, size), b.data(b.recv, n*size)
		fillBlock(b.send, r)
		return collective{algBytes: n * size, busFactor: float64(nf) / float64(n),
			call: func(ctx context.Context) error { return c.AllGather(ctx, b.send, b.recv) },
			verify: func() bool {
				for i := range n {
					if !blockOK(b.recv[i*size:(i+1)*size], i) {
						return false
					}
				}
				return true
			}}, nil
	case "broadcast":
		b.recv = b.data(b.recv, size)
		return collective{algBytes: size, busFactor: 1,
			call: func(ctx context.Context) error {
				if r == root {
					fillBlock(b.recv, root)
				}
				return c.Broadcast(ctx, b.recv, root)
			},
			verify: func() bool { return blockOK(b.recv, root) }}, nil
	case "gather":
		b.send, b.recv = b.data(b.send, size), b.data(b.recv, n*size)
		fillBlock(b.send, r)
		return collective{algBytes: n * size, busFactor: float64(nf) / float64(n),
			call: func(ctx context.Context) error { return c.Gather(ctx, b.send, b.recv, root) },
			verify: func() bool {
				for i := range n {
					if r == root && !blockOK(b.recv[i*size:(i+1)*size], i) {
						return false
					}
				}
				return true
			}}, nil
	case "scatter":
		b.send, b.recv = b.data(b.send, n*size), b.data(b.recv, size)
		if r == root {
			for i := range n {
				fillBlock(b.send[i*size:(i+1)*size], i)
			}
		}
		return collective{algBytes: n * size, busFactor: float64(nf) / float64(n),
			call:   func(ctx context.Context) error { return c.Scatter(ctx, b.send, b.recv, root) },
			verify: func() bool { return blockOK(b.recv, r) }}, nil
	case "barrier":
		return collective{call: c.Barrier, verify: func() bool { return true }}, nil
	}
	return collective{}, fmt.Errorf("no setup for --op %s", b.f.op)
}
