package algo

// PlanAllGatherRing plans an AllGather (send Bytes, recv Bytes·World with
// rank i's block at i·Bytes) as a ring: round 0 copies the own block into
// place and sends it straight from BufSend to r+1; in round k rank r
// forwards block r-k to r+1 and receives block r-k-1 from r-1. Every rank
// sends and receives (p-1)·Bytes in p-1 rounds.
//
// In place: send may be exactly this rank's block of recv
// (recv[r·Bytes:(r+1)·Bytes]); the copy is then a no-op, and nothing else
// writes that block.
//
// It writes into s, reusing its storage: planning into a reused Schedule
// allocates nothing.
func PlanAllGatherRing(s *Schedule, a CollArgs) error {
	if err := a.validate("allgather", 0); err != nil {
		return err
	}
	s.resetColl(AlgoRing, &a)
	l := a.rankBlocks(BufRecv)
	s.planAllGatherRing(&a, &l)
	return nil
}

// PlanAllGatherVRing is PlanAllGatherRing with a block of Counts[i] bytes
// from rank i, at the prefix sum of the counts before it (send
// Counts[Rank], recv sum(Counts)). Blocks may be empty.
func PlanAllGatherVRing(s *Schedule, a CollArgs) error {
	if err := a.validate("allgatherv", collCounts); err != nil {
		return err
	}
	s.resetColl(AlgoRing, &a)
	l := s.rankBlocksV(&a, BufRecv)
	s.planAllGatherRing(&a, &l)
	return nil
}

func (s *Schedule) planAllGatherRing(a *CollArgs, l *layout) {
	p, r := a.World, a.Rank
	own := l.span(r)
	src := Span{Buf: BufSend, Len: own.Len}
	s.addCopy(src, own)
	s.addRingAllGather(a, ring{i: r, m: p, prev: mod(r-1, p), next: mod(r+1, p)}, l, src, true)
	s.EndRound() // world 1: the copy alone
}
