package algo

import (
	"fmt"
	"math"
	"slices"
)

// SkewMaxWorld bounds the skew-aware planner: it decides every pair of the
// world (O(p^2 log p) per operation), which pays off for the tens of ranks of
// an expert-parallel group, not for thousands.
const SkewMaxWorld = 256

// SkewArgs describes a skew-aware AllToAllV: every rank passes the same
// global Matrix, so all ranks derive the same rounds.
type SkewArgs struct {
	Rank, World int
	Matrix      []int // World*World, row-major
	Streams     int
	Window      int // matchings merged into one round (0 = 1)
	BlockSize   int
}

// PlanSkew plans an AllToAllV from the global traffic matrix so that heavy
// transfers do not wait behind light ones. Pairwise exchange spends
// sum_k max_i n[i][i+k]: a round is as slow as its heaviest pair, and cyclic
// shifts scatter the heavy pairs of a skewed (MoE) matrix over many rounds.
// Here the rounds are matchings (each rank sends to at most one rank and
// receives from at most one per matching) built greedily in the spirit of a
// Birkhoff-von Neumann decomposition: pairs are taken heaviest first and each
// joins the first matching where its sender and receiver are both free, so
// heavy pairs share rounds and the light ones fill the rest. Window matchings
// are merged into one round. All ranks compute the same matchings from the
// same matrix, and both ends of a pair sit in the same round, so the schedule
// is deadlock-free under rendezvous. Empty pairs still exchange one empty
// frame (the framing rule), in the last matchings.
func PlanSkew(s *Schedule, a SkewArgs) error {
	if err := a.validate(); err != nil {
		return err
	}
	s.Reset(AlgoSkew)
	p, me := a.World, a.Rank
	w := s.skewStorage(p)
	pairs := heaviestFirst(w.pairs, a.Matrix, p)
	matchings := assignMatchings(pairs, w.round, w.busy, p)
	matrixDisplacements(a.Matrix, p, me, w.sd, w.rd)
	if v := a.Matrix[me*p+me]; v > 0 {
		s.Add(Step{Kind: StepCopy, Peer: me, Src: Span{Buf: BufSend, Off: w.sd[me], Len: v}, Dst: Span{Buf: BufRecv, Off: w.rd[me], Len: v}})
	}
	s.addMatchingRounds(&a, w, matchings)
	s.EndRound()
	return nil
}

// validate reports arguments PlanSkew cannot plan.
func (a *SkewArgs) validate() error {
	p := a.World
	switch {
	case p < 1 || a.Rank < 0 || a.Rank >= p:
		return fmt.Errorf("skew: rank %d of world %d", a.Rank, p)
	case p > SkewMaxWorld:
		return fmt.Errorf("skew: world %d above %d", p, SkewMaxWorld)
	case len(a.Matrix) != p*p:
		return fmt.Errorf("skew: matrix has %d entries, want %d", len(a.Matrix), p*p)
	case a.Streams < 1 || a.Window < 0 || a.BlockSize < 0:
		return fmt.Errorf("skew: streams %d, window %d, block size %d", a.Streams, a.Window, a.BlockSize)
	}
	return negativeEntry("skew", a.Matrix, p)
}

// skewWork is PlanSkew's work storage, carved from Schedule.work so that
// re-planning allocates nothing: the pairs (p*p), the matching of each pair
// (round, p*p, at s.work[p*p:2*p*p], where estimateSkew reads it), per
// matching the busy flags of senders and receivers, and the displacements.
type skewWork struct {
	pairs, round, busy, sd, rd []int
}

// skewStorage returns PlanSkew's storage for p ranks with the busy flags
// clear. 2p-1 matchings suffice for a greedy edge colouring of a bipartite
// graph of degree p-1.
func (s *Schedule) skewStorage(p int) skewWork {
	maxM := max(2*p-1, 1)
	need := 2*p*p + 2*maxM*p + 2*p
	if cap(s.work) < need {
		s.work = make([]int, need)
	}
	w := s.work[:need]
	busyEnd := 2*p*p + 2*maxM*p
	st := skewWork{pairs: w[0 : p*p : p*p], round: w[p*p : 2*p*p : 2*p*p], busy: w[2*p*p : busyEnd],
		sd: w[busyEnd : busyEnd+p], rd: w[busyEnd+p:]}
	clear(st.busy)
	return st
}

// heaviestFirst fills pairs with every pair i*p+j of distinct ranks, the
// heaviest under matrix first (ties in index order), and returns them.
func heaviestFirst(pairs, matrix []int, p int) []int {
	n := 0
	for i := range p {
		for j := range p {
			if i != j {
				pairs[n] = i*p + j
				n++
			}
		}
	}
	pairs = pairs[:n]
	slices.SortFunc(pairs, func(x, y int) int {
		if matrix[x] != matrix[y] {
			return matrix[y] - matrix[x] // heaviest first
		}
		return x - y
	})
	return pairs
}

