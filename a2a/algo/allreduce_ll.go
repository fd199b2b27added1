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
// Rounds: 1 + ceil(log2 p) (the exchange, then one per level of the tree,
// the last of which reduces straight into recv: Dst = With op Src, the same
// expression as before). A rank reads its own input from send where no level
// but the last reduces into it (p = 2, and odd ranks): a copy less, and with
// send and recv one slice (CollArgs.InPlace) the last level reads it in the
// same step that writes it, element by element, which a three-operand kernel
// allows. Scratch: p·Bytes. It writes into s, reusing its storage: planning
// into a reused Schedule allocates nothing.
func PlanAllReduceLL(s *Schedule, a CollArgs) error {
	if err := a.validate("allreduce", collReduces); err != nil {
		return err
	}
	s.resetColl(AlgoLL, &a)
	p, r, n := a.World, a.Rank, a.Bytes
	s.ScratchBytes = p * n
	own := llReducedInto(r, p)
	input := func(q int) Span {
		if q == r && !own {
			return Span{Buf: BufSend, Len: n}
		}
		return Span{Buf: BufScratch, Off: q * n, Len: n}
	}
	if p == 1 {
		s.Add(Step{Kind: StepCopy, Src: Span{Buf: BufSend, Len: n}, Dst: Span{Buf: BufRecv, Len: n}})
		s.EndRound()
		return nil
	}
	if p == 2 && !a.InPlace {
		// One round: the peer's input is reduced with this rank's as it
		// arrives, in rank order (x0 op x1 on both ranks). In place the
		// load would write the send buffer the store reads in the same
		// round, so that case takes the tree's two rounds.
		q := 1 - r
		s.Add(Step{Kind: StepStore, Peer: q, Src: Span{Buf: BufSend, Len: n}})
		s.Add(Step{Kind: StepLoad, Peer: q, Src: Span{Buf: BufScratch, Len: n}, Dst: Span{Buf: BufRecv, Len: n},
			With: Span{Buf: BufSend, Len: n}, LandedFirst: q < r})
		s.EndRound()
		return nil
	}
	if own {
		// A level before the last reduces into this rank's input: it goes
		// to scratch first, since send is the caller's (and may be recv).
		s.Add(Step{Kind: StepCopy, Src: Span{Buf: BufSend, Len: n}, Dst: input(r)})
	}
	s.addLLExchange(r, p, func(int) Span { return Span{Buf: BufSend, Len: n} }, input)
	s.EndRound()
	// A binary tree over the slots, one level per round (the steps of a
	// round run concurrently, so each touches slots of its own); the last
	// level, a single step, writes recv.
	top := 1
	for top*2 < p {
		top *= 2
	}
	for half := 1; half < top; half *= 2 {
		for q := 0; q+half < p; q += 2 * half {
			s.Add(Step{Kind: StepReduce, Src: input(q + half), Dst: input(q)})
		}
		s.EndRound()
	}
	s.Add(Step{Kind: StepReduce, Src: input(top), With: input(0), Dst: Span{Buf: BufRecv, Len: n}})
	s.EndRound()
	return nil
}

// llReducedInto reports whether a level of PlanAllReduceLL's tree below the
// last reduces into rank r's input: r is a multiple of 2·half with a partner
// r+half for some half < top.
func llReducedInto(r, p int) bool {
	top := 1
	for top*2 < p {
		top *= 2
	}
	for half := 1; half < top; half *= 2 {
		if r%(2*half) == 0 && r+half < p {
			return true
		}
	}
	return false
}
