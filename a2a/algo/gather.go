package algo

// PlanGatherDirect plans a Gather (send Bytes on every rank; recv
// World·Bytes at the root, rank i's block at i·Bytes) in one round: every
// rank sends its block straight to the root, which receives all of them at
// once and copies its own. One latency; the root receives (p-1)·Bytes, as
// in any gather. Only the root addresses BufRecv (other ranks may pass
// none).
//
// In place: the root's send may be exactly its block of recv.
//
// It writes into s, reusing its storage: planning into a reused Schedule
// allocates nothing.
func PlanGatherDirect(s *Schedule, a CollArgs) error {
	if err := a.validate("gather", collRooted); err != nil {
		return err
	}
	s.resetColl(AlgoDirect, &a)
	l := a.rankBlocks(BufRecv)
	s.planGatherDirect(&a, &l)
	return nil
}

// PlanGatherVDirect is PlanGatherDirect with a block of Counts[i] bytes from
// rank i, at the prefix sum of the counts before it (send Counts[Rank], recv
// sum(Counts) at the root). Blocks may be empty.
func PlanGatherVDirect(s *Schedule, a CollArgs) error {
	if err := a.validate("gatherv", collRooted|collCounts); err != nil {
		return err
	}
	s.resetColl(AlgoDirect, &a)
	l := s.rankBlocksV(&a, BufRecv)
	s.planGatherDirect(&a, &l)
	return nil
}

func (s *Schedule) planGatherDirect(a *CollArgs, l *layout) {
	r, block := a.Rank, a.block()
	own := l.span(r)
	src := Span{Buf: BufSend, Len: own.Len}
	if r != a.Root {
		s.addMessage(StepSend, a.Root, src, a.Streams, block)
		s.EndRound()
		return
	}
	s.addCopy(src, own)
	for i := 0; i < a.World; i++ {
		if i != r {
			s.addMessage(StepRecv, i, l.span(i), a.Streams, block)
		}
	}
	s.EndRound()
}
