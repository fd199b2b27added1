package main

import (
	"testing"

	"github.com/a2a-moe/a2a/a2a/reduce"
)

// TestBusFactor: nccl-tests' bus bandwidth factors (doc/PERFORMANCE.md).
func TestBusFactor(t *testing.T) {
	for _, tc := range []struct {
		op   string
		n    int
		want float64
	}{
		{"allreduce", 4, 1.5}, // 2(n-1)/n
		{"allreduce", 2, 1},
		{"reducescatter", 4, 0.75}, // (n-1)/n
		{"allgather", 4, 0.75},
		{"alltoall", 4, 0.75},
		{"alltoallv", 8, 0.875},
		{"gather", 4, 0.75},
		{"scatter", 4, 0.75},
		{"broadcast", 4, 1},
		{"reduce", 4, 1},
		{"barrier", 4, 0},
		{"allreduce", 1, 0}, // one rank moves nothing over a bus
	} {
		if got := busFactor(tc.op, tc.n); got != tc.want {
			t.Errorf("busFactor(%s, %d) = %v, want %v", tc.op, tc.n, got, tc.want)
		}
	}
	for _, op := range benchOpNames {
		if busFactor(op, 4) < 0 || busFactor(op, 4) > 2 {
			t.Errorf("busFactor(%s, 4) = %v", op, busFactor(op, 4))
		}
	}
}

// TestNames: the dtype and redop lists of the help are package reduce's
// canonical names, and the default dtype of each op.
func TestNames(t *testing.T) {
	for _, name := range dtypeNames {
		if dt, err := parseDType(name, "allreduce"); err != nil || dt.String() != name {
			t.Errorf("--dtype %s: %v %v", name, dt, err)
		}
	}
	for _, name := range redopNames {
		if op, err := parseRedop(name); err != nil || op.String() != name {
			t.Errorf("--redop %s: %v %v", name, op, err)
		}
	}
	for _, op := range benchOpNames {
		want := reduce.Uint8
		if op == "allreduce" || op == "reduce" || op == "reducescatter" {
			want = reduce.Float32
		}
		if dt, _ := parseDType("", op); dt != want {
			t.Errorf("default dtype of %s: %v, want %v", op, dt, want)
		}
	}
}

// TestReduceCheck: a reduction result combined in another order than the
// check's reference (as the ring and tree algorithms do) has no wrong
// element, for every dtype and redop; each corrupted element counts once,
// however many of its bytes are wrong.
func TestReduceCheck(t *testing.T) {
	const n, elems, first = 7, 300, 11
	for _, dtName := range dtypeNames {
		for _, opName := range redopNames {
			dt, _ := parseDType(dtName, "allreduce")
			op, _ := parseRedop(opName)
			es := dt.Size()
			// The result combined from the last rank down, then Avg's
			// division: the reverse of the reference's order.
			got, scratch := make([]byte, elems*es), make([]byte, elems*es)
			fillInput(got, dt, op, n-1, first)
			for r := n - 2; r >= 0; r-- {
				fillInput(scratch, dt, op, r, first)
				if err := reduce.Reduce(dt, op, got, scratch); err != nil {
					t.Fatal(err)
				}
			}
			if err := reduce.Finish(dt, op, got, n); err != nil {
				t.Fatal(err)
			}
			want := make([]byte, elems*es)
			if err := reduceWant(want, scratch, dt, op, n, first); err != nil {
				t.Fatal(err)
			}
			if w := wrongElems(got, want, es); w != 0 {
				t.Errorf("%s %s: %d wrong elements in a correct result", dtName, opName, w)
			}
			// Corrupt 4 elements: in the first byte, the last byte, every
			// byte.
			got[0] ^= 0x40
			got[5*es+es-1] ^= 0x40
			got[299*es] ^= 0x40
			for k := range es {
				got[17*es+k] ^= 0x01
			}
			if w := wrongElems(got, want, es); w != 4 {
				t.Errorf("%s %s: %d wrong elements, want 4", dtName, opName, w)
			}
		}
	}
}

// TestPatternCheck: the check of the ops that move bytes counts the wrong
// elements of each source's block.
func TestPatternCheck(t *testing.T) {
	const rank = 2
	col := []int{8, 0, 16, 12} // bytes from each source: whole float32s
	buf := make([]byte, 36)
	off := 0
	for src, n := range col {
		for k := range n {
			buf[off+k] = pattern(src, rank, k)
		}
		off += n
	}
	for _, es := range []int{1, 4} {
		if w := wrongRecv(buf, rank, col, es); w != 0 {
			t.Errorf("es %d: %d wrong elements in a correct buffer", es, w)
		}
	}
	buf[1]++  // source 0, element 0
	buf[2]++  // source 0, element 0 (bytes 1 and 2), element 0 of 2 for es 1
	buf[8]++  // source 2, element 0
	buf[35]++ // source 3, last element
	for _, tc := range []struct{ es, want int }{{1, 4}, {4, 3}} {
		if w := wrongRecv(buf, rank, col, tc.es); w != tc.want {
			t.Errorf("es %d: %d wrong elements, want %d", tc.es, w, tc.want)
		}
	}
	// Blocks of the rooted and gathering ops: block i from rank i.
	blocks := make([]byte, 3*8)
	for i := range 3 {
		fillBlock(blocks[i*8:(i+1)*8], i)
	}
	if w := wrongBlocks(blocks, 3, 8, 2); w != 0 {
		t.Errorf("%d wrong elements in correct blocks", w)
	}
	blocks[9]++
	blocks[23]++
	if w := wrongBlocks(blocks, 3, 8, 2); w != 2 {
		t.Errorf("%d wrong elements, want 2", w)
	}
}
