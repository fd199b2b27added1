package algo

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/a2a-moe/a2a/a2a/reduce"
)

// testReducer runs the real kernels, so simulated reductions are the
// engine's.
func testReducer(dtype, op uint8, dst, src []byte) error {
	return reduce.Reduce(reduce.DType(dtype), reduce.Op(op), dst, src)
}

// reduceTypes are the dtype/op pairs the property tests draw from.
var reduceTypes = []struct {
	dt  reduce.DType
	ops []reduce.Op
}{
	{reduce.Float32, []reduce.Op{reduce.Sum, reduce.Prod, reduce.Max, reduce.Min}},
	{reduce.Int32, []reduce.Op{reduce.Sum, reduce.Prod, reduce.Max, reduce.Min}},
	{reduce.Uint8, []reduce.Op{reduce.Sum, reduce.Prod, reduce.Max, reduce.Min}},
}

// collCase is one simulated collective call.
type collCase struct {
	p, root, streams, block int
	e                       int // element size
	dt                      reduce.DType
	op                      reduce.Op
	bytes                   int   // Bytes of CollArgs
	counts                  []int // V variants
	hosts                   []int
	alias                   bool
}

func (c *collCase) String() string {
	return fmt.Sprintf("p=%d root=%d streams=%d block=%d e=%d dtype=%v op=%v bytes=%d counts=%v hosts=%v alias=%t",
		c.p, c.root, c.streams, c.block, c.e, c.dt, c.op, c.bytes, c.counts, c.hosts, c.alias)
}

func (c *collCase) args(r int) CollArgs {
	return CollArgs{Rank: r, World: c.p, Bytes: c.bytes, Counts: c.counts, ElemSize: c.e,
		DType: uint8(c.dt), Op: uint8(c.op), Root: c.root, Streams: c.streams, BlockSize: c.block, Hosts: c.hosts, InPlace: c.alias}
}

// blockOf is rank i's block (offset, length) in a World-block buffer: the
// counts' prefix sums for V variants, i·bytes otherwise.
func (c *collCase) blockOf(i int) (int, int) {
	if c.counts == nil {
		return i * c.bytes, c.bytes
	}
	off := 0
	for _, n := range c.counts[:i] {
		off += n
	}
	return off, c.counts[i]
}

func (c *collCase) total() int {
	off, n := c.blockOf(c.p - 1)
	return off + n
}

// collective describes one planner to the property test: its buffers, where
// its input lives, and what every rank must end with.
type collective struct {
	name  string
	algo  Algo
	plan  func(*Schedule, CollArgs) error
	needs collNeeds
	hier  bool // draw Hosts
	// bufs allocates rank r's send and recv (nil: the rank has none); with
	// c.alias they share memory the way the collective allows in place.
	bufs func(c *collCase, r int) (send, recv []byte)
	// inRecv: the input is the root's recv (broadcast), not send.
	inRecv bool
	// want is what rank r's recv must hold: exact bytes, or (reduced
	// non-nil) the reduction of these inputs; both nil: nothing to check.
	want func(c *collCase, in [][]byte, r int) (exact []byte, reduced [][]byte)
	// identical: every rank's recv must be the same bits (allreduce).
	identical bool
}

func allReduceBufs(c *collCase, r int) ([]byte, []byte) {
	recv := make([]byte, c.bytes)
	if c.alias {
		return recv, recv
	}
	return make([]byte, c.bytes), recv
}

func allReduceWant(c *collCase, in [][]byte, r int) ([]byte, [][]byte) { return nil, in }

func rootedRecv(c *collCase, r, n int) []byte {
	if r != c.root {
		return nil
	}
	return make([]byte, n)
}

func gatherBufs(c *collCase, r int) ([]byte, []byte) {
	off, n := c.blockOf(r)
	recv := rootedRecv(c, r, c.total())
	if c.alias && r == c.root {
		return recv[off : off+n], recv
	}
	return make([]byte, n), recv
}

func gatherWant(c *collCase, in [][]byte, r int) ([]byte, [][]byte) {
	if r != c.root {
		return nil, nil
	}
	return bytes.Join(in, nil), nil
}

func scatterBufs(c *collCase, r int) ([]byte, []byte) {
	off, n := c.blockOf(r)
	if r != c.root {
		return nil, make([]byte, n)
	}
	send := make([]byte, c.total())
	if c.alias {
		return send, send[off : off+n]
	}
	return send, make([]byte, n)
}

