package algo

// PlanAllReduceRing plans an AllReduce (send Bytes, recv Bytes; every rank
// gets the reduction of everyone's send) as a ring reduce-scatter followed
// by a ring allgather (DESIGN §6): the buffer is cut into p chunks of whole
// elements (uneven when p·ElemSize does not divide Bytes; some may be
// empty); in p-1 rounds every chunk travels once around the ring, each rank
// reducing its own data into it as it arrives (RecvReduce into BufRecv,
// landing in scratch), so rank r ends with chunk r complete; p-1 more rounds
// pass the complete chunks around. Every rank sends and receives
// 2(p-1)/p·Bytes: bandwidth-optimal, at the price of 2(p-1) latencies.
//
// Each chunk is reduced once, in an order fixed by the ring, then copied to
// every rank, so all ranks get bit-identical results even for floats.
//
// In place: send and recv may be the same slice. BufSend is read only by
// the copies into BufRecv (one chunk per round, ahead of the first
// reduction into it) and by round 0's send of a chunk whose BufRecv bytes
// are written only later, in the allgather.
//
// Rounds: 1 local round (one chunk's copy) + 2(p-1); scratch: one chunk.
// It writes into s, reusing its storage: planning into a reused Schedule
// allocates nothing.
func PlanAllReduceRing(s *Schedule, a CollArgs) error {
	if err := a.validate("allreduce", collReduces); err != nil {
		return err
	}
	s.resetColl(AlgoRing, &a)
	p, r := a.World, a.Rank
	l := evenLayout(BufRecv, 0, a.Bytes, a.elem(), p)
	if p > 1 {
		s.ScratchBytes = l.maxLen()
	}
	rg := ring{i: r, m: p, prev: mod(r-1, p), next: mod(r+1, p)}
	s.addRingReduceScatter(&a, rg, &l, true)
	s.addRingAllGather(&a, rg, &l, Span{}, false)
	return nil
}
