package algo

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// CollArgs is one rank's view of a collective other than AllToAllV. What
// Bytes and Counts mean depends on the collective (see each planner):
//
//	AllReduce      send Bytes, recv Bytes
//	ReduceScatter  send Bytes*World (block i for rank i), recv Bytes
//	AllGather      send Bytes, recv Bytes*World
//	AllGatherV     send Counts[Rank], recv sum(Counts), blocks at prefix sums
//	Broadcast      recv Bytes on every rank, holding the root's data at the root
//	Reduce         send Bytes, recv Bytes at the root (other ranks: none)
//	Gather(V)      send Bytes (Counts[Rank]), recv World*Bytes (sum(Counts)) at the root
//	Scatter(V)     send World*Bytes (sum(Counts)) at the root, recv Bytes (Counts[Rank])
//	Barrier        nothing
//
// Every rank of a collective must pass the same values except Rank (the
// receivers check every frame's length, so a disagreement is caught, but
// only as a mismatch at run time).
type CollArgs struct {
	Rank, World int
	Bytes       int   // n as defined per collective above; unused by the V variants
	Counts      []int // V variants: bytes of each rank's block (len World)
	ElemSize    int   // element size in bytes; chunks never split one (0 means 1; reducing collectives must set it)
	DType, Op   uint8 // reducing collectives: package reduce's DType and Op (opaque here)
	Root        int   // rooted collectives
	Streams     int   // streams per peer pair (>= 1)
	BlockSize   int   // max bytes per frame (0 = DefaultBlockSize), rounded down to whole elements
	Hosts       []int // host of every rank (hierarchical algorithms); nil means one host
	// InPlace says the caller passed one slice as send and recv, so a
	// schedule must not write BufRecv while it still reads BufSend.
	InPlace bool
}

// collNeeds says what a collective requires of its CollArgs beyond the
// fields every collective uses.
type collNeeds uint8

const (
	collReduces collNeeds = 1 << iota // ElemSize, DType and Op must be set
	collRooted                        // Root must name a rank
	collCounts                        // Counts holds every rank's block size
	collNoData                        // Bytes and Counts must be empty
)

// validate reports arguments that no algorithm of collective name can plan.
// Everything it checks is local, so a bad call is rejected before any byte
// moves. The checks are cheap and have no effects, so all of them run and
// the first failure, in the order below, is reported.
func (a *CollArgs) validate(name string, needs collNeeds) error {
	why := cmp.Or(
		a.checkShape(),
		a.checkReduction(needs),
		a.checkData(needs),
		a.checkRoot(needs),
		a.checkHosts(),
	)
	if why != "" {
		return fmt.Errorf("%s: %s", name, why)
	}
	return nil
}

// checkShape checks what every collective uses: world, rank, streams,
// block and element sizes. It returns why they are invalid, or "".
func (a *CollArgs) checkShape() string {
	switch {
	case a.World < 1:
		return fmt.Sprintf("world %d < 1", a.World)
	case a.Rank < 0 || a.Rank >= a.World:
		return fmt.Sprintf("rank %d out of range [0, %d)", a.Rank, a.World)
	case a.Streams < 1:
		return fmt.Sprintf("streams %d < 1", a.Streams)
	case a.BlockSize < 0:
		return fmt.Sprintf("block size %d < 0", a.BlockSize)
	case a.ElemSize < 0:
		return fmt.Sprintf("element size %d < 0", a.ElemSize)
	}
	return ""
}

// checkReduction checks that a reducing collective names its element size,
// type and operator. Zero is invalid in package reduce, so an unset field is
// caught here rather than as a kernel error mid-operation.
func (a *CollArgs) checkReduction(needs collNeeds) string {
	switch {
	case needs&collReduces == 0:
	case a.ElemSize == 0:
		return "element size unset (a reduction must not split elements)"
	case a.DType == 0:
		return "dtype unset"
	case a.Op == 0:
		return "reduction op unset"
	}
	return ""
}

// checkData checks the sizes: none for a collective without data, else
// Counts for the V variants or Bytes, in whole elements.
func (a *CollArgs) checkData(needs collNeeds) string {
	e := a.elem()
	if needs&collNoData != 0 && (a.Bytes != 0 || a.Counts != nil) {
		return fmt.Sprintf("carries no data, got %d bytes and %d counts", a.Bytes, len(a.Counts))
	}
	if needs&collCounts != 0 {
		return a.checkCounts(e)
	}
	switch {
	case a.Bytes < 0:
		return fmt.Sprintf("bytes %d < 0", a.Bytes)
	case a.Bytes%e != 0:
		return fmt.Sprintf("%d bytes is not a multiple of the %d-byte element", a.Bytes, e)
	}
	return ""
}