func scatterWant(c *collCase, in [][]byte, r int) ([]byte, [][]byte) {
	off, n := c.blockOf(r)
	return in[c.root][off : off+n], nil
}

func allGatherBufs(c *collCase, r int) ([]byte, []byte) {
	off, n := c.blockOf(r)
	recv := make([]byte, c.total())
	if c.alias {
		return recv[off : off+n], recv
	}
	return make([]byte, n), recv
}

var collectives = []collective{
	{name: "allreduce-ring", algo: AlgoRing, plan: PlanAllReduceRing, needs: collReduces,
		bufs: allReduceBufs, want: allReduceWant, identical: true},
	{name: "allreduce-recdoubling", algo: AlgoRecursiveDoubling, plan: PlanAllReduceRecursiveDoubling, needs: collReduces,
		bufs: allReduceBufs, want: allReduceWant, identical: true},
	{name: "allreduce-hierarchical", algo: AlgoHierarchical, plan: PlanAllReduceHierarchical, needs: collReduces, hier: true,
		bufs: allReduceBufs, want: allReduceWant, identical: true},
	{name: "allreduce-ll", algo: AlgoLL, plan: PlanAllReduceLL, needs: collReduces,
		bufs: allReduceBufs, want: allReduceWant, identical: true},
	{name: "reducescatter-ring", algo: AlgoRing, plan: PlanReduceScatterRing, needs: collReduces,
		bufs: func(c *collCase, r int) ([]byte, []byte) {
			send := make([]byte, c.bytes*c.p)
			if c.alias {
				return send, send[r*c.bytes : (r+1)*c.bytes]
			}
			return send, make([]byte, c.bytes)
		},
		want: func(c *collCase, in [][]byte, r int) ([]byte, [][]byte) {
			parts := make([][]byte, c.p)
			for i := range in {
				parts[i] = in[i][r*c.bytes : (r+1)*c.bytes]
			}
			return nil, parts
		}},
	{name: "allgather-ring", algo: AlgoRing, plan: PlanAllGatherRing,
		bufs: allGatherBufs, want: func(c *collCase, in [][]byte, r int) ([]byte, [][]byte) { return bytes.Join(in, nil), nil }},
	{name: "allgatherv-ring", algo: AlgoRing, plan: PlanAllGatherVRing, needs: collCounts,
		bufs: allGatherBufs, want: func(c *collCase, in [][]byte, r int) ([]byte, [][]byte) { return bytes.Join(in, nil), nil }},
	{name: "broadcast-tree", algo: AlgoTree, plan: PlanBroadcastTree, needs: collRooted, inRecv: true,
		bufs: func(c *collCase, r int) ([]byte, []byte) { return nil, make([]byte, c.bytes) },
		want: func(c *collCase, in [][]byte, r int) ([]byte, [][]byte) { return in[c.root], nil }},
	{name: "broadcast-scatterallgather", algo: AlgoScatterAllGather, plan: PlanBroadcastScatterAllGather, needs: collRooted, inRecv: true,
		bufs: func(c *collCase, r int) ([]byte, []byte) { return nil, make([]byte, c.bytes) },
		want: func(c *collCase, in [][]byte, r int) ([]byte, [][]byte) { return in[c.root], nil }},
	{name: "reduce-tree", algo: AlgoTree, plan: PlanReduceTree, needs: collReduces | collRooted,
		bufs: func(c *collCase, r int) ([]byte, []byte) {
			recv := rootedRecv(c, r, c.bytes)
			if c.alias && r == c.root {
				return recv, recv
			}
			return make([]byte, c.bytes), recv
		},
		want: func(c *collCase, in [][]byte, r int) ([]byte, [][]byte) {
			if r != c.root {
				return nil, nil
			}
			return nil, in
		}},
	{name: "gather-direct", algo: AlgoDirect, plan: PlanGatherDirect, needs: collRooted, bufs: gatherBufs, want: gatherWant},
	{name: "gatherv-direct", algo: AlgoDirect, plan: PlanGatherVDirect, needs: collRooted | collCounts, bufs: gatherBufs, want: gatherWant},
	{name: "scatter-direct", algo: AlgoDirect, plan: PlanScatterDirect, needs: collRooted, bufs: scatterBufs, want: scatterWant},
	{name: "scatterv-direct", algo: AlgoDirect, plan: PlanScatterVDirect, needs: collRooted | collCounts, bufs: scatterBufs, want: scatterWant},
}

var testWorlds = []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16}

