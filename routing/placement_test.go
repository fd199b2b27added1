package routing

import (
	"errors"
	"slices"
	"testing"
)

func TestContiguous(t *testing.T) {
	tests := []struct {
		experts, ranks int
		owner          []int
	}{
		{16, 4, []int{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}},
		{4, 1, []int{0, 0, 0, 0}},
		{4, 4, []int{0, 1, 2, 3}},
		// 10 over 4: two blocks of 3, then two of 2.
		{10, 4, []int{0, 0, 0, 1, 1, 1, 2, 2, 3, 3}},
		// 7 over 3: 3, 2, 2.
		{7, 3, []int{0, 0, 0, 1, 1, 2, 2}},
		// Fewer experts than ranks: the last ranks host nothing.
		{3, 5, []int{0, 1, 2}},
	}
	for _, tc := range tests {
		pl, err := Contiguous(tc.experts, tc.ranks)
		if err != nil {
			t.Fatalf("Contiguous(%d, %d): %v", tc.experts, tc.ranks, err)
		}
		if !slices.Equal(pl.Owner, tc.owner) {
			t.Errorf("Contiguous(%d, %d) owner = %v, want %v", tc.experts, tc.ranks, pl.Owner, tc.owner)
		}
		if err := pl.Validate(); err != nil {
			t.Errorf("Contiguous(%d, %d) does not validate: %v", tc.experts, tc.ranks, err)
		}
		checkPlacement(t, pl)
		// Blocks differ by at most one expert.
		lo, hi := tc.experts, 0
		for _, es := range pl.PerRank {
			lo, hi = min(lo, len(es)), max(hi, len(es))
		}
		if hi-lo > 1 {
			t.Errorf("Contiguous(%d, %d) block sizes range %d..%d", tc.experts, tc.ranks, lo, hi)
		}
	}
}

// checkPlacement verifies Local and PerRank against Owner from first principles.
func checkPlacement(t *testing.T, pl *Placement) {
	t.Helper()
	for r := range pl.Ranks {
		var want []int
		for e, o := range pl.Owner {
			if o == r {
				want = append(want, e)
			}
		}
		if !slices.Equal(pl.PerRank[r], want) {
			t.Errorf("PerRank[%d] = %v, want %v", r, pl.PerRank[r], want)
		}
		for l, e := range want {
			if pl.Local[e] != l {
				t.Errorf("Local[%d] = %d, want %d", e, pl.Local[e], l)
			}
		}
	}
}

