package algo

// fullmeshDistance is the j-th peer distance (j = 0..p-2) of the fullmesh
// order: 1, p-1, 2, p-2, ... — growing distance, alternating direction, each
// distance exactly once. Near peers first matters on ring- or host-ordered
// ranks, where small distances are the cheap links.
func fullmeshDistance(j, p int) int {
	m := j / 2
	if j%2 == 0 {
		return m + 1
	}
	return p - m - 1
}

// PlanFullmesh plans an AllToAllV as a direct fullmesh (DESIGN §5, after
// HCCL's AlltoAllVFullMesh): the p-1 peer distances, ordered by
// fullmeshDistance, are taken C = Window at a time; in each round the rank sends
// to r+d and receives from r-d for every distance d of the round, all in
// flight together, each message cut into frames spread round-robin over the
// streams; frame f of every message of the round forms sub-round f, so one
// block per message is in flight at a time. The local copy rides in the first
// round.
//
// Every rank uses the same set of distances in the same round, so whenever r
// sends to r+d, r+d is receiving from (r+d)-d = r in that round: the schedule
// is deadlock-free with rendezvous sends, which Simulate checks.
//
// HCCL additionally stages blocks through the two halves of a registered
// buffer, alternating halves on even and odd rounds (ping-pong) so that the
// copy into staging overlaps the transfer of the previous half. That is a
// property of transports with a staging buffer (shm, verbs BCopy), not of the
// schedule: such a transport implements it under these steps, and the frames
// here are already cut at BlockSize so a staging half of BlockSize suffices.
//
// It writes into s, reusing its storage: planning into a reused Schedule
// allocates nothing.
func PlanFullmesh(s *Schedule, a AllToAllVArgs) error {
	sd, rd, err := s.startFlat(AlgoFullmesh, &a)
	if err != nil {
		return err
	}
	r, p, block := a.Rank, a.World, a.blockSize()
	c := fullmeshWindow(a.Window, p)
	for j0 := 0; j0 < p-1; j0 += c {
		// Like pairwise, frame f of every message of the window forms
		// sub-round f, so at most one block per message is in flight; each
		// partner has at least as many frames for us as we send it.
		frames := 0
		for j := j0; j < min(j0+c, p-1); j++ {
			d := fullmeshDistance(j, p)
			to, from := (r+d)%p, (r-d+p)%p
			frames = max(frames, a.exchangeFrames(to, from, block))
		}
		for f := 0; f < frames; f++ {
			for j := j0; j < min(j0+c, p-1); j++ {
				d := fullmeshDistance(j, p)
				to, from := (r+d)%p, (r-d+p)%p
				s.addExchangeFrame(&a, sd, rd, to, from, f, block)
			}
			s.EndRound()
		}
	}
	s.EndRound() // world 1: the copy alone
	return nil
}
