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
	good := func() *Placement {
		pl, err := Contiguous(4, 2)
		if err != nil {
			t.Fatal(err)
		}
		return pl
	}
	tests := []struct {
		name    string
		corrupt func(*Placement)
	}{
		{"owner out of range", func(pl *Placement) { pl.Owner[3] = 2 }},
		{"owner disagrees with PerRank", func(pl *Placement) { pl.Owner[0] = 1 }},
		{"local wrong", func(pl *Placement) { pl.Local[1] = 0 }},
		{"short owner", func(pl *Placement) { pl.Owner = pl.Owner[:3] }},
		{"missing rank list", func(pl *Placement) { pl.PerRank = pl.PerRank[:1] }},
		{"not ascending", func(pl *Placement) {
			pl.PerRank[0][0], pl.PerRank[0][1] = 1, 0
			pl.Local[0], pl.Local[1] = 1, 0
		}},
		{"experts mismatch", func(pl *Placement) { pl.Experts = 5 }},
	}
	for _, tc := range tests {
		pl := good()
		tc.corrupt(pl)
		if err := pl.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Validate = %v, want ErrInvalid", tc.name, err)
		}
	}
	var nilPl *Placement
	if err := nilPl.Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil placement: Validate = %v, want ErrInvalid", err)
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
