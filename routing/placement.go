package routing

import "slices"

// EmptySlot is the expert of a physical slot that holds none: the padding of
// a rank that hosts fewer experts than the busiest rank (see [Placement.Slots]).
const EmptySlot = -1

// Placement says which ranks host each expert. Build one with [Contiguous],
// [FromTable], [FromSlots] or [Balance]; its slices are shared with every
// [Plan] built from it, so treat them as read-only.
//
// Experts live in physical slots: Slots() of them, the same number on every
// rank, slot s on rank s/SlotsPerRank(). A slot holds one logical expert
// ([Placement.SlotExpert]); an expert may hold several slots on different
// ranks, its replicas ([Placement.Replicas]). The placements of Contiguous
// and FromTable are the one-replica case, with rank r's slots holding
// PerRank[r] in order and [EmptySlot] after them where ranks host unequal
// numbers of experts; Shrink keeps that layout.
//
// Owner, Local and PerRank are the one-replica view that Plan and Load use.
// With replicas they describe each expert's primary replica, its lowest
// slot: a consumer that knows nothing of replicas sends all of an expert's
// rows to that one rank, which is correct but leaves the other replicas
// idle. Package dispatch spreads the rows over the replicas.
type Placement struct {
	// Experts is the number of experts E (ids 0..E-1).
	Experts int
	// Ranks is the number of ranks P (ids 0..P-1).
	Ranks int
	// Owner[e] is the rank hosting expert e (with replicas: its primary).
	Owner []int
	// Local[e] is expert e's index among its owner's experts, that is
	// PerRank[Owner[e]][Local[e]] == e.
	Local []int
	// PerRank[r] lists the experts rank r hosts (with replicas: those whose
	// primary it hosts), ascending. It may be empty (more ranks than experts,
	// or a table that leaves a rank idle).
	PerRank [][]int

	// slot[s] is the expert in physical slot s, or EmptySlot (phy2log); nil
	// for a placement assembled by hand, whose slots are derived on demand.
	slot []int
	// replicas[e] lists expert e's slots, ascending (log2phy).
	replicas [][]int
}

// Contiguous places experts in contiguous blocks: when ranks divides experts,
// expert e lives on rank e/(experts/ranks). Otherwise the split is balanced and
// still contiguous: with q = experts/ranks and m = experts%ranks, the first m
// ranks host q+1 experts and the others q (so with fewer experts than ranks the
// last ranks host none). Block sizes therefore differ by at most one.
func Contiguous(experts, ranks int) (*Placement, error) {
	if experts < 1 {
		return nil, invalidf("experts %d, want >= 1", experts)
	}
	if ranks < 1 {
		return nil, invalidf("ranks %d, want >= 1", ranks)
	}
	q, m := experts/ranks, experts%ranks
	big := m * (q + 1) // experts in the first m (larger) blocks
	owner := make([]int, experts)
	for e := range owner {
		if e < big {
			owner[e] = e / (q + 1)
		} else {
			owner[e] = m + (e-big)/q // q > 0 here: e >= big implies experts > m
		}
	}
	return newPlacement(owner, ranks), nil
}

// FromTable builds a placement from an explicit expert -> rank table. The table
// must have exactly experts entries, each in [0, ranks); any assignment is
// allowed, including ranks that host no expert. The table is copied.
func FromTable(experts, ranks int, owner []int) (*Placement, error) {
	if experts < 1 {
		return nil, invalidf("experts %d, want >= 1", experts)
	}
	if ranks < 1 {
		return nil, invalidf("ranks %d, want >= 1", ranks)
	}
	if len(owner) != experts {
		return nil, invalidf("placement table has %d entries, want %d (one per expert)", len(owner), experts)
	}
	for e, r := range owner {
		if r < 0 || r >= ranks {
			return nil, invalidf("placement table: expert %d on rank %d, want rank in [0, %d)", e, r, ranks)
		}
	}
	return newPlacement(append([]int(nil), owner...), ranks), nil
}

