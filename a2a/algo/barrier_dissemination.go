package algo

// PlanBarrierDissemination plans a Barrier as the dissemination algorithm
// (Hensgen, Finkel and Manber): in round k = 0..ceil(log2 p)-1 rank r sends
// an empty frame to r+2^k and receives one from r-2^k. After round k a rank
// has heard, directly or through others, from the 2^(k+1)-1 ranks before
// it, so after the last round from all: no rank leaves before every rank
// has entered. Unlike a tree barrier it has no root and no second (release)
// phase.
//
// Every message is one empty frame on stream 0. World 1 has no rounds.
// It writes into s, reusing its storage: planning into a reused Schedule
// allocates nothing.
func PlanBarrierDissemination(s *Schedule, a CollArgs) error {
	if err := a.validate("barrier", collNoData); err != nil {
		return err
	}
	s.resetColl(AlgoDissemination, &a)
	p, r := a.World, a.Rank
	empty := Span{Buf: BufScratch}
	for d := 1; d < p; d <<= 1 {
		s.addMessage(StepSend, (r+d)%p, empty, 1, 1)
		s.addMessage(StepRecv, mod(r-d, p), empty, 1, 1)
		s.EndRound()
	}
	return nil
}
