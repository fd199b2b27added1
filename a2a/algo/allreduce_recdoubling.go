package algo

// PlanAllReduceRecursiveDoubling plans an AllReduce (send Bytes, recv Bytes)
// for small messages: log2(p') exchanges of the whole buffer, p' the largest
// power of two <= p. In exchange j, rank r (renumbered r' among the p'
// active ranks) swaps its partial result with r' xor 2^j and both combine
// them. For p not a power of two, the standard fold: of the first 2(p-p')
// ranks, each even one first hands its data to the odd one above it, sits
// out, and gets the final result back at the end.
//
// Bit-identical results everywhere: both partners of an exchange compute
// (lower rank's value) op (higher rank's value), the same expression on the
// same bits, so after exchange j all 2^(j+1) ranks of a block hold the same
// bits, and the folded ranks receive a copy. Because Reduce is dst = dst op
// src, the higher rank reduces into the buffer its partner's value landed
// in; its current value therefore alternates between BufRecv and scratch.
//
// A rank cannot reduce into a buffer it is still sending, so each landed
// frame is combined with the rank's value by a three-operand reduction into
// the landing buffer (or into BufRecv on the last exchange), overlapping the
// rest of the transfer: one round per exchange, and no copies at 2 ranks
// unless send and recv are the same slice (CollArgs.InPlace).
//
// Rounds: log2(p'), +1 (local copy) when the result ends in scratch; an
// odd rank of the fold has 2 before and 1 after (returning the result), a
// folded rank 2 in all. Scratch: Bytes. It writes into s, reusing its storage: planning
// into a reused Schedule allocates nothing.
func PlanAllReduceRecursiveDoubling(s *Schedule, a CollArgs) error {
	if err := a.validate("allreduce", collReduces); err != nil {
		return err
	}
	s.resetColl(AlgoRecursiveDoubling, &a)
	p, r, n, block := a.World, a.Rank, a.Bytes, a.block()
	whole := func(b Buf) Span { return Span{Buf: b, Len: n} }
	pp := 1 << (log2ceil(p+1) - 1) // largest power of two <= p
	rem := p - pp
	if p > 1 {
		s.ScratchBytes = n
	}
	if r < 2*rem && r%2 == 0 {
		// Folded: contribute, then wait for the result.
		s.addMessage(StepSend, r+1, whole(BufSend), a.Streams, block)
		s.EndRound()
		s.addMessage(StepRecv, r+1, whole(BufRecv), a.Streams, block)
		s.EndRound()
		return nil
	}
	cur := BufSend // where this rank's current value lives
	var nr int     // rank among the pp active ranks
	if r < 2*rem {
		// Odd rank of the fold: value = (r-1's data) op (own data).
		s.addMessage(StepRecv, r-1, whole(BufScratch), a.Streams, block)
		s.EndRound()
		s.Add(Step{Kind: StepReduce, Src: whole(BufSend), Dst: whole(BufScratch)})
		s.EndRound()
		cur, nr = BufScratch, r/2
	} else {
		nr = r - rem
	}
	actual := func(nr int) int {
		if nr < rem {
			return 2*nr + 1
		}
		return nr + rem
	}
	for mask := 1; mask < pp; mask <<= 1 {
		q, lower := actual(nr^mask), nr&mask == 0
		// The partner's value lands in a buffer not holding ours, and never
		// in BufRecv while ours is still in BufSend, which BufRecv may alias.
		land := BufScratch
		if cur == BufScratch {
			land = BufRecv
		}
		// Each landed frame is combined at once with our value (three
		// operands: ours is still being sent, so it cannot be the target),
		// lower rank's value first. The result goes into the landing frame,
		// or straight into BufRecv on the last exchange when nothing there
		// is still read, which saves the final copy.
		out := land
		if mask<<1 == pp && land != BufRecv && cur != BufRecv && !(cur == BufSend && a.InPlace) {
			out = BufRecv
		}
		s.addMessage(StepSend, q, whole(cur), a.Streams, block)
		s.addRecvCombine(q, whole(out), whole(land), whole(cur), !lower, a.Streams, block)
		s.EndRound()
		cur = out
	}
	if r < 2*rem {
		s.addMessage(StepSend, r-1, whole(cur), a.Streams, block)
	}
	if cur != BufRecv {
		s.addCopy(whole(cur), whole(BufRecv))
	}
	s.EndRound()
	return nil
}