// FromSlots builds a placement from a physical slot table: slotExpert[s] is
// the logical expert in slot s, or [EmptySlot]. The table's length is Slots(),
// a positive multiple of ranks; slot s lives on rank s/(Slots()/ranks). Every
// expert must hold at least one slot, and no expert two slots on one rank (a
// second replica on the same rank would only split that rank's own rows). The
// table is copied.
func FromSlots(experts, ranks int, slotExpert []int) (*Placement, error) {
	if experts < 1 {
		return nil, invalidf("experts %d, want >= 1", experts)
	}
	if ranks < 1 {
		return nil, invalidf("ranks %d, want >= 1", ranks)
	}
	n := len(slotExpert)
	if n == 0 || n%ranks != 0 {
		return nil, invalidf("slot table has %d slots, want a positive multiple of %d ranks", n, ranks)
	}
	spr := n / ranks
	lastRank := make([]int, experts) // rank of e's latest slot, -1 before any
	for e := range lastRank {
		lastRank[e] = -1
	}
	for s, e := range slotExpert {
		if e == EmptySlot {
			continue
		}
		if e < 0 || e >= experts {
			return nil, invalidf("slot table: slot %d holds expert %d, want [0, %d) or EmptySlot", s, e, experts)
		}
		// Slots ascend, so a second replica on one rank follows the first.
		r := s / spr
		if lastRank[e] == r {
			return nil, invalidf("slot table: expert %d twice on rank %d", e, r)
		}
		lastRank[e] = r
	}
	if e := slices.Index(lastRank, -1); e >= 0 {
		return nil, invalidf("slot table: expert %d has no slot, want at least one replica each", e)
	}
	return fromSlots(experts, ranks, slices.Clone(slotExpert)), nil
}

// newPlacement builds the one-replica placement of a validated owner table:
// rank r's slots hold its experts ascending, padded with EmptySlot.
func newPlacement(owner []int, ranks int) *Placement {
	lists := make([][]int, ranks)
	for e, r := range owner {
		lists[r] = append(lists[r], e)
	}
	return fromLists(len(owner), lists)
}

// fromLists lays out the slots of ranks whose experts (in slot order, each at
// most once, every expert somewhere) are lists[r], padding every rank to the
// longest list.
func fromLists(experts int, lists [][]int) *Placement {
	spr := 1
	for _, l := range lists {
		spr = max(spr, len(l))
	}
	slot := make([]int, spr*len(lists))
	for r, l := range lists {
		row := slot[r*spr : (r+1)*spr]
		n := copy(row, l)
		for i := n; i < spr; i++ {
			row[i] = EmptySlot
		}
	}
	return fromSlots(experts, len(lists), slot)
}

// fromSlots derives the replica lists and the primary view (Owner, Local,
// PerRank) from a validated slot table it keeps.
func fromSlots(experts, ranks int, slot []int) *Placement {
	spr := len(slot) / ranks
	count := make([]int, experts)
	filled := 0
	for _, e := range slot {
		if e != EmptySlot {
			count[e]++
			filled++
		}
	}
	// One backing array per table keeps the placement to a few allocations.
	replicas := carve(make([]int, filled), count)
	for s, e := range slot {
		if e != EmptySlot {
			replicas[e] = append(replicas[e], s)
		}
	}
	owner := make([]int, experts)
	perRankCount := make([]int, ranks)
	for e, rs := range replicas {
		owner[e] = rs[0] / spr
		perRankCount[owner[e]]++
	}
	perRank := carve(make([]int, experts), perRankCount)
	local := make([]int, experts)
	for e, r := range owner {
		local[e] = len(perRank[r])
		perRank[r] = append(perRank[r], e)
	}
	return &Placement{Experts: experts, Ranks: ranks, Owner: owner, Local: local, PerRank: perRank,
		slot: slot, replicas: replicas}
}

