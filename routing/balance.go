package routing

import (
	"cmp"
	"math"
	"slices"
)

// Balance computes a placement of len(load) logical experts in slots
// physical slots over ranks ranks, ranksPerHost to a host, that evens out the
// per-rank load; load[e] is expert e's load (tokens per step, or a moving
// average of them). It is the policy of DeepSeek's EPLB, written anew, with
// one difference: no rank ever holds two replicas of one expert. The result
// depends only on the arguments: every rank computes the same placement from
// the same loads.
//
// With more than one host, when the hosts divide the experts evenly and each
// host's experts can fill its slots (at most one replica per rank), the policy
// is hierarchical, which keeps all replicas of an expert on one host:
//
//  1. pack the experts onto hosts, the same number on each, heaviest first
//     into the lightest host;
//  2. within each host, add replicas one at a time to the expert with the
//     highest load per replica, up to one per rank of the host;
//  3. pack each host's replicas onto its ranks the same way, the same number
//     on each rank, no expert twice on a rank.
//
// Otherwise (one host, or experts that do not divide) the policy is global:
// replicate over all slots, up to one replica per rank, and pack onto all
// ranks. Each rank's slots hold its experts ascending.
//
// Packing sorts the replicas heaviest first, an expert's replicas one after
// another (they weigh the same), and deals them so that every rank gets the
// same number. It tries three deals and keeps the one with the lightest
// busiest rank: each replica to the lightest rank with room (EPLB's, usually
// the best, but it can strand an expert's last replica where only ranks that
// hold it have room); rounds of one replica per rank, the heaviest of a round
// to the lightest rank that may take it (never stranded: only the expert
// straddling two rounds has ranks to avoid, and it has at most one replica per
// rank); and round-robin, replica i to rank i mod R (never two on a rank, as an
// expert's at most R replicas are consecutive). Round-robin proves the bound
// the result keeps:
//
//	max rank load <= mean rank load + (1 - 1/R) * (wmax - wmin)
//
// where R is the number of ranks packed together and wmax, wmin are the
// largest and smallest replica loads (load[e] / replicas of e) among them.
// Proof for round-robin, with replica loads w0 >= w1 >= ... dealt in order:
// rank i takes w(i), w(i+R), ...; for ranks i < j each w(tR+j) >= w((t+1)R+i),
// so load(i) - load(j) telescopes to at most w(i) - w(last of j) <= wmax - wmin,
// and load(j) <= load(i); max - mean is at most (1 - 1/R) of max - min. With
// the hierarchical policy the bound holds within each host against the host's
// mean, and the hosts' loads obey it with whole experts as the items
// (R = hosts, w = load[e]): the price of keeping replicas on one host.
//
// Balance returns an error matching [ErrInvalid] unless: there is at least
// one expert, every load is finite and >= 0, ranks >= 1, ranksPerHost >= 1
// divides ranks, and slots is a multiple of ranks with experts <= slots <=
// experts*ranks (every expert needs a slot, and more slots than that would
// put two replicas of an expert on one rank).
func Balance(load []float64, ranks, ranksPerHost, slots int) (*Placement, error) {
	if err := checkBalance(load, ranks, ranksPerHost, slots); err != nil {
		return nil, err
	}
	experts := len(load)
	hosts := ranks / ranksPerHost
	if !hierarchical(experts, ranks, ranksPerHost, slots) {
		all := make([]int, experts)
		for e := range all {
			all[e] = e
		}
		return fromLists(experts, replicateAndPack(load, all, ranks, slots/ranks)), nil
	}
	// Whole experts onto hosts: each is one item, its load the weight.
	perHost := packExperts(load, hosts)
	lists := make([][]int, 0, ranks)
	for _, members := range perHost {
		slices.Sort(members)
		lists = append(lists, replicateAndPack(load, members, ranksPerHost, slots/ranks)...)
	}
	return fromLists(experts, lists), nil
}

// hierarchical reports whether Balance uses the hierarchical policy: several
// hosts, experts divided evenly among them, and enough experts per host to
// fill the host's slots with at most one replica of each per rank.
func hierarchical(experts, ranks, ranksPerHost, slots int) bool {
	hosts := ranks / ranksPerHost
	return hosts > 1 && experts%hosts == 0 && (experts/hosts)*ranksPerHost >= slots/hosts
}

func checkBalance(load []float64, ranks, ranksPerHost, slots int) error {
	experts := len(load)
	if experts < 1 {
		return invalidf("balance: no experts (empty load)")
	}
	for e, l := range load {
		if !(l >= 0) || math.IsInf(l, 1) {
			return invalidf("balance: load[%d] = %v, want finite and >= 0", e, l)
		}
	}
	if ranks < 1 || ranksPerHost < 1 || ranks%ranksPerHost != 0 {
		return invalidf("balance: %d ranks, %d per host, want both >= 1 and whole hosts", ranks, ranksPerHost)
	}
	if slots%ranks != 0 || slots < experts || slots/ranks > experts {
		return invalidf("balance: %d slots for %d experts on %d ranks, want a multiple of the ranks in [%d, %d]",
			slots, experts, ranks, experts, experts*ranks)
	}
	return nil
}

