package algo

// PlanPairwise plans an AllToAllV as p-1 pairwise exchanges (DESIGN §5): at
// distance k = 1..p-1 it sends to (r+k)%p and receives from (r-k+p)%p, one
// sub-round per frame (block) of the larger direction; the local block is
// copied during the first round. Each rank has exactly one peer in each direction per
// round, so no port sees contention, and because in round k rank r's target
// (r+k) is receiving from r in that same round, the schedule is deadlock-free
// even with rendezvous (unbuffered) sends. Cost: (p-1)·alpha plus, per round,
// the largest message of that round.
//
// It writes into s, reusing its storage: planning into a reused Schedule
// allocates nothing.
func PlanPairwise(s *Schedule, a AllToAllVArgs) error {
	sd, rd, err := s.startFlat(AlgoPairwise, &a)
	if err != nil {
		return err
	}
	r, p, block := a.Rank, a.World, a.blockSize()
	for k := 1; k < p; k++ {
		// Frame f of both directions forms sub-round f, so at most one
		// block per direction is in flight: a message far larger than a
		// block then streams through caches instead of flooding them. The
		// receiver of our frames is in the same sub-round: its receive
		// count at this distance is our send count.
		to, from := (r+k)%p, (r-k+p)%p
		for f := range a.exchangeFrames(to, from, block) {
			s.addExchangeFrame(&a, sd, rd, to, from, f, block)
			s.EndRound()
		}
	}
	s.EndRound() // world 1: the copy alone
	return nil
}