// checkCounts checks the V variants' Counts: one per rank, each whole
// elements of e bytes.
func (a *CollArgs) checkCounts(e int) string {
	if len(a.Counts) != a.World {
		return fmt.Sprintf("len(Counts)=%d, want world %d", len(a.Counts), a.World)
	}
	for i, n := range a.Counts {
		if n < 0 {
			return fmt.Sprintf("Counts[%d]=%d < 0", i, n)
		}
		if n%e != 0 {
			return fmt.Sprintf("Counts[%d]=%d is not a multiple of the %d-byte element", i, n, e)
		}
	}
	return ""
}

// checkRoot checks that a rooted collective's Root names a rank.
func (a *CollArgs) checkRoot(needs collNeeds) string {
	if needs&collRooted != 0 && (a.Root < 0 || a.Root >= a.World) {
		return fmt.Sprintf("root %d out of range [0, %d)", a.Root, a.World)
	}
	return ""
}

// checkHosts checks Hosts, when given: a host per rank, none negative.
func (a *CollArgs) checkHosts() string {
	if a.Hosts == nil {
		return ""
	}
	if len(a.Hosts) != a.World {
		return fmt.Sprintf("len(Hosts)=%d, want world %d", len(a.Hosts), a.World)
	}
	for i, h := range a.Hosts {
		if h < 0 {
			return fmt.Sprintf("Hosts[%d]=%d < 0", i, h)
		}
	}
	return ""
}

// elem is the element size, 1 when unset.
func (a *CollArgs) elem() int { return max(1, a.ElemSize) }

// block is the frame size: BlockSize (or DefaultBlockSize) rounded down to
// whole elements, so that every frame of a reduced message reduces on its
// own, and never less than one element.
func (a *CollArgs) block() int {
	b, e := frameBlock(a.BlockSize), a.elem()
	return max(e, b-b%e)
}

// resetColl starts a collective's plan: Reset plus the reduction fields.
func (s *Schedule) resetColl(algo Algo, a *CollArgs) {
	s.Reset(algo)
	s.DType, s.Op, s.ElemSize = a.DType, a.Op, a.elem()
}

// ints returns n ints of the schedule's planner scratch.
func (s *Schedule) ints(n int) []int {
	if cap(s.work) < n {
		s.work = make([]int, n)
	}
	return s.work[:n]
}

// prefixInto writes the prefix sums of counts into offs (len(counts)+1).
func prefixInto(offs, counts []int) {
	offs[0] = 0
	for i, n := range counts {
		offs[i+1] = offs[i] + n
	}
}

// rankBlocks cuts buf into World blocks of Bytes, block i for rank i: the
// buffer a gather collects into, a scatter sends from, an allgather fills.
func (a *CollArgs) rankBlocks(buf Buf) layout {
	return evenLayout(buf, 0, a.Bytes*a.World, a.elem(), a.World)
}

// rankBlocksV is rankBlocks for the V variants: block i has Counts[i] bytes,
// at the prefix sum of the counts before it. The offsets are kept in s's
// planner scratch.
func (s *Schedule) rankBlocksV(a *CollArgs, buf Buf) layout {
	offs := s.ints(a.World + 1)
	prefixInto(offs, a.Counts)
	return layout{buf: buf, m: a.World, offs: offs}
}

// layout cuts a region of one buffer into m chunks: evenly by whole elements
// (chunk i gets elems/m elements, the first elems%m chunks one more, so some
// may be empty) or, when offs is set, at explicit offsets (chunk i is
// [off+offs[i], off+offs[i+1])).
type layout struct {
	buf   Buf
	off   int // region start
	elems int // elements in the region (even cut)
	e     int // element size
	m     int // chunks
	offs  []int
}

// evenLayout is the even cut of n bytes of buf at off into m chunks.
func evenLayout(buf Buf, off, n, e, m int) layout {
	return layout{buf: buf, off: off, elems: n / e, e: e, m: m}
}