// randomCase draws a call of collective cl: sizes around the chunking edges
// (0, below p elements, not divisible by p), small blocks so that messages
// are cut into frames (7 is rounded down to whole elements), and in-place
// buffers half of the time.
func randomCase(rng *rand.Rand, cl *collective) collCase {
	c := collCase{
		p:       testWorlds[rng.IntN(len(testWorlds))],
		streams: 1 + rng.IntN(2),
		block:   []int{8, 64, 7, 0}[rng.IntN(4)],
		e:       []int{1, 4}[rng.IntN(2)],
		alias:   rng.IntN(2) == 0,
	}
	c.root = rng.IntN(c.p)
	if cl.needs&collReduces != 0 {
		rt := reduceTypes[rng.IntN(len(reduceTypes))]
		c.dt, c.op = rt.dt, rt.ops[rng.IntN(len(rt.ops))]
		c.e = c.dt.Size()
	}
	elems := func() int {
		switch rng.IntN(6) {
		case 0:
			return 0
		case 1:
			return 1 + rng.IntN(c.p) // fewer elements than ranks (some chunks empty)
		case 2:
			return c.p*(1+rng.IntN(4)) + 1 + rng.IntN(max(1, c.p-1)) // not divisible by p
		case 3:
			if rng.IntN(8) == 0 {
				return 500 + rng.IntN(1500) // many frames per message
			}
			fallthrough
		default:
			return rng.IntN(160)
		}
	}
	if cl.needs&collCounts != 0 {
		c.counts = make([]int, c.p)
		for i := range c.counts {
			if rng.IntN(4) > 0 {
				c.counts[i] = rng.IntN(40) * c.e
			}
		}
		if rng.IntN(8) == 0 {
			clear(c.counts)
		}
	} else {
		c.bytes = elems() * c.e
	}
	if cl.hier {
		c.hosts = randomHosts(rng, c.p)
	}
	return c
}

// randomHosts draws a host layout: none, contiguous equal hosts,
// interleaved, random (uneven, maybe a single-rank host), one rank per host.
func randomHosts(rng *rand.Rand, p int) []int {
	h := make([]int, p)
	nh := 1 + rng.IntN(4)
	switch rng.IntN(5) {
	case 0:
		return nil
	case 1:
		per := max(1, p/nh)
		for i := range h {
			h[i] = 10 * (i / per) // ids need not be dense
		}
	case 2:
		for i := range h {
			h[i] = i % nh
		}
	case 3:
		for i := range h {
			h[i] = rng.IntN(nh)
		}
	case 4:
		for i := range h {
			h[i] = p - i
		}
	}
	return h
}

