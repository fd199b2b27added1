package algo

// PlanBroadcastScatterAllGather plans a Broadcast (BufRecv, Bytes, on every
// rank; the root's already holds the data) for large messages, after van de
// Geijn: the buffer is cut into p chunks of whole elements; in one round the
// root sends chunk v to the rank v places after it (v = (r - Root) mod p),
// then a ring allgather in that relative order completes every buffer. The
// root sends (p-1)/p·Bytes and every rank receives Bytes in p rounds, where
// the binomial tree moves the whole buffer log2 p times.
//
// It writes into s, reusing its storage: planning into a reused Schedule
// allocates nothing.
func PlanBroadcastScatterAllGather(s *Schedule, a CollArgs) error {
	if err := a.validate("broadcast", collRooted); err != nil {
		return err
	}
	s.resetColl(AlgoScatterAllGather, &a)
	p, block := a.World, a.block()
	if p == 1 {
		return nil
	}
	l := evenLayout(BufRecv, 0, a.Bytes, a.elem(), p)
	v := mod(a.Rank-a.Root, p)
	rank := func(v int) int { return mod(v+a.Root, p) }
	if v == 0 {
		for j := 1; j < p; j++ {
			s.addMessage(StepSend, rank(j), l.span(j), a.Streams, block)
		}
	} else {
		s.addMessage(StepRecv, a.Root, l.span(v), a.Streams, block)
	}
	s.EndRound()
	s.addRingAllGather(&a, ring{i: v, m: p, prev: rank(v - 1), next: rank(v + 1)}, &l, Span{}, false)
	return nil
}
