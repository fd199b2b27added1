package algo

// PlanPairwise plans an AllToAllV as p-1 pairwise exchanges (DESIGN §5): round
// k = 1..p-1 sends to (r+k)%p and receives from (r-k+p)%p; the local block is
// copied during the first round. Each rank has exactly one peer in each direction per
// round, so no port sees contention, and because in round k rank r's target
// (r+k) is receiving from r in that same round, the schedule is deadlock-free
// even with rendezvous (unbuffered) sends. Cost: (p-1)·alpha plus, per round,
// the largest message of that round.
//
// It writes into s, reusing its storage: planning into a reused Schedule
// allocates nothing.
func PlanPairwise(s *Schedule, a AllToAllVArgs) error {
	if err := a.Validate(); err != nil {
		return err
	}
	s.Reset(AlgoPairwise)
	sd, rd := s.displacements(&a)
	r, p, block := a.Rank, a.World, a.blockSize()
	// The local copy rides with the first exchange, so an engine can do it
	// while it waits for the network instead of before touching it.
	s.addSelfCopy(&a, sd, rd)
	for k := 1; k < p; k++ {
		s.addExchange(&a, sd, rd, (r+k)%p, (r-k+p)%p, block)
		s.EndRound()
	}
	s.EndRound() // world 1: the copy alone
	return nil
}