// assignMatchings puts each pair, in order, into the first matching where
// its sender and its receiver are both free (busy holds, per matching, p
// sender flags then p receiver flags), records it in round and returns the
// number of matchings used.
func assignMatchings(pairs, round, busy []int, p int) int {
	maxM := len(busy) / (2 * p)
	matchings := 0
	for _, pr := range pairs {
		i, j := pr/p, pr%p
		for m := 0; m < maxM; m++ {
			sendBusy, recvBusy := &busy[m*2*p+i], &busy[m*2*p+p+j]
			if *sendBusy == 0 && *recvBusy == 0 {
				*sendBusy, *recvBusy = 1, 1
				round[pr] = m
				matchings = max(matchings, m+1)
				break
			}
		}
	}
	return matchings
}

// addMatchingRounds appends this rank's sends and receives, matching by
// matching, Window matchings to a round; the last round stays open.
func (s *Schedule) addMatchingRounds(a *SkewArgs, w skewWork, matchings int) {
	p, me, block, window := a.World, a.Rank, frameBlock(a.BlockSize), max(a.Window, 1)
	for m := 0; m < matchings; m++ {
		for j := range p {
			if j != me && w.round[me*p+j] == m {
				s.addMessage(StepSend, j, Span{Buf: BufSend, Off: w.sd[j], Len: a.Matrix[me*p+j]}, a.Streams, block)
			}
		}
		for i := range p {
			if i != me && w.round[i*p+me] == m {
				s.addMessage(StepRecv, i, Span{Buf: BufRecv, Off: w.rd[i], Len: a.Matrix[i*p+me]}, a.Streams, block)
			}
		}
		if (m+1)%window == 0 {
			s.EndRound()
		}
	}
}

// EstimateSkew prices PlanSkew's rounds like the fullmesh estimate: per round
// alpha plus the busiest rank's bytes (sent or received) over the bandwidth.
// It allocates; a Chooser prices it with reused storage.
func EstimateSkew(matrix []int, world, window int, link Link) float64 {
	var s Schedule
	var scratch []int
	return estimateSkew(&s, &scratch, matrix, world, window, link, nil)
}

// estimateSkew is EstimateSkew with its storage in s and scratch. A matrix
// PlanSkew refuses costs +Inf. A non-nil work gets each rank's own time in
// each round.
func estimateSkew(s *Schedule, scratch *[]int, matrix []int, world, window int, link Link, work *workLog) float64 {
	if PlanSkew(s, SkewArgs{Rank: 0, World: world, Matrix: matrix, Streams: 1, Window: window}) != nil {
		return math.Inf(1)
	}
	p := world
	round := s.work[p*p : 2*p*p] // the matchings every rank shares
	window = max(window, 1)
	rounds := 0
	for i := range p {
		for j := range p {
			if i != j {
				rounds = max(rounds, round[i*p+j]/window+1)
			}
		}
	}
	if cap(*scratch) < 2*rounds*p {
		*scratch = make([]int, 2*rounds*p)
	}
	buf := (*scratch)[:2*rounds*p]
	clear(buf)
	sent, recvd := buf[:rounds*p], buf[rounds*p:]
	for i := range p {
		for j := range p {
			if i != j {
				r := round[i*p+j] / window
				sent[r*p+i] += matrix[i*p+j]
				recvd[r*p+j] += matrix[i*p+j]
				work.moved(i, j, matrix[i*p+j], link)
				work.moved(j, i, matrix[i*p+j], link)
			}
		}
	}
	total := 0.0
	for r := range rounds {
		busiest := 0
		for i := range p {
			busiest = max(busiest, sent[r*p+i], recvd[r*p+i])
			if sent[r*p+i]+recvd[r*p+i] > 0 {
				work.round(i, link.Alpha)
			}
		}
		total += link.Alpha + link.Beta*float64(busiest)
	}
	return total
}

// SkewRatio: a matrix whose heaviest pair carries this many times the mean
// pair is skewed enough for PlanSkew's matchings to be a candidate.
const SkewRatio = 4

// LowerBoundAllToAllV is the time no AllToAllV schedule can beat under link:
// the busiest rank's bytes sent or received to or from other ranks (the
// largest off-diagonal row or column sum) at full bandwidth (Lanes transfers
// at 1/Beta each), plus one Alpha.
// Skew-aware ordering aims at it; when plain pairwise is already close (a
// hot receiver bounds every schedule), no ordering can gain much.
func LowerBoundAllToAllV(matrix []int, world int, link Link) float64 {
	if world < 1 || len(matrix) != world*world {
		return math.Inf(1)
	}
	// Not newCounts, which refuses negative entries: the bound checks only
	// the matrix's shape and sums it as given.
	busiest := counts{m: matrix, p: world}.busiest(nil)
	return link.Alpha + link.fullRate(float64(busiest))
}