func TestFromTable(t *testing.T) {
	owner := []int{2, 0, 2, 1, 0, 2}
	pl, err := FromTable(6, 3, owner)
	if err != nil {
		t.Fatal(err)
	}
	checkPlacement(t, pl)
	if want := [][]int{{1, 4}, {3}, {0, 2, 5}}; !slices.EqualFunc(pl.PerRank, want, slices.Equal) {
		t.Errorf("PerRank = %v, want %v", pl.PerRank, want)
	}
	owner[0] = 1 // the placement must own its copy
	if pl.Owner[0] != 2 {
		t.Errorf("FromTable aliases the caller's table")
	}
	// A rank may be left idle.
	idle, err := FromTable(2, 3, []int{0, 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(idle.PerRank[1]) != 0 {
		t.Errorf("idle rank hosts %v", idle.PerRank[1])
	}
}

func TestPlacementErrors(t *testing.T) {
	tests := []struct {
		name string
		fn   func() (*Placement, error)
	}{
		{"contiguous no experts", func() (*Placement, error) { return Contiguous(0, 2) }},
		{"contiguous no ranks", func() (*Placement, error) { return Contiguous(4, 0) }},
		{"table short", func() (*Placement, error) { return FromTable(4, 2, []int{0, 1, 1}) }},
		{"table long", func() (*Placement, error) { return FromTable(2, 2, []int{0, 1, 1}) }},
		{"table rank too high", func() (*Placement, error) { return FromTable(3, 2, []int{0, 2, 1}) }},
		{"table rank negative", func() (*Placement, error) { return FromTable(3, 2, []int{0, -1, 1}) }},
		{"table no ranks", func() (*Placement, error) { return FromTable(1, 0, []int{0}) }},
		{"table no experts", func() (*Placement, error) { return FromTable(0, 1, nil) }},
	}
	for _, tc := range tests {
		pl, err := tc.fn()
		if !errors.Is(err, ErrInvalid) || pl != nil {
			t.Errorf("%s: got (%v, %v), want nil and ErrInvalid", tc.name, pl, err)
		}
	}
}

func TestPlacementValidate(t *testing.T) {
	contiguous := func() (*Placement, error) { return Contiguous(4, 2) }
	// 3 experts over 2 ranks of 2 slots, expert 0 on both.
	replicated := func() (*Placement, error) { return FromSlots(3, 2, []int{0, 1, 0, 2}) }
	tests := []struct {
		name    string
		good    func() (*Placement, error)
		corrupt func(*Placement)
	}{
		{"owner out of range", contiguous, func(pl *Placement) { pl.Owner[3] = 2 }},
		{"owner disagrees with PerRank", contiguous, func(pl *Placement) { pl.Owner[0] = 1 }},
		{"local wrong", contiguous, func(pl *Placement) { pl.Local[1] = 0 }},
		{"short owner", contiguous, func(pl *Placement) { pl.Owner = pl.Owner[:3] }},
		{"missing rank list", contiguous, func(pl *Placement) { pl.PerRank = pl.PerRank[:1] }},
		{"not ascending", contiguous, func(pl *Placement) {
			pl.PerRank[0][0], pl.PerRank[0][1] = 1, 0
			pl.Local[0], pl.Local[1] = 1, 0
		}},
		{"experts mismatch", contiguous, func(pl *Placement) { pl.Experts = 5 }},
		{"slot out of range", replicated, func(pl *Placement) { pl.slot[1] = 3 }},
		{"slot disagrees with replicas", replicated, func(pl *Placement) { pl.slot[1] = 2 }},
		{"slot table short", replicated, func(pl *Placement) { pl.slot = pl.slot[:3] }},
		{"replica lists short", replicated, func(pl *Placement) { pl.replicas = pl.replicas[:2] }},
		{"replica unlisted", replicated, func(pl *Placement) { pl.replicas[0] = pl.replicas[0][:1] }},
		{"primary not on owner", replicated, func(pl *Placement) { pl.replicas[0][0], pl.replicas[0][1] = 2, 0 }},
		{"expert without replica", replicated, func(pl *Placement) { pl.replicas[1] = nil }},
	}
	for _, tc := range tests {
		pl, err := tc.good()
		if err != nil {
			t.Fatal(err)
		}
		if err := pl.Validate(); err != nil {
			t.Fatalf("%s: uncorrupted placement does not validate: %v", tc.name, err)
		}
		tc.corrupt(pl)
		if err := pl.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Validate = %v, want ErrInvalid", tc.name, err)
		}
	}
	var nilPl *Placement
	if err := nilPl.Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil placement: Validate = %v, want ErrInvalid", err)
	}
	pl, err := replicated()
	if err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(10, func() { _ = pl.Validate() }); n != 0 {
		t.Errorf("Validate allocates %v times, want 0 (Plan.Build runs it every step)", n)
	}
}

func TestPlacementShrink(t *testing.T) {
	contiguous := func(e, r int) *Placement {
		pl, err := Contiguous(e, r)
		if err != nil {
			t.Fatal(err)
		}
		return pl
	}
	tests := []struct {
		name      string
		pl        *Placement
		survivors []int
		want      []int // owner of each expert, new numbering; nil: an error
	}{
		{"lose a middle rank", contiguous(8, 4), []int{0, 1, 3}, []int{0, 0, 1, 1, 0, 1, 2, 2}},
		{"lose the first rank", contiguous(8, 4), []int{1, 2, 3}, []int{0, 1, 0, 0, 1, 1, 2, 2}},
		{"lose two", contiguous(6, 3), []int{2}, []int{0, 0, 0, 0, 0, 0}},
		{"nobody lost", contiguous(4, 2), []int{0, 1}, []int{0, 0, 1, 1}},
		{"unsorted", contiguous(4, 2), []int{1, 0}, nil},
		{"out of range", contiguous(4, 2), []int{0, 2}, nil},
		{"none", contiguous(4, 2), nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.pl.Shrink(tc.survivors)
			if tc.want == nil {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("Shrink(%v): %v, want ErrInvalid", tc.survivors, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := got.Validate(); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Owner, tc.want) || got.Ranks != len(tc.survivors) {
				t.Errorf("owners %v over %d ranks, want %v over %d", got.Owner, got.Ranks, tc.want, len(tc.survivors))
			}
		})
	}
}

// slotsOf returns the placement's slot table through the exported methods.
func slotsOf(pl *Placement) []int {
	out := make([]int, pl.Slots())
	for s := range out {
		out[s] = pl.SlotExpert(s)
	}
	return out
}