func (l *layout) span(i int) Span {
	if l.offs != nil {
		return Span{Buf: l.buf, Off: l.off + l.offs[i], Len: l.offs[i+1] - l.offs[i]}
	}
	q, rem := l.elems/l.m, l.elems%l.m
	n := q
	if i < rem {
		n++
	}
	return Span{Buf: l.buf, Off: l.off + (i*q+min(i, rem))*l.e, Len: n * l.e}
}

// maxLen is the largest chunk.
func (l *layout) maxLen() int {
	if l.offs != nil {
		m := 0
		for i := range l.m {
			m = max(m, l.offs[i+1]-l.offs[i])
		}
		return m
	}
	return (l.elems + l.m - 1) / l.m * l.e
}

// mod is x mod m in [0, m).
func mod(x, m int) int { return ((x % m) + m) % m }

// in is sp moved to buffer b at the same offset.
func (sp Span) in(b Buf) Span { sp.Buf = b; return sp }

// addCopy appends a copy; an empty one is omitted (nothing to do or check).
func (s *Schedule) addCopy(src, dst Span) {
	if src.Len > 0 {
		s.Add(Step{Kind: StepCopy, Src: src, Dst: dst})
	}
}

// addRecvReduce appends the frames of one reduced message, framed like
// addMessage: frame f lands at the same offset of land as it reduces into
// dst, so that every frame is reduced on its own as soon as it arrives.
func (s *Schedule) addRecvReduce(peer int, dst, land Span, streams, block int) {
	s.addRecvCombine(peer, dst, land, Span{}, false, streams, block)
}

// addRecvCombine appends the frames of a message from peer that land in
// land and are combined with this rank's value with into dst frame by frame:
// dst = with op landed, or landed op with when landedFirst. dst, land and
// with have the same length. A zero with (addRecvReduce) leaves every step
// two-operand: dst op= landed.
func (s *Schedule) addRecvCombine(peer int, dst, land, with Span, landedFirst bool, streams, block int) {
	nf := FrameCount(land.Len, block)
	for f := 0; f < nf; f++ {
		off := f * block
		n := min(block, land.Len-off)
		st := Step{Kind: StepRecvReduce, Peer: peer, Stream: f % streams, Last: f == nf-1,
			Src:         Span{Buf: land.Buf, Off: land.Off + off, Len: n},
			Dst:         Span{Buf: dst.Buf, Off: dst.Off + off, Len: n},
			LandedFirst: landedFirst}
		// A zero with marks addRecvReduce's two-operand steps. The empty
		// frame of an empty chunk of a combine still records where its
		// operand sits (consumers ignore a zero-length With), so this tests
		// for the zero Span rather than for a length.
		if with != (Span{}) {
			st.With = Span{Buf: with.Buf, Off: with.Off + off, Len: n}
		}
		s.Add(st)
	}
}

// ring is one rank's place in a ring of m members: index i, and the ranks
// of its predecessor and successor.
type ring struct{ i, m, prev, next int }

// addRingReduceScatter appends the m-1 rounds of a ring reduce-scatter over
// the chunks of l (in BufRecv): in round k member i sends chunk i-k-1 to its
// successor and receives chunk i-k-2 from its predecessor, reducing it into
// its own (landing in scratch[0:]), so that afterwards member i holds chunk
// i reduced over all members. Each chunk is reduced once, along the ring,
// in an order fixed by the ring alone.
//
// With fromSend the data is still in BufSend at the same offsets: a chunk is
// copied into BufRecv in the round before the first reduction into it (the
// first in a round of its own), so the copies overlap the transfers, and the
// one chunk never reduced into here (i-1) is sent straight from BufSend in
// round 0. Each BufSend byte is therefore read only before the BufRecv byte
// at its offset is written, which keeps an in-place call (one buffer for
// both) correct.
func (s *Schedule) addRingReduceScatter(a *CollArgs, rg ring, l *layout, fromSend bool) {
	m, i, block := rg.m, rg.i, a.block()
	for k := 0; k < m-1; k++ {
		out := l.span(mod(i-k-1, m))
		if fromSend && k == 0 {
			out = out.in(BufSend)
		}
		s.addMessage(StepSend, rg.next, out, a.Streams, block)
		in := l.span(mod(i-k-2, m))
		land := Span{Buf: BufScratch, Len: in.Len}
		if fromSend {
			// This rank reduces into each chunk once, so the first (and
			// only) reduction reads its own contribution from BufSend:
			// recv = own op landed, frame by frame, with no copy first.
			s.addRecvCombine(rg.prev, in, land, in.in(BufSend), false, a.Streams, block)
		} else {
			s.addRecvReduce(rg.prev, in, land, a.Streams, block)
		}
		s.EndRound()
	}
	if fromSend && m == 1 {
		c := l.span(0)
		s.addCopy(c.in(BufSend), c)
		s.EndRound()
	}
}