// carve cuts backing into empty slices with capacities counts, to be filled
// by append.
func carve(backing, counts []int) [][]int {
	out := make([][]int, len(counts))
	off := 0
	for i, n := range counts {
		out[i] = backing[off : off : off+n]
		off += n
	}
	return out
}

// Slots returns the number of physical slots, a multiple of Ranks.
func (pl *Placement) Slots() int { return len(pl.slotTable()) }

// SlotsPerRank returns the number of physical slots on every rank.
func (pl *Placement) SlotsPerRank() int { return len(pl.slotTable()) / pl.Ranks }

// SlotExpert returns the logical expert in physical slot s, or [EmptySlot]
// (phy2log). s must be in [0, Slots()).
func (pl *Placement) SlotExpert(s int) int { return pl.slotTable()[s] }

// SlotTable returns every slot's expert in slot order, [EmptySlot] for an
// empty one (the whole phy2log table): what a caller walking all slots
// wants, as SlotExpert on a placement assembled by hand derives the table on
// every call. The slice is shared: do not modify it.
func (pl *Placement) SlotTable() []int { return pl.slotTable() }

// Replicas returns the physical slots of expert e, ascending (log2phy); the
// first is its primary, on rank Owner[e]. The slice is shared: do not modify
// it. e must be in [0, Experts).
func (pl *Placement) Replicas(e int) []int {
	if pl.replicas != nil {
		return pl.replicas[e]
	}
	return []int{pl.Owner[e]*pl.SlotsPerRank() + pl.Local[e]}
}

// RankLoad returns the load each rank carries under the placement when
// load[e], expert e's load, is split evenly over e's replicas (as a dispatch
// that spreads an expert's tokens over its replicas does). It returns an
// error matching [ErrInvalid] if load does not have one entry per expert.
func (pl *Placement) RankLoad(load []float64) ([]float64, error) {
	if len(load) != pl.Experts {
		return nil, invalidf("rank load: %d expert loads, want %d", len(load), pl.Experts)
	}
	slot := pl.slotTable()
	spr := len(slot) / pl.Ranks
	out := make([]float64, pl.Ranks)
	for s, e := range slot {
		if e != EmptySlot {
			out[s/spr] += load[e] / float64(len(pl.Replicas(e)))
		}
	}
	return out, nil
}

// slotTable returns the slot table, or derives the one-replica layout of a
// placement assembled by hand from PerRank (allocating on every call).
func (pl *Placement) slotTable() []int {
	if pl.slot != nil {
		return pl.slot
	}
	return fromLists(pl.Experts, pl.PerRank).slot
}

// Validate checks that the placement is internally consistent, which matters
// only for placements assembled by hand rather than by a constructor, or
// modified since. It does not allocate.
func (pl *Placement) Validate() error {
	if pl == nil {
		return invalidf("nil placement")
	}
	if pl.Experts < 1 || pl.Ranks < 1 {
		return invalidf("placement with %d experts over %d ranks, want both >= 1", pl.Experts, pl.Ranks)
	}
	if len(pl.Owner) != pl.Experts || len(pl.Local) != pl.Experts {
		return invalidf("placement tables have %d owners and %d local indices, want %d each",
			len(pl.Owner), len(pl.Local), pl.Experts)
	}
	if len(pl.PerRank) != pl.Ranks {
		return invalidf("placement lists experts for %d ranks, want %d", len(pl.PerRank), pl.Ranks)
	}
	listed := 0
	for _, es := range pl.PerRank {
		listed += len(es)
	}
	if listed != pl.Experts {
		return invalidf("placement lists %d experts across ranks, want %d", listed, pl.Experts)
	}
	for e, r := range pl.Owner {
		if r < 0 || r >= pl.Ranks {
			return invalidf("placement: expert %d on rank %d, want rank in [0, %d)", e, r, pl.Ranks)
		}
		l := pl.Local[e]
		if l < 0 || l >= len(pl.PerRank[r]) || pl.PerRank[r][l] != e {
			return invalidf("placement: expert %d has local index %d on rank %d, inconsistent with PerRank", e, l, r)
		}
		if l > 0 && pl.PerRank[r][l-1] >= e {
			return invalidf("placement: PerRank[%d] not ascending at index %d", r, l)
		}
	}
	if pl.slot == nil && pl.replicas == nil {
		return nil // assembled by hand: one replica, slots derived from PerRank
	}
	return pl.validateSlots()
}