// fillInput writes random elements of dt (floats in a range where sums and
// products stay well inside float32) or random bytes.
func fillInput(rng *rand.Rand, b []byte, dt reduce.DType, op reduce.Op) {
	if dt == reduce.Float32 {
		for i := 0; i+4 <= len(b); i += 4 {
			v := float32(rng.Float64()*2 - 1)
			if op == reduce.Prod {
				v = float32(0.5 + rng.Float64()*1.5)
			}
			binary.LittleEndian.PutUint32(b[i:], math.Float32bits(v))
		}
		return
	}
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

// runCollCase plans every rank, checks each schedule's framing, simulates
// and checks every rank's result. scheds is reused across calls, so planning
// into used schedules is exercised too.
func runCollCase(t *testing.T, rng *rand.Rand, cl *collective, scheds []*Schedule, c collCase) {
	t.Helper()
	p := c.p
	send, recv, in := make([][]byte, p), make([][]byte, p), make([][]byte, p)
	for r := range p {
		a := c.args(r)
		if err := cl.plan(scheds[r], a); err != nil {
			t.Fatalf("%s %v: rank %d: plan: %v", cl.name, &c, r, err)
		}
		if scheds[r].Algo != cl.algo {
			t.Fatalf("%s %v: rank %d planned %v, want %v", cl.name, &c, r, scheds[r].Algo, cl.algo)
		}
		send[r], recv[r] = cl.bufs(&c, r)
		checkCollSchedule(t, cl.name, &c, r, scheds[r], send[r] != nil, recv[r] != nil)
		for i := range recv[r] {
			recv[r][i] = 0xA5 ^ byte(i*7)
		}
		input := send[r]
		if cl.inRecv {
			input = nil
			if r == c.root {
				input = recv[r]
			}
		}
		fillInput(rng, input, c.dt, c.op)
		in[r] = bytes.Clone(input)
	}
	if err := SimulateWith(scheds[:p], send, recv, testReducer); err != nil {
		t.Fatalf("%s %v: simulate: %v", cl.name, &c, err)
	}
	for r := range p {
		exact, reduced := cl.want(&c, in, r)
		switch {
		case reduced != nil:
			checkReduced(t, fmt.Sprintf("%s %v: rank %d", cl.name, &c, r), recv[r], reduced, c.dt, c.op)
		case exact != nil || recv[r] != nil:
			if !bytes.Equal(recv[r], exact) {
				t.Fatalf("%s %v: rank %d: recv\n%v\nwant\n%v", cl.name, &c, r, recv[r], exact)
			}
		}
		if cl.identical && !bytes.Equal(recv[r], recv[0]) {
			t.Fatalf("%s %v: rank %d's result differs from rank 0's:\n%v\n%v", cl.name, &c, r, recv[r], recv[0])
		}
	}
}

// checkReduced compares got with the reduction of parts: exactly for
// integers and for float Max/Min (order-independent), and for float Sum and
// Prod within the rounding error of p-1 float32 operations of a float64
// reference: |got-ref| <= p·2^-23·sum|x| (Sum) or p·2^-22·|ref| (Prod).
func checkReduced(t *testing.T, what string, got []byte, parts [][]byte, dt reduce.DType, op reduce.Op) {
	t.Helper()
	if len(got) != len(parts[0]) {
		t.Fatalf("%s: %d bytes, want %d", what, len(got), len(parts[0]))
	}
	if dt == reduce.Float32 && (op == reduce.Sum || op == reduce.Prod) {
		for i := 0; i+4 <= len(got); i += 4 {
			ref, mag := 0.0, 0.0
			if op == reduce.Prod {
				ref = 1
			}
			for _, x := range parts {
				v := float64(math.Float32frombits(binary.LittleEndian.Uint32(x[i:])))
				if op == reduce.Sum {
					ref += v
					mag += math.Abs(v)
				} else {
					ref *= v
				}
			}
			tol := float64(len(parts)) * mag * 0x1p-23
			if op == reduce.Prod {
				tol = float64(len(parts)) * math.Abs(ref) * 0x1p-22
			}
			g := float64(math.Float32frombits(binary.LittleEndian.Uint32(got[i:])))
			if math.Abs(g-ref) > tol {
				t.Fatalf("%s: element %d = %v, reference %v (tolerance %g)", what, i/4, g, ref, tol)
			}
		}
		return
	}
	want := bytes.Clone(parts[0])
	for _, x := range parts[1:] {
		if err := reduce.Reduce(dt, op, want, x); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: got\n%v\nwant\n%v", what, got, want)
	}
}

// checkCollSchedule checks one rank's schedule on its own: the framing rule
// (frame f of a message on stream f % Streams, full blocks but the last,
// Last on the final frame only), reduce frames of whole elements, no
// message to itself (the engine rejects those), and no step addressing a
// buffer the rank does not have.
func checkCollSchedule(t *testing.T, name string, c *collCase, r int, s *Schedule, hasSend, hasRecv bool) {
	t.Helper()
	a := c.args(r)
	block := a.block()
	f := 0 // frame index within the current message
	var cur *Step
	for i := range s.Steps {
		st := &s.Steps[i]
		for _, sp := range [2]Span{st.Src, st.Dst} {
			if sp.Len > 0 && (sp.Buf == BufSend && !hasSend || sp.Buf == BufRecv && !hasRecv) {
				t.Fatalf("%s %v: rank %d step %v addresses the %v buffer it does not have", name, c, r, st, sp.Buf)
			}
		}
		if st.Kind == StepCopy || st.Kind == StepReduce {
			if cur != nil {
				t.Fatalf("%s %v: rank %d: message to/from %d interrupted by %v", name, c, r, cur.Peer, st)
			}
			continue
		}
		if st.Peer == r {
			t.Fatalf("%s %v: rank %d talks to itself: %v", name, c, r, st)
		}
		if st.Kind == StepStore || st.Kind == StepLoad {
			// An LL message is one store of the whole block, not frames.
			if cur != nil {
				t.Fatalf("%s %v: rank %d: message to/from %d interrupted by %v", name, c, r, cur.Peer, st)
			}
			continue
		}
		if cur != nil && (st.Kind != cur.Kind || st.Peer != cur.Peer) {
			t.Fatalf("%s %v: rank %d: message to/from %d interrupted by %v", name, c, r, cur.Peer, st)
		}
		cur = st
		sp := st.Src
		if st.Kind == StepRecv {
			sp = st.Dst
		}
		if st.Stream != f%c.streams && !(s.Algo == AlgoDissemination && st.Stream == 0) {
			t.Fatalf("%s %v: rank %d: frame %d of a message on stream %d", name, c, r, f, st.Stream)
		}
		if sp.Len > block || !st.Last && sp.Len != block {
			t.Fatalf("%s %v: rank %d: frame %v of %d bytes with block %d", name, c, r, st, sp.Len, block)
		}
		if st.Kind == StepRecvReduce && (sp.Len%c.e != 0 || st.Dst.Len != sp.Len) {
			t.Fatalf("%s %v: rank %d: reduce frame %v splits an element", name, c, r, st)
		}
		f++
		if st.Last {
			f, cur = 0, nil
		}
	}
	if cur != nil {
		t.Fatalf("%s %v: rank %d: a message lacks its last frame", name, c, r)
	}
}

func newScheds(n int) []*Schedule {
	s := make([]*Schedule, n)
	for i := range s {
		s[i] = new(Schedule)
	}
	return s
}

// TestCollectiveProperty simulates every collective planner on random calls
// (see randomCase) against a sequential reference.
func TestCollectiveProperty(t *testing.T) {
	const cases = 1500
	for ci := range collectives {
		cl := &collectives[ci]
		t.Run(cl.name, func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(11, uint64(ci)))
			scheds := newScheds(16)
			aliased, reduced := 0, 0
			for range cases {
				c := randomCase(rng, cl)
				if c.alias {
					aliased++
				}
				if c.bytes > 0 || c.counts != nil {
					reduced++
				}
				runCollCase(t, rng, cl, scheds, c)
			}
			if aliased < cases/4 || reduced < cases/2 {
				t.Fatalf("%d in-place cases, %d with data, of %d", aliased, reduced, cases)
			}
		})
	}
}

