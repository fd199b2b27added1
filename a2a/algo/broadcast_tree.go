package algo

// PlanBroadcastTree plans a Broadcast (BufRecv, Bytes, on every rank; the
// root's already holds the data) as a binomial tree, for small messages:
// with v = (r - Root) mod p, rank v receives the whole buffer from v minus
// its lowest set bit, then forwards it to v + 2^j for j from below that bit
// down to 0, one send per round, the largest subtree first (MPICH's order).
// Every rank has its data after ceil(log2 p) rounds; nobody sends more than
// ceil(log2 p) times.
//
// It writes into s, reusing its storage: planning into a reused Schedule
// allocates nothing.
func PlanBroadcastTree(s *Schedule, a CollArgs) error {
	if err := a.validate("broadcast", collRooted); err != nil {
		return err
	}
	s.resetColl(AlgoTree, &a)
	p, block := a.World, a.block()
	buf := Span{Buf: BufRecv, Len: a.Bytes}
	v := mod(a.Rank-a.Root, p)
	rank := func(v int) int { return (v + a.Root) % p }
	mask := 1 << log2ceil(p) // the root's first child is v + mask/2
	if v > 0 {
		mask = v & -v
		s.addMessage(StepRecv, rank(v-mask), buf, a.Streams, block)
		s.EndRound()
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if v+mask < p {
			s.addMessage(StepSend, rank(v+mask), buf, a.Streams, block)
			s.EndRound()
		}
	}
	return nil
}
