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
	// Machines is every rank's machine ordinal (0..M-1), and Cores, by
	// machine ordinal, how many CPUs the job's ranks there may run on (0:
	// unknown). A machine is one kernel: several hosts (network namespaces,
	// containers) may share its cores. Where a machine's ranks outnumber
	// its cores, a candidate cannot finish before those cores have done
	// every rank's own work there, so its estimate is at least that (see
	// Chooser.crowdedBound). nil: every rank has a core of its own.
	Machines []int
	Cores    []int
	// LLLocal and LLRemote are the LL cutoffs the flat algorithms plan
	// with (AllToAllVArgs.LLCutoff) for a pair of one host and of two
	// hosts; negative: no LL. With a matrix, pairwise and fullmesh are
	// priced as one round of the blocks within their pair's cutoff
	// followed by their rounds of the larger blocks. Both zero (the zero
	// value) means no LL.
	LLLocal, LLRemote int
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
	rest    []int // the matrix without its LL blocks (splitLL)
	sched   Schedule
	scratch []int
	work    workLog // each rank's own time under the candidate being priced
	// by machine ordinal: ranks, and their summed own time
	machineRanks []int
	machineWork  []float64
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
	work := c.workFor(a)
	frames, ll := c.splitLL(a, flat)
	c.cands[0] = c.price(a, AlgoPairwise, 0, func() (float64, string) {
		return c.llRound(a, ll, work) + c.frameRounds(AlgoPairwise, a, frames, ll, flat, work), ""
	})
	c.cands[1] = c.price(a, AlgoFullmesh, 0, func() (float64, string) {
		if a.World <= 2 {
			return 0, whyTwoRanks
		}
		return c.llRound(a, ll, work) + c.frameRounds(AlgoFullmesh, a, frames, ll, flat, work), ""
	})
	// Staged relays every byte that crosses hosts through a local peer
	// first: on a crowded machine its remote phase waits for the cores to
	// have done the local one, so that phase's latency adds to the bound
	// where the flat algorithms start their remote transfers at once and
	// wait out the latency while the cores work. In the test bed (8 ranks
	// on 2 cores, 200 us delay, 1 KiB) staged took 1.1-1.2 ms, fullmesh
	// with its LL round 0.53-0.58 ms, while the bound alone priced them
	// within 2%.
	c.cands[2] = c.price(a, AlgoStaged, a.Links.Remote.Alpha, func() (float64, string) {
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
		return estimateStaged(&c.sched, &c.scratch, a.Matrix, a.Hosts, a.Links, work), ""
	})
	c.cands[3] = c.price(a, AlgoSkew, 0, func() (float64, string) {
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
		return estimateSkew(&c.sched, &c.scratch, a.Matrix, a.World, 1, flat, work), ""
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
// candidate is left out, raised to the crowded machines' bound when args
// has any, plus relay: latency that cannot overlap with the crowded work
// before it.
func (c *Chooser) price(args ChoiceArgs, a Algo, relay float64, f func() (float64, string)) Candidate {
	clear(c.work.t)
	est, why := f()
	if why != "" {
		return Candidate{Algo: a, Estimate: math.Inf(1), Why: why}
	}
	if len(c.work.t) > 0 {
		est = max(est, c.crowdedBound(args)+relay)
	}
	return Candidate{Algo: a, Estimate: est}
}

// llLink is the link and bytes of the LL round splitLL found: the busiest
// rank's LL bytes, sent or received, over the remote link when a pair of
// two hosts has an LL block, else the local one; n < 0 when there is no
// LL round.
type llLink struct {
	link Link
	n    int
	// frames: some pair still moves a block by frames; without one the
	// flat algorithms are the LL round alone. frameLink is the link their
	// frame rounds run at: flat's when one of those pairs is of two hosts,
	// else the local one.
	frames    bool
	frameLink Link
}

// splitLL returns the matrix of the blocks the flat algorithms send by
// frames (those above their pair's cutoff; the blocks within it count as
// empty) and their LL round. Without a matrix or LL cutoffs it returns
// a.Matrix and no round.
func (c *Chooser) splitLL(a ChoiceArgs, flat Link) ([]int, llLink) {
	none := llLink{n: -1}
	p := a.World
	if a.Matrix == nil || len(a.Matrix) != p*p || (a.LLLocal == 0 && a.LLRemote == 0) || (a.LLLocal < 0 && a.LLRemote < 0) {
		return a.Matrix, none
	}
	if cap(c.rest) < p*p {
		c.rest = make([]int, p*p)
	}
	rest := c.rest[:p*p]
	copy(rest, a.Matrix)
	sameHost := func(i, j int) bool { return len(a.Hosts) != p || a.Hosts[i] == a.Hosts[j] }
	any, remote, frames, framesRemote := false, false, false, false
	for i := range p {
		for j := range p {
			cut := a.LLLocal
			if !sameHost(i, j) {
				cut = a.LLRemote
			}
			switch {
			case i == j:
			case cut >= 0 && a.Matrix[i*p+j] <= cut:
				rest[i*p+j] = 0
				any, remote = true, remote || !sameHost(i, j)
			default:
				frames, framesRemote = true, framesRemote || !sameHost(i, j)
			}
		}
	}
	if !any {
		return a.Matrix, none
	}
	ll := llLink{link: a.Links.Local, frames: frames, frameLink: a.Links.Local}
	if remote {
		ll.link = flat
	}
	if framesRemote {
		ll.frameLink = flat
	}
	for i := range p {
		out, in := 0, 0
		for j := range p {
			if i != j {
				out += a.Matrix[i*p+j] - rest[i*p+j]
				in += a.Matrix[j*p+i] - rest[j*p+i]
			}
		}
		ll.n = max(ll.n, out, in)
	}
	return rest, ll
}

// llRound prices the LL round of ll: one alpha and the busiest rank's LL
// bytes (adding each rank's own to work); 0 without one. Under auto every
// pair is quiet, so where frames follow, the LL messages ride with the
// first frame round (AllToAllVArgs.LLQuiet, addLLRound), whose alpha
// frameRounds prices at ll.frameLink's: the LL round then adds only the
// alpha its link has beyond that.
func (c *Chooser) llRound(a ChoiceArgs, ll llLink, work *workLog) float64 {
	if ll.n < 0 {
		return 0
	}
	link := ll.link
	if ll.frames {
		link.Alpha = max(0, link.Alpha-ll.frameLink.Alpha)
	}
	if work != nil {
		p := a.World
		for i := range p {
			work.round(i, link.Alpha)
			for j := range p {
				if i != j {
					work.moved(i, j, a.Matrix[i*p+j]-c.rest[i*p+j], link)
					work.moved(i, j, a.Matrix[j*p+i]-c.rest[j*p+i], link)
				}
			}
		}
	}
	return linkTime(ll.n, link)
}

// frameRounds prices the rounds of flat algorithm alg over the blocks
// that go by frames; none when the LL round carries every block.
func (c *Chooser) frameRounds(alg Algo, a ChoiceArgs, frames []int, ll llLink, flat Link, work *workLog) float64 {
	if ll.n < 0 {
		return estimateFlat(alg, frames, a.World, a.Streams, a.Window, flat, work)
	}
	if !ll.frames {
		return 0
	}
	return estimateFlat(alg, frames, a.World, a.Streams, a.Window, ll.frameLink, work)
}

// workFor is the log of each rank's own time when some machine of a is
// crowded, or nil when none is (the estimates then stand as they are).
func (c *Chooser) workFor(a ChoiceArgs) *workLog {
	c.work.t = c.work.t[:0]
	if len(a.Machines) != a.World || len(a.Cores) == 0 {
		return nil
	}
	if cap(c.machineRanks) < len(a.Cores) {
		c.machineRanks = make([]int, len(a.Cores))
		c.machineWork = make([]float64, len(a.Cores))
	}
	ranks := c.machineRanks[:len(a.Cores)]
	clear(ranks)
	for _, m := range a.Machines {
		if m >= 0 && m < len(ranks) {
			ranks[m]++
		}
	}
	crowded := false
	for m, n := range a.Cores {
		crowded = crowded || (n > 0 && ranks[m] > n)
	}
	if !crowded {
		return nil
	}
	if cap(c.work.t) < a.World {
		c.work.t = make([]float64, a.World)
	}
	c.work.t = c.work.t[:a.World]
	c.work.hosts, c.work.links = nil, a.Links
	if len(a.Hosts) == a.World {
		c.work.hosts = a.Hosts
	}
	return &c.work
}

// crowdedBound is the time the busiest crowded machine's cores need for the
// work of all its ranks: c.work.t[r] is rank r's own time under a
// candidate (the sum over rounds of alpha and the bytes it sends and
// receives, each copied on its core at its pair's link, before waiting for
// the slowest rank). A machine whose ranks do not outnumber its cores, or
// whose cores are unknown (0), bounds nothing: each rank then runs on a
// core of its own, as the per-rank model assumes. With a nil matrix
// c.work.t[0] stands for every rank (the uniform nominal matrix prices rank
// 0 alone). workFor counted the ranks.
//
// The bound is what makes the choice right where hosts share cores (network
// namespaces of one box, as the test bed, or containers of one node): an
// algorithm that moves more bytes in total, such as staged's extra local
// phase, then costs more even when its busiest rank moves fewer.
func (c *Chooser) crowdedBound(a ChoiceArgs) float64 {
	work := c.machineWork[:len(a.Cores)]
	clear(work)
	for r, m := range a.Machines {
		if m >= 0 && m < len(work) {
			if a.Matrix == nil {
				work[m] += c.work.t[0]
			} else {
				work[m] += c.work.t[r]
			}
		}
	}
	return busiestCrowded(c.machineRanks, work, a.Cores)
}

// busiestCrowded is the largest work over cores of the machines whose ranks
// outnumber their known cores (all by machine ordinal); 0 when none does.
func busiestCrowded(ranks []int, work []float64, cores []int) float64 {
	bound := 0.0
	for m, n := range cores {
		if n > 0 && ranks[m] > n {
			bound = max(bound, work[m]/float64(n))
		}
	}
	return bound
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
