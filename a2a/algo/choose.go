package algo

import "math"

// ChoiceArgs is what the automatic AllToAllV choice reads. Every rank must
// hold it identically (world, configuration, the agreed link table, the
// hosts, and the global counts matrix when there is one), so that every
// rank picks the same algorithm with no extra round of agreement.
type ChoiceArgs struct {
	World   int
	Streams int
	Window  int
	// Matrix is the global counts matrix in row-major order, or nil when
	// only this rank's counts are known (a plain AllToAllV): the flat
	// algorithms are then priced on a uniform NominalPairBytes per pair and
	// those that need the matrix are left out.
	Matrix []int
	// Hosts is every rank's host ordinal (0..H-1, as a Comm numbers them);
	// nil means one host.
	Hosts []int
	Links Links
}

// Candidate is one AllToAllV algorithm as the automatic choice saw it.
type Candidate struct {
	Algo     Algo
	Estimate float64 // seconds; +Inf when left out
	Why      string  // why it was left out; empty when priced
}

// Chooser is the one rule that picks an AllToAllV algorithm: the lowest
// estimate from the link table among the candidates that can run, ties to
// the earlier of pairwise, fullmesh, staged, skew. A Comm and `a2ad plan`
// both use it, so the estimates plan prints are the ones auto compares.
// LL is not a candidate: under auto every algorithm sends the blocks up to
// the LL cutoff of a pair one-sided (see PlanLL). A Chooser keeps its
// storage, so pricing allocates nothing once warm; it is not safe for
// concurrent use.
type Chooser struct {
	cands   [4]Candidate
	sched   Schedule
	scratch []int
}

// Reasons candidates are left out.
const (
	whyTwoRanks   = "two ranks: the same single exchange as pairwise"
	whyNoMatrix   = "needs the global counts matrix (AllToAllVMatrix)"
	whyOneHost    = "one host: nothing to aggregate"
	whyOnePerHost = "one rank per host: nothing to aggregate"
	whyUneven     = "hosts run different numbers of ranks"
	whyBigWorld   = "more than SkewMaxWorld ranks: the matchings cost more to plan than they save"
	whyNotSkewed  = "no pair carries SkewRatio times the mean: matchings cannot gain"
)

// Price prices every candidate for a and returns them, in the order
// pairwise, fullmesh, staged, skew, with the pick. The slice is the
// Chooser's and valid until the next call.
func (c *Chooser) Price(a ChoiceArgs) ([]Candidate, Algo) {
	hosts, even := 1, true
	if len(a.Hosts) == a.World && a.World > 0 {
		hosts, even = countHosts(a.Hosts)
	}
	flat := a.Links.Flat(hosts)
	c.cands[0] = Candidate{Algo: AlgoPairwise, Estimate: EstimateAllToAllV(AlgoPairwise, a.Matrix, a.World, a.Streams, a.Window, flat)}
	c.cands[1] = c.price(AlgoFullmesh, func() (float64, string) {
		if a.World <= 2 {
			return 0, whyTwoRanks
		}
		return EstimateAllToAllV(AlgoFullmesh, a.Matrix, a.World, a.Streams, a.Window, flat), ""
	})
	c.cands[2] = c.price(AlgoStaged, func() (float64, string) {
		switch {
		case a.Matrix == nil:
			return 0, whyNoMatrix
		case hosts == 1:
			return 0, whyOneHost
		case hosts == a.World:
			return 0, whyOnePerHost
		case !even:
			return 0, whyUneven
		}
		return estimateStaged(&c.sched, &c.scratch, a.Matrix, a.Hosts, a.Links), ""
	})
	c.cands[3] = c.price(AlgoSkew, func() (float64, string) {
		switch {
		case a.Matrix == nil:
			return 0, whyNoMatrix
		case a.World <= 2:
			return 0, whyTwoRanks
		case a.World > SkewMaxWorld:
			return 0, whyBigWorld
		case !skewed(a.Matrix):
			return 0, whyNotSkewed
		}
		return estimateSkew(&c.sched, &c.scratch, a.Matrix, a.World, 1, flat), ""
	})
	best := 0
	for i, cand := range c.cands {
		if cand.Estimate < c.cands[best].Estimate {
			best = i
		}
	}
	return c.cands[:], c.cands[best].Algo
}

// Choose is Price's pick.
func (c *Chooser) Choose(a ChoiceArgs) Algo {
	_, pick := c.Price(a)
	return pick
}

// price makes a candidate from f, which returns the estimate or why the
// candidate is left out.
func (c *Chooser) price(a Algo, f func() (float64, string)) Candidate {
	est, why := f()
	if why != "" {
		return Candidate{Algo: a, Estimate: math.Inf(1), Why: why}
	}
	return Candidate{Algo: a, Estimate: est}
}

// countHosts counts the hosts of host ordinals 0..H-1 and reports whether
// every host runs as many ranks as host 0.
func countHosts(hosts []int) (int, bool) {
	n := 0
	for _, h := range hosts {
		n = max(n, h+1)
	}
	even := true
	for h := range n {
		k := 0
		for _, o := range hosts {
			if o == h {
				k++
			}
		}
		if k*n != len(hosts) {
			even = false
		}
	}
	return n, even
}

// skewed reports whether matrix's heaviest pair carries at least SkewRatio
// times the mean pair: only then can skew-aware matchings gain.
func skewed(matrix []int) bool {
	total, heaviest := 0, 0
	for _, v := range matrix {
		total += v
		heaviest = max(heaviest, v)
	}
	return heaviest > 0 && heaviest >= SkewRatio*max(total/max(len(matrix), 1), 1)
}