// addRingAllGather appends the m-1 rounds of a ring allgather over the chunks
// of l: member i starts with chunk i; in round k it sends chunk i-k to its
// successor and receives chunk i-k-1 from its predecessor. With useFirst,
// round 0 sends first instead of chunk i (AllGather sends straight from the
// caller's buffer). Steps already added to the current round stay in round 0.
func (s *Schedule) addRingAllGather(a *CollArgs, rg ring, l *layout, first Span, useFirst bool) {
	m, i, block := rg.m, rg.i, a.block()
	for k := 0; k < m-1; k++ {
		out := l.span(mod(i-k, m))
		if k == 0 && useFirst {
			out = first
		}
		s.addMessage(StepSend, rg.next, out, a.Streams, block)
		s.addMessage(StepRecv, rg.prev, l.span(mod(i-k-1, m)), a.Streams, block)
		s.EndRound()
	}
}

// log2ceil is the smallest k with 1<<k >= n (n >= 1).
func log2ceil(n int) int {
	k := 0
	for 1<<k < n {
		k++
	}
	return k
}

// hostStats returns the number of distinct hosts and the fewest and most
// ranks on one host (hosts nil: one host of world ranks). It copies hosts to
// sort it, on the stack for any realistic world, so selection stays free of
// allocations.
func hostStats(world int, hosts []int) (h, minL, maxL int) {
	if hosts == nil || len(hosts) != world || world == 0 {
		return 1, world, world
	}
	var buf [1024]int
	var cp []int
	if world <= len(buf) {
		cp = buf[:world]
	} else {
		cp = make([]int, world)
	}
	copy(cp, hosts)
	slices.Sort(cp)
	minL = world
	for i := 0; i < world; {
		j := i + 1
		for j < world && cp[j] == cp[i] {
			j++
		}
		h++
		minL, maxL = min(minL, j-i), max(maxL, j-i)
		i = j
	}
	return h, minL, maxL
}

// linkTime is the time of one message of n bytes on l (one transfer).
func linkTime(n int, l Link) float64 { return float64(l.Alpha + float64(l.Beta*float64(n))) }

// EstimateAllReduce prices an AllReduce of bytes per rank with algorithm a,
// in seconds, with the alpha-beta model of EstimateAllToAllV (one transfer
// per message, local copies and reductions free):
//   - ring: 2(p-1) rounds of one chunk of ceil(n/p);
//   - recursive doubling: log2(p') exchanges of n, plus 2 messages of n when
//     p is not a power of two (p' the largest power of two <= p);
//   - hierarchical (H hosts, L = fewest ranks on a host): 2(L-1) rounds of
//     n/L, 2(H-1) rounds of n/(LH), plus 2·ceil(maxL/L - 1) messages of n
//     for the ranks beyond L on a host. One link prices every pair, so the
//     model does not see what hierarchical saves on inter-host links.
//
// AlgoAuto prices ChooseAllReduce's pick; +Inf for other algorithms.
func EstimateAllReduce(a Algo, world, bytes int, hosts []int, link Link) float64 {
	if world < 1 || bytes < 0 {
		return math.Inf(1)
	}
	p := world
	switch a {
	case AlgoRing:
		return float64(2*(p-1)) * linkTime((bytes+p-1)/p, link)
	case AlgoRecursiveDoubling:
		pp := 1 << (log2ceil(p+1) - 1) // largest power of two <= p
		t := float64(log2ceil(pp)) * linkTime(bytes, link)
		if pp != p {
			t += 2 * linkTime(bytes, link)
		}
		return t
	case AlgoHierarchical:
		h, l, maxL := hostStats(world, hosts)
		folds := (maxL+l-1)/l - 1
		t := float64(2*(l-1))*linkTime((bytes+l-1)/l, link) + float64(2*(h-1))*linkTime((bytes+l*h-1)/(l*h), link)
		return t + float64(2*folds)*linkTime(bytes, link)
	case AlgoAuto:
		return EstimateAllReduce(ChooseAllReduce(world, bytes, hosts, link), world, bytes, hosts, link)
	}
	return math.Inf(1)
}