func TestPlacementSlotsOneReplica(t *testing.T) {
	tests := []struct {
		name  string
		pl    func() (*Placement, error)
		slots []int
	}{
		{"contiguous even", func() (*Placement, error) { return Contiguous(4, 2) }, []int{0, 1, 2, 3}},
		// 10 over 4 hosts 3, 3, 2, 2: the short ranks are padded.
		{"contiguous uneven", func() (*Placement, error) { return Contiguous(10, 4) },
			[]int{0, 1, 2, 3, 4, 5, 6, 7, -1, 8, 9, -1}},
		{"contiguous idle ranks", func() (*Placement, error) { return Contiguous(2, 3) }, []int{0, 1, -1}},
		{"table", func() (*Placement, error) { return FromTable(3, 2, []int{1, 0, 1}) }, []int{1, -1, 0, 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pl, err := tc.pl()
			if err != nil {
				t.Fatal(err)
			}
			if got := slotsOf(pl); !slices.Equal(got, tc.slots) {
				t.Fatalf("slots %v, want %v", got, tc.slots)
			}
			spr := pl.SlotsPerRank()
			for e := range pl.Experts {
				// One replica, in rank Owner[e]'s local slot Local[e].
				if rs := pl.Replicas(e); len(rs) != 1 || rs[0] != pl.Owner[e]*spr+pl.Local[e] {
					t.Errorf("Replicas(%d) = %v, want [%d]", e, rs, pl.Owner[e]*spr+pl.Local[e])
				}
			}
			// A hand-assembled copy derives the same slots.
			hand := &Placement{Experts: pl.Experts, Ranks: pl.Ranks, Owner: pl.Owner, Local: pl.Local, PerRank: pl.PerRank}
			if err := hand.Validate(); err != nil {
				t.Fatal(err)
			}
			if got := slotsOf(hand); !slices.Equal(got, tc.slots) {
				t.Errorf("hand-assembled slots %v, want %v", got, tc.slots)
			}
			for e := range pl.Experts {
				if !slices.Equal(hand.Replicas(e), pl.Replicas(e)) {
					t.Errorf("hand-assembled Replicas(%d) = %v, want %v", e, hand.Replicas(e), pl.Replicas(e))
				}
			}
		})
	}
}

func TestFromSlots(t *testing.T) {
	// 3 experts, 2 ranks of 3 slots: expert 0 on both ranks, one slot empty.
	pl, err := FromSlots(3, 2, []int{2, 0, -1, 0, 1, 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := pl.Validate(); err != nil {
		t.Fatal(err)
	}
	if pl.Slots() != 6 || pl.SlotsPerRank() != 3 {
		t.Fatalf("%d slots, %d per rank; want 6, 3", pl.Slots(), pl.SlotsPerRank())
	}
	wantReplicas := [][]int{{1, 3}, {4}, {0, 5}}
	for e, want := range wantReplicas {
		if got := pl.Replicas(e); !slices.Equal(got, want) {
			t.Errorf("Replicas(%d) = %v, want %v", e, got, want)
		}
	}
	// The one-replica view follows each expert's primary (lowest) slot.
	if !slices.Equal(pl.Owner, []int{0, 1, 0}) || !slices.Equal(pl.PerRank[0], []int{0, 2}) || !slices.Equal(pl.PerRank[1], []int{1}) {
		t.Errorf("Owner %v PerRank %v, want [0 1 0] [[0 2] [1]]", pl.Owner, pl.PerRank)
	}
	checkPlacement(t, pl)
	load, err := pl.RankLoad([]float64{4, 3, 2})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(load, []float64{3, 6}) {
		t.Errorf("RankLoad = %v, want [3 6] (expert 0 split, 2 split)", load)
	}
	if _, err := pl.RankLoad([]float64{1}); !errors.Is(err, ErrInvalid) {
		t.Errorf("RankLoad of a short load: %v, want ErrInvalid", err)
	}
	// Round trip: a one-replica placement's slots rebuild it.
	c, err := Contiguous(10, 4)
	if err != nil {
		t.Fatal(err)
	}
	back, err := FromSlots(10, 4, slotsOf(c))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back.Owner, c.Owner) || !slices.Equal(back.Local, c.Local) {
		t.Errorf("FromSlots(slots of Contiguous(10, 4)) owners %v, want %v", back.Owner, c.Owner)
	}
}

func TestFromSlotsInvalid(t *testing.T) {
	tests := []struct {
		name           string
		experts, ranks int
		slots          []int
	}{
		{"no experts", 0, 1, []int{0}},
		{"no ranks", 1, 0, []int{0}},
		{"no slots", 1, 1, nil},
		{"not a multiple of ranks", 2, 2, []int{0, 1, 1}},
		{"expert out of range", 2, 1, []int{0, 2}},
		{"negative expert", 2, 1, []int{0, -2, 1}},
		{"expert without replica", 3, 2, []int{0, 1, 0, 1}},
		{"two replicas on a rank", 2, 2, []int{0, 0, 1, -1}},
	}
	for _, tc := range tests {
		pl, err := FromSlots(tc.experts, tc.ranks, tc.slots)
		if !errors.Is(err, ErrInvalid) || pl != nil {
			t.Errorf("%s: got (%v, %v), want nil and ErrInvalid", tc.name, pl, err)
		}
	}
}

func TestPlacementShrinkReplicas(t *testing.T) {
	// 4 experts over 3 ranks of 2 slots; expert 0 on ranks 0 and 1.
	pl, err := FromSlots(4, 3, []int{0, 1, 0, 2, 3, -1})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		survivors []int
		slots     []int
	}{
		// Rank 0 lost: expert 0 keeps its replica on rank 1, expert 1 moves to
		// the emptier survivor (old rank 2).
		{"replica survives", []int{1, 2}, []int{0, 2, 1, 3}},
		// Rank 1 lost: expert 2 moves to old rank 2, which hosts one.
		{"orphan to the emptiest", []int{0, 2}, []int{0, 1, 2, 3}},
		{"one left", []int{2}, []int{0, 1, 2, 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := pl.Shrink(tc.survivors)
			if err != nil {
				t.Fatal(err)
			}
			if err := got.Validate(); err != nil {
				t.Fatal(err)
			}
			if s := slotsOf(got); !slices.Equal(s, tc.slots) {
				t.Errorf("slots %v, want %v", s, tc.slots)
			}
		})
	}
}

