package algo

// PlanBarrierLL plans a barrier as one LL round: every rank stores an empty
// LL message into every peer's slot and waits for every peer's, so no rank
// leaves before all have entered. It has O(p) messages per rank but a single
// round, and on shared memory a store costs tens of nanoseconds: where every
// peer has a slot and p is small it beats the log2(p) rounds of
// dissemination, each of which waits for some peer to be scheduled (Comm
// picks it when every peer has a slot; measurements there). Peers without
// a slot get the empty message as one frame.
//
// It writes into s, reusing its storage: planning into a reused Schedule
// allocates nothing.
func PlanBarrierLL(s *Schedule, a CollArgs) error {
	if err := a.validate("barrier", collNoData); err != nil {
		return err
	}
	s.resetColl(AlgoLL, &a)
	empty := func(int) Span { return Span{Buf: BufScratch} }
	s.addLLExchange(a.Rank, a.World, empty, empty)
	s.EndRound()
	return nil
}

// addLLExchange appends an LL message to and from every other rank: k
// steps around the ring, a store to rank+k of src(rank+k) and a load from
// rank-k into dst(rank-k).
func (s *Schedule) addLLExchange(rank, world int, src, dst func(peer int) Span) {
	for k := 1; k < world; k++ {
		to, from := (rank+k)%world, mod(rank-k, world)
		s.Add(Step{Kind: StepStore, Peer: to, Src: src(to)})
		s.Add(Step{Kind: StepLoad, Peer: from, Dst: dst(from)})
	}
}
