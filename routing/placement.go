package routing

// Placement says which rank hosts each expert. Build one with [Contiguous] or
// [FromTable]; its slices are shared with every [Plan] built from it, so treat
// them as read-only.
type Placement struct {
	// Experts is the number of experts E (ids 0..E-1).
	Experts int
	// Ranks is the number of ranks P (ids 0..P-1).
	Ranks int
	// Owner[e] is the rank hosting expert e.
	Owner []int
	// Local[e] is expert e's index among its owner's experts, that is
	// PerRank[Owner[e]][Local[e]] == e.
	Local []int
	// PerRank[r] lists the experts rank r hosts, ascending. It may be empty
	// (more ranks than experts, or a table that leaves a rank idle).
	PerRank [][]int
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

// newPlacement derives Local and PerRank from a validated owner table it keeps.
func newPlacement(owner []int, ranks int) *Placement {
	counts := make([]int, ranks)
	for _, r := range owner {
		counts[r]++
	}
	// One backing array for all ranks keeps the placement to a few allocations.
	backing := make([]int, len(owner))
	perRank := make([][]int, ranks)
	off := 0
	for r, n := range counts {
		perRank[r] = backing[off : off : off+n]
		off += n
	}
	local := make([]int, len(owner))
	for e, r := range owner {
		local[e] = len(perRank[r])
		perRank[r] = append(perRank[r], e)
	}
	return &Placement{Experts: len(owner), Ranks: ranks, Owner: owner, Local: local, PerRank: perRank}
}

// Validate checks that the placement is internally consistent, which matters
// only for placements assembled by hand rather than by Contiguous or FromTable.
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
	return nil
}

// Shrink re-places the experts over the survivors of a lost rank, as
// a2a.Comm.Shrink renumbers them: survivors[i] is the old rank of new rank i
// (Comm.FormerRanks), ascending. A survivor keeps its experts; each expert of
// a lost rank moves to the survivor hosting the fewest experts at that
// moment (the lowest rank among equals), so the load stays as even as whole
// experts allow. The caller must be able to run the moved experts (their
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
	owner := make([]int, pl.Experts)
	hosted := make([]int, len(survivors))
	var orphans []int
	for e, r := range pl.Owner {
		if nr := newRank[r]; nr >= 0 {
			owner[e] = nr
			hosted[nr]++
		} else {
			orphans = append(orphans, e)
		}
	}
	for _, e := range orphans {
		to := 0
		for r, n := range hosted {
			if n < hosted[to] {
				to = r
			}
		}
		owner[e] = to
		hosted[to]++
	}
	return newPlacement(owner, len(survivors)), nil
}