// validateSlots checks the slot table against the replica lists and Owner:
// every filled slot listed exactly once, under its expert, replicas on
// distinct ranks, the primary on the owner.
func (pl *Placement) validateSlots() error {
	n := len(pl.slot)
	if n == 0 || n%pl.Ranks != 0 || len(pl.replicas) != pl.Experts {
		return invalidf("placement has %d slots and %d replica lists, want a positive multiple of %d and %d",
			n, len(pl.replicas), pl.Ranks, pl.Experts)
	}
	spr := n / pl.Ranks
	filled, listed := 0, 0
	for s, e := range pl.slot {
		if e < EmptySlot || e >= pl.Experts {
			return invalidf("placement: slot %d holds expert %d, want [0, %d) or EmptySlot", s, e, pl.Experts)
		}
		if e != EmptySlot {
			filled++
		}
	}
	for e, rs := range pl.replicas {
		if len(rs) == 0 || rs[0]/spr != pl.Owner[e] {
			return invalidf("placement: expert %d has replicas %v, want its first on rank %d", e, rs, pl.Owner[e])
		}
		for i, s := range rs {
			if s < 0 || s >= n || pl.slot[s] != e || (i > 0 && s/spr <= rs[i-1]/spr) {
				return invalidf("placement: expert %d has replicas %v, inconsistent with its slots", e, rs)
			}
		}
		listed += len(rs)
	}
	if listed != filled {
		return invalidf("placement lists %d replicas, want %d (the filled slots)", listed, filled)
	}
	return nil
}

// Shrink re-places the experts over the survivors of a lost rank, as
// a2a.Comm.Shrink renumbers them: survivors[i] is the old rank of new rank i
// (Comm.FormerRanks), ascending. A survivor keeps its experts, replicas
// included; each expert left with no replica moves to the survivor hosting
// the fewest experts at that moment (the lowest rank among equals), so the
// load stays as even as whole experts allow. Each survivor's slots are laid
// out anew, its experts ascending, padded with EmptySlot to the busiest
// survivor's count. The caller must be able to run the moved experts (their
// weights from a checkpoint or a replica).
func (pl *Placement) Shrink(survivors []int) (*Placement, error) {
	if err := pl.Validate(); err != nil {
		return nil, err
	}
	if len(survivors) == 0 {
		return nil, invalidf("shrink: no survivors")
	}
	newRank := make([]int, pl.Ranks)
	for r := range newRank {
		newRank[r] = -1
	}
	for i, r := range survivors {
		if r < 0 || r >= pl.Ranks || (i > 0 && r <= survivors[i-1]) {
			return nil, invalidf("shrink: survivors %v, want ascending ranks in [0, %d)", survivors, pl.Ranks)
		}
		newRank[r] = i
	}
	slot := pl.slotTable()
	spr := len(slot) / pl.Ranks
	lists := make([][]int, len(survivors))
	kept := make([]bool, pl.Experts)
	for s, e := range slot {
		if nr := newRank[s/spr]; e != EmptySlot && nr >= 0 {
			lists[nr] = append(lists[nr], e)
			kept[e] = true
		}
	}
	for e, k := range kept {
		if k {
			continue
		}
		to := 0
		for r, l := range lists {
			if len(l) < len(lists[to]) {
				to = r
			}
		}
		lists[to] = append(lists[to], e)
	}
	for _, l := range lists {
		slices.Sort(l)
	}
	return fromLists(pl.Experts, lists), nil
}