// ChooseAllReduce picks an AllReduce algorithm from inputs every rank holds
// identically, so all ranks pick the same one without agreeing: recursive
// doubling when the model prices it below the ring (small messages: log p
// latencies instead of 2(p-1)), otherwise hierarchical when hosts spans more
// than one host with more than one rank on every host, otherwise the ring.
// Small messages stay with recursive doubling on several hosts too: its
// log p rounds beat the 2(L-1)+2(H-1) of the hierarchical rings.
func ChooseAllReduce(world, bytes int, hosts []int, link Link) Algo {
	if world <= 1 {
		return AlgoRing
	}
	if EstimateAllReduce(AlgoRecursiveDoubling, world, bytes, nil, link) < EstimateAllReduce(AlgoRing, world, bytes, nil, link) {
		return AlgoRecursiveDoubling
	}
	if h, minL, _ := hostStats(world, hosts); h > 1 && minL > 1 {
		return AlgoHierarchical
	}
	return AlgoRing
}

// EstimateBroadcast prices a Broadcast of bytes with algorithm a, in
// seconds: the binomial tree is ceil(log2 p) rounds of n; scatter-allgather
// is the root sending p-1 chunks of ceil(n/p) in one round (sharing its one
// lane) then p-1 ring rounds of one chunk. AlgoAuto prices ChooseBroadcast's
// pick; +Inf for other algorithms.
func EstimateBroadcast(a Algo, world, bytes int, link Link) float64 {
	if world < 1 || bytes < 0 {
		return math.Inf(1)
	}
	p := world
	chunk := (bytes + p - 1) / p
	switch a {
	case AlgoTree:
		return float64(log2ceil(p)) * linkTime(bytes, link)
	case AlgoScatterAllGather:
		if p == 1 {
			return 0
		}
		return linkTime((p-1)*chunk, link) + float64(p-1)*linkTime(chunk, link)
	case AlgoAuto:
		return EstimateBroadcast(ChooseBroadcast(world, bytes, link), world, bytes, link)
	}
	return math.Inf(1)
}

// ChooseBroadcast picks the binomial tree or scatter-allgather, whichever
// EstimateBroadcast prices lower (ties and world <= 2 go to the tree). Its
// inputs are shared by every rank, so every rank picks the same.
func ChooseBroadcast(world, bytes int, link Link) Algo {
	if world <= 2 {
		return AlgoTree
	}
	if EstimateBroadcast(AlgoScatterAllGather, world, bytes, link) < EstimateBroadcast(AlgoTree, world, bytes, link) {
		return AlgoScatterAllGather
	}
	return AlgoTree
}

// PlanAllReduce plans an AllReduce with algorithm algo: AlgoRing,
// AlgoRecursiveDoubling, AlgoHierarchical, or AlgoAuto for ChooseAllReduce's
// pick under DefaultLink (callers with their own link table call
// ChooseAllReduce themselves).
func PlanAllReduce(s *Schedule, algo Algo, a CollArgs) error {
	if algo == AlgoAuto {
		algo = ChooseAllReduce(a.World, a.Bytes, a.Hosts, DefaultLink())
	}
	switch algo {
	case AlgoRing:
		return PlanAllReduceRing(s, a)
	case AlgoRecursiveDoubling:
		return PlanAllReduceRecursiveDoubling(s, a)
	case AlgoHierarchical:
		return PlanAllReduceHierarchical(s, a)
	case AlgoLL:
		return PlanAllReduceLL(s, a)
	}
	return fmt.Errorf("allreduce: no %v algorithm", algo)
}

// PlanBroadcast plans a Broadcast with algorithm algo: AlgoTree,
// AlgoScatterAllGather, or AlgoAuto for ChooseBroadcast's pick under
// DefaultLink.
func PlanBroadcast(s *Schedule, algo Algo, a CollArgs) error {
	if algo == AlgoAuto {
		algo = ChooseBroadcast(a.World, a.Bytes, DefaultLink())
	}
	switch algo {
	case AlgoTree:
		return PlanBroadcastTree(s, a)
	case AlgoScatterAllGather:
		return PlanBroadcastScatterAllGather(s, a)
	}
	return fmt.Errorf("broadcast: no %v algorithm", algo)
}