// TestCollectiveEveryRoot sweeps every root of the rooted collectives over
// worlds up to 9 and a prime, for both even and uneven chunkings.
func TestCollectiveEveryRoot(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for ci := range collectives {
		cl := &collectives[ci]
		if cl.needs&collRooted == 0 {
			continue
		}
		scheds := newScheds(13)
		for _, p := range []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 13} {
			for root := range p {
				for _, elems := range []int{3 * p, 2*p + 1} {
					c := collCase{p: p, root: root, streams: 2, block: 8, e: 4, dt: reduce.Int32, op: reduce.Sum,
						bytes: 4 * elems, alias: root%2 == 0}
					if cl.needs&collCounts != 0 {
						c.counts = make([]int, p)
						for i := range c.counts {
							c.counts[i] = 4 * ((i*elems + root) % 7)
						}
					}
					runCollCase(t, rng, cl, scheds, c)
				}
			}
		}
	}
}

// TestAllReduceHostLayouts runs the hierarchical AllReduce on hand-picked
// layouts: equal hosts, uneven hosts (folds), a single-rank host (leader
// algorithm), interleaved ranks, and one rank per host.
func TestAllReduceHostLayouts(t *testing.T) {
	cl := &collectives[2]
	if cl.algo != AlgoHierarchical {
		t.Fatal("collectives[2] is not the hierarchical allreduce")
	}
	layouts := []struct {
		p     int
		hosts []int
	}{
		{8, []int{0, 0, 0, 0, 1, 1, 1, 1}},
		{12, []int{0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2}},
		{6, []int{5, 5, 5, 5, 5, 9}},
		{9, []int{0, 1, 2, 0, 1, 2, 0, 1, 2}},
		{4, []int{3, 2, 1, 0}},
		{9, []int{0, 0, 1, 1, 1, 1, 1, 1, 1}},
		{7, nil},
	}
	rng := rand.New(rand.NewPCG(9, 9))
	scheds := newScheds(16)
	for _, lay := range layouts {
		for _, op := range []reduce.Op{reduce.Sum, reduce.Max} {
			for _, elems := range []int{0, 5, 97} {
				c := collCase{p: lay.p, streams: 2, block: 16, e: 4, dt: reduce.Float32, op: op,
					bytes: 4 * elems, hosts: lay.hosts, alias: elems == 5}
				runCollCase(t, rng, cl, scheds, c)
			}
		}
	}
}
