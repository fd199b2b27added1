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
	p, r := a.World, a.Rank
	empty := Span{Buf: BufScratch}
	for k := 1; k < p; k++ {
		s.Add(Step{Kind: StepStore, Peer: (r + k) % p, Src: empty})
		s.Add(Step{Kind: StepLoad, Peer: mod(r-k, p), Dst: empty})
	}
	s.EndRound()
	return nil
}
