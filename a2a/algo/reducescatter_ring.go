package algo

// PlanReduceScatterRing plans a ReduceScatter (send Bytes·World: block i is
// rank i's share; recv Bytes: the reduction of everyone's block r) as a ring:
// in round k = 0..p-2 rank r sends its partial sum of block r-k-1 to r+1 and
// receives the partial sum of block r-k-2 from r-1, reducing its own block
// into it, so that in the last round block r arrives and is completed in
// BufRecv. Every rank sends and receives (p-1)·Bytes: bandwidth-optimal.
//
// A rank reduces its own block into the arriving partial sum (RecvReduce
// into an accumulator preloaded with that block): the preload is a copy in
// the round before, so accumulators rotate through three scratch slots (the
// one being sent, the one being reduced into, the one being loaded) plus a
// landing slot. Accumulating in place in BufSend is not an option: it is
// the caller's and read-only.
//
// In place: recv may be exactly this rank's block of send
// (send[r·Bytes:(r+1)·Bytes]); that block is read only by its copy into
// BufRecv, which is then a no-op. Any other overlap of send and recv is
// unsupported (MPI's in-place ReduceScatter, with the result at the start
// of the send buffer, is not this layout).
//
// Rounds: 1 local round (one block's copy) + p-1; scratch: (1 +
// min(3, p-2))·Bytes. It writes into s, reusing its storage: planning into
// a reused Schedule allocates nothing.
func PlanReduceScatterRing(s *Schedule, a CollArgs) error {
	if err := a.validate("reducescatter", collReduces); err != nil {
		return err
	}
	s.resetColl(AlgoRing, &a)
	p, r, n, block := a.World, a.Rank, a.Bytes, a.block()
	mine := Span{Buf: BufRecv, Len: n}
	sendBlock := func(c int) Span { return Span{Buf: BufSend, Off: c * n, Len: n} }
	if p == 1 {
		s.addCopy(sendBlock(0), mine)
		s.EndRound()
		return nil
	}
	// Round k reduces block r-k-2 into acc(k); the last one lands in BufRecv.
	acc := func(k int) Span {
		if k == p-2 {
			return mine
		}
		return Span{Buf: BufScratch, Off: (1 + k%3) * n, Len: n}
	}
	s.ScratchBytes = (1 + min(3, p-2)) * n
	land := Span{Buf: BufScratch, Len: n}
	s.addCopy(sendBlock(mod(r-2, p)), acc(0))
	s.EndRound()
	for k := 0; k < p-1; k++ {
		if k+1 <= p-2 {
			s.addCopy(sendBlock(mod(r-k-3, p)), acc(k+1))
		}
		out := sendBlock(mod(r-1, p)) // round 0: this rank's own share of block r-1
		if k > 0 {
			out = acc(k - 1)
		}
		s.addMessage(StepSend, mod(r+1, p), out, a.Streams, block)
		s.addRecvReduce(mod(r-1, p), acc(k), land, a.Streams, block)
		s.EndRound()
	}
	return nil
}