// TestPlanOverReplicas checks that a placement with replicas still plans like
// its one-replica view: every row goes to its expert's primary rank.
func TestPlanOverReplicas(t *testing.T) {
	// What Balance makes of loads 10, 1, 1, 1 on 2 ranks with 6 slots.
	pl, err := FromSlots(4, 2, []int{0, 1, 2, 0, 1, 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(pl.Replicas(0)) != 2 {
		t.Fatalf("expert 0 has replicas %v, want 2", pl.Replicas(0))
	}
	var d Decision
	if err := FromAssignments([]int32{0, 1, 0, 2, 3, 0}, make([]float32, 6), 3, 2, 4, &d); err != nil {
		t.Fatal(err)
	}
	var p Plan
	if err := p.Build(&d, pl); err != nil {
		t.Fatal(err)
	}
	for i := range p.Rows {
		e := d.Expert[p.Order[i]]
		if r := pl.Owner[e]; i < p.RankStart[r] || i >= p.RankStart[r+1] {
			t.Errorf("row %d of expert %d outside its primary rank %d's segment", i, e, r)
		}
	}
	if p.Rows != 6 || p.RankStart[2] != 6 {
		t.Errorf("plan has %d rows ending at %d, want 6", p.Rows, p.RankStart[2])
	}
}

// TestSlotTable: the table is SlotExpert of every slot, for a placement
// with replicas and for one assembled by hand.
func TestSlotTable(t *testing.T) {
	withReplicas, err := FromSlots(3, 2, []int{0, 1, 0, 2})
	if err != nil {
		t.Fatal(err)
	}
	byHand := &Placement{Experts: 3, Ranks: 2, Owner: []int{0, 0, 1}, Local: []int{0, 1, 0}, PerRank: [][]int{{0, 1}, {2}}}
	for _, tc := range []struct {
		pl   *Placement
		want []int
	}{
		{withReplicas, []int{0, 1, 0, 2}},
		{byHand, []int{0, 1, 2, EmptySlot}},
	} {
		got := tc.pl.SlotTable()
		if !slices.Equal(got, tc.want) {
			t.Errorf("SlotTable %v, want %v", got, tc.want)
		}
		for s, e := range got {
			if tc.pl.SlotExpert(s) != e {
				t.Errorf("slot %d: SlotExpert %d, table %d", s, tc.pl.SlotExpert(s), e)
			}
		}
	}
}