// replicateAndPack gives the experts members (ascending ids) the bins*perBin
// slots of bins ranks: replicas by load, then packed. It returns each bin's
// experts, ascending. The caller guarantees len(members) <= bins*perBin <=
// len(members)*bins.
func replicateAndPack(load []float64, members []int, bins, perBin int) [][]int {
	count := replicate(load, members, bins*perBin, bins)
	items := make([]item, 0, bins*perBin)
	for i, e := range members {
		w := load[e] / float64(count[i])
		for range count[i] {
			items = append(items, item{expert: e, w: w})
		}
	}
	lists := pack(items, bins)
	for _, l := range lists {
		slices.Sort(l)
	}
	return lists
}

// replicate returns how many replicas each of members gets out of total:
// one each, then one at a time to the member with the highest load per
// replica (the lowest id among equals), at most limit each.
func replicate(load []float64, members []int, total, limit int) []int {
	count := make([]int, len(members))
	for i := range count {
		count[i] = 1
	}
	for range total - len(members) {
		best := -1
		for i, e := range members {
			if count[i] == limit {
				continue
			}
			if best < 0 || load[e]/float64(count[i]) > load[members[best]]/float64(count[best]) {
				best = i
			}
		}
		count[best]++ // total <= len(members)*limit leaves one with room
	}
	return count
}

// packExperts packs whole experts onto hosts, the same number on each,
// returning each host's experts.
func packExperts(load []float64, hosts int) [][]int {
	items := make([]item, len(load))
	for e, l := range load {
		items[e] = item{expert: e, w: l}
	}
	return pack(items, hosts)
}

// item is one replica to pack: its expert and its load.
type item struct {
	expert int
	w      float64
}

// pack deals items onto bins, len(items)/bins each (a multiple), so that no
// bin takes two items of one expert given no expert has more than bins items.
// It tries the three deals Balance describes and returns the bins' experts
// of the one with the lightest busiest bin, the first among equals.
func pack(items []item, bins int) [][]int {
	// Heaviest first; an expert's replicas weigh the same, so the expert id
	// tie-break keeps them together, which is what makes the deals valid.
	slices.SortStableFunc(items, func(a, b item) int {
		if c := cmp.Compare(b.w, a.w); c != 0 {
			return c
		}
		return cmp.Compare(a.expert, b.expert)
	})
	// Filling the lightest bin with room packs best, but can strand an
	// expert's last replica on bins that all hold it; rounds of one item per
	// bin cannot (see dealGreedy), and round-robin carries the bound.
	var best []int
	top := math.Inf(1)
	for _, perPhase := range []int{len(items) / bins, 1, 0} {
		to, ok := dealGreedy(items, bins, perPhase)
		if !ok {
			continue
		}
		if l := busiest(items, to, bins); l < top {
			best, top = to, l
		}
	}
	lists := make([][]int, bins)
	for i, b := range best {
		lists[b] = append(lists[b], items[i].expert)
	}
	return lists
}

// dealGreedy deals sorted items in phases in which each bin takes perPhase
// items: each item to the lightest bin (lowest index among equals) that has
// room left in the phase and does not hold the item's expert. With perPhase
// equal to len(items)/bins there is one phase: the lightest bin with room.
// With perPhase 1 the phases are rounds of one item per bin, and no item is
// ever left without a bin: only the expert straddling a round boundary has
// bins to avoid, its items come first in the round, and it has at most bins
// items in all, so bins it does not hold are free for each. It returns the
// bin of each item; ok is false if some item found no bin. perPhase 0 deals
// round-robin instead: item i to bin i mod bins.
func dealGreedy(items []item, bins, perPhase int) (to []int, ok bool) {
	to = make([]int, len(items))
	if perPhase == 0 {
		for i := range to {
			to[i] = i % bins
		}
		return to, true
	}
	loads := make([]float64, bins)
	last := make([]int, bins) // expert of the bin's latest item, -1 before any
	for b := range last {
		last[b] = -1
	}
	used := make([]int, bins) // items taken in this phase
	phase := bins * perPhase
	for i, it := range items {
		if i%phase == 0 {
			clear(used)
		}
		pick := -1
		for b := range bins {
			// An expert's items are consecutive, so the bin's latest expert
			// tells whether it holds this one.
			if used[b] < perPhase && last[b] != it.expert && (pick < 0 || loads[b] < loads[pick]) {
				pick = b
			}
		}
		if pick < 0 {
			return nil, false
		}
		to[i], last[pick] = pick, it.expert
		used[pick]++
		loads[pick] += it.w
	}
	return to, true
}

// busiest returns the largest bin load of the assignment to.
func busiest(items []item, to []int, bins int) float64 {
	loads := make([]float64, bins)
	for i, b := range to {
		loads[b] += items[i].w
	}
	return slices.Max(loads)
}
