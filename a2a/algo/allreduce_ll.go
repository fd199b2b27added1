package algo

// PlanAllReduceLL plans a small AllReduce (send Bytes, recv Bytes) as one LL
// round, like PlanBarrierLL: every rank stores its whole input into every
// peer's slot and loads every peer's into scratch, then reduces the p inputs
// locally. It moves (p-1)·n bytes per rank against log2(p)·n for recursive
// doubling, but waits once instead of log2(p) times, and each of those waits
// is for a peer to be scheduled; where every peer has a slot and n fits one
// (Comm's choice) the single round wins.
//
// Bit-identical results everywhere: every rank reduces the inputs along
// the same binary tree, ((x0 op x1) op (x2 op x3)) ..., the same expression
// on the same bits.
//
// Rounds: 2 + ceil(log2 p) (the exchange with its own input copied to
// scratch, one per level of the tree, the copy of the result). Scratch:
// p·Bytes. It writes into s, reusing its storage:
// planning into a reused Schedule allocates nothing.
func PlanAllReduceLL(s *Schedule, a CollArgs) error {
	if err := a.validate("allreduce", collReduces); err != nil {
		return err
	}
	s.resetColl(AlgoLL, &a)
	p, r, n := a.World, a.Rank, a.Bytes
	s.ScratchBytes = p * n
	input := func(q int) Span { return Span{Buf: BufScratch, Off: q * n, Len: n} }
	// The inputs all go to scratch first: with send and recv one slice
	// (CollArgs.InPlace) the reduction into recv would overwrite this
	// rank's input before its turn.
	s.Add(Step{Kind: StepCopy, Src: Span{Buf: BufSend, Len: n}, Dst: input(r)})
	s.addLLExchange(r, p, func(int) Span { return Span{Buf: BufSend, Len: n} }, input)
	s.EndRound()
	// A binary tree over the slots, one level per round (the steps of a
	// round run concurrently, so each touches slots of its own).
	for half := 1; half < p; half *= 2 {
		for q := 0; q+half < p; q += 2 * half {
			s.Add(Step{Kind: StepReduce, Src: input(q + half), Dst: input(q)})
		}
		s.EndRound()
	}
	s.Add(Step{Kind: StepCopy, Src: input(0), Dst: Span{Buf: BufRecv, Len: n}})
	s.EndRound()
	return nil
}
