package algo

// PlanReduceTree plans a Reduce (send Bytes on every rank; recv Bytes at the
// root, the reduction of everyone's send) as a binomial tree: with v =
// (r - Root) mod p, rank v receives and reduces the partial results of
// v+1, v+2, v+4, ... (while v has that bit clear and the child exists), one
// per round, then sends its own to its parent v minus its lowest set bit.
// ceil(log2 p) rounds of the whole buffer.
//
// The order is fixed by (Root, p): rank v's result is
// ((own op child1) op child2) op child4 ..., so a float result is
// deterministic from run to run.
//
// Only the root addresses BufRecv (other ranks may pass none): an inner rank
// accumulates in scratch, preloaded with its data by a local copy, and a
// leaf sends straight from BufSend. In place: the root's send may be the
// same slice as its recv (the preload is then a no-op).
//
// It writes into s, reusing its storage: planning into a reused Schedule
// allocates nothing.
func PlanReduceTree(s *Schedule, a CollArgs) error {
	if err := a.validate("reduce", collReduces|collRooted); err != nil {
		return err
	}
	s.resetColl(AlgoTree, &a)
	p, n, block := a.World, a.Bytes, a.block()
	v := mod(a.Rank-a.Root, p)
	rank := func(v int) int { return (v + a.Root) % p }
	src := Span{Buf: BufSend, Len: n}
	acc := Span{Buf: BufRecv, Len: n}
	if v != 0 {
		acc = Span{Buf: BufScratch, Off: n, Len: n}
	}
	land := Span{Buf: BufScratch, Len: n}
	out := src
	mask := 1
	for ; mask < p && v&mask == 0; mask <<= 1 {
		if v+mask >= p {
			continue
		}
		if out == src { // first child: preload the accumulator
			s.addCopy(src, acc)
			s.EndRound()
			out = acc
			s.ScratchBytes = acc.Off + n
		}
		s.addRecvReduce(rank(v+mask), acc, land, a.Streams, block)
		s.EndRound()
	}
	if v != 0 {
		s.addMessage(StepSend, rank(v-mask), out, a.Streams, block)
	} else if out == src {
		s.addCopy(src, acc) // world 1: no children
	}
	s.EndRound()
	return nil
}
