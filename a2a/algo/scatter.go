package algo

// PlanScatterDirect plans a Scatter (send World·Bytes at the root, block i
// for rank i; recv Bytes on every rank) in one round: the root sends every
// block straight from its buffer, all at once, and copies its own. One
// latency; the root sends (p-1)·Bytes, as in any scatter. Only the root
// addresses BufSend (other ranks may pass none).
//
// In place: the root's recv may be exactly its block of send.
//
// It writes into s, reusing its storage: planning into a reused Schedule
// allocates nothing.
func PlanScatterDirect(s *Schedule, a CollArgs) error {
	if err := a.validate("scatter", collRooted); err != nil {
		return err
	}
	s.resetColl(AlgoDirect, &a)
	l := a.rankBlocks(BufSend)
	s.planScatterDirect(&a, &l)
	return nil
}

// PlanScatterVDirect is PlanScatterDirect with a block of Counts[i] bytes
// for rank i, at the prefix sum of the counts before it (send sum(Counts) at
// the root, recv Counts[Rank]). Blocks may be empty.
func PlanScatterVDirect(s *Schedule, a CollArgs) error {
	if err := a.validate("scatterv", collRooted|collCounts); err != nil {
		return err
	}
	s.resetColl(AlgoDirect, &a)
	l := s.rankBlocksV(&a, BufSend)
	s.planScatterDirect(&a, &l)
	return nil
}

func (s *Schedule) planScatterDirect(a *CollArgs, l *layout) {
	r, block := a.Rank, a.block()
	own := l.span(r)
	dst := Span{Buf: BufRecv, Len: own.Len}
	if r != a.Root {
		s.addMessage(StepRecv, a.Root, dst, a.Streams, block)
		s.EndRound()
		return
	}
	s.addCopy(own, dst)
	for i := 0; i < a.World; i++ {
		if i != r {
			s.addMessage(StepSend, i, l.span(i), a.Streams, block)
		}
	}
	s.EndRound()
}
