package routing

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestLoad(t *testing.T) {
	pl, err := FromTable(4, 3, []int{0, 0, 1, 2})
	if err != nil {
		t.Fatal(err)
	}
	var d Decision
	if err := FromAssignments([]int32{0, 1, 1, Dropped, 3, 0, 1, 2}, make([]float32, 8), 4, 2, 4, &d); err != nil {
		t.Fatal(err)
	}
	var l Load
	if err := l.Measure(&d, pl); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(l.PerExpert, []int{2, 3, 1, 1}) || !slices.Equal(l.PerRank, []int{5, 1, 1}) || l.Kept != 7 || l.Dropped != 1 {
		t.Errorf("load = %+v", l)
	}
	if got, want := l.Imbalance(), 5*3/7.0; math.Abs(got-want) > 1e-12 {
		t.Errorf("imbalance %v, want %v", got, want)
	}
	if err := l.Measure(&d, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("Measure with nil placement = %v, want ErrInvalid", err)
	}
	small, _ := Contiguous(3, 1)
	if err := l.Measure(&d, small); !errors.Is(err, ErrInvalid) {
		t.Errorf("Measure with expert 3 over 3 experts = %v, want ErrInvalid", err)
	}
}

func TestImbalance(t *testing.T) {
	tests := []struct {
		counts []int
		want   float64
	}{
		{[]int{4, 4, 4, 4}, 1},
		{[]int{8, 0, 0, 0}, 4},
		{[]int{3, 1}, 1.5},
		{[]int{0, 0}, 0},
		{nil, 0},
	}
	for _, tc := range tests {
		if got := Imbalance(tc.counts); got != tc.want {
			t.Errorf("Imbalance(%v) = %v, want %v", tc.counts, got, tc.want)
		}
		// Estimated loads (Placement.RankLoad) give the same ratio.
		loads := make([]float64, len(tc.counts))
		for i, c := range tc.counts {
			loads[i] = float64(c)
		}
		if got := Imbalance(loads); got != tc.want {
			t.Errorf("Imbalance(%v) = %v, want %v", loads, got, tc.want)
		}
	}
}

// TestSkewedLogitsZipf checks that top-1 choices follow the Zipf law exactly
// enough to tell skews apart, and that skew raises the rank imbalance.
func TestSkewedLogitsZipf(t *testing.T) {
	const tokens, experts = 20000, 8
	pl, err := Contiguous(experts, 4)
	if err != nil {
		t.Fatal(err)
	}
	prevImbalance := 0.0
	for _, s := range []float64{0, 1, 2} {
		r := rand.New(rand.NewPCG(42, 0))
		logits := make([]float32, tokens*experts)
		if err := SkewedLogits(r, tokens, experts, s, logits); err != nil {
			t.Fatal(err)
		}
		var d Decision
		if err := (Gate{Experts: experts, K: 1}).Route(logits, tokens, &d); err != nil {
			t.Fatal(err)
		}
		var l Load
		if err := l.Measure(&d, pl); err != nil {
			t.Fatal(err)
		}
		norm := 0.0
		for e := range experts {
			norm += math.Pow(float64(e+1), -s)
		}
		for e, n := range l.PerExpert {
			want := math.Pow(float64(e+1), -s) / norm
			if got := float64(n) / tokens; math.Abs(got-want) > 0.015 {
				t.Errorf("s=%v: expert %d chosen %.4f of the time, want %.4f", s, e, got, want)
			}
		}
		if im := l.Imbalance(); im <= prevImbalance {
			t.Errorf("s=%v: imbalance %v not above the less skewed %v", s, im, prevImbalance)
		} else {
			prevImbalance = im
		}
	}
}

func TestSkewedLogitsDeterministic(t *testing.T) {
	a, b := make([]float32, 64), make([]float32, 64)
	if err := SkewedLogits(rand.New(rand.NewPCG(7, 7)), 8, 8, 1.2, a); err != nil {
		t.Fatal(err)
	}
	if err := SkewedLogits(rand.New(rand.NewPCG(7, 7)), 8, 8, 1.2, b); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a, b) {
		t.Errorf("same seed, different logits")
	}
	if err := SkewedLogits(rand.New(rand.NewPCG(8, 7)), 8, 8, 1.2, b); err != nil {
		t.Fatal(err)
	}
	if slices.Equal(a, b) {
		t.Errorf("different seeds, same logits")
	}
}

func TestSkewedLogitsErrors(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	tests := []struct {
		name            string
		r               *rand.Rand
		tokens, experts int
		s               float64
		dst             []float32
	}{
		{"nil rand", nil, 1, 2, 1, make([]float32, 2)},
		{"negative skew", r, 1, 2, -1, make([]float32, 2)},
		{"NaN skew", r, 1, 2, math.NaN(), make([]float32, 2)},
		{"Inf skew", r, 1, 2, math.Inf(1), make([]float32, 2)},
		{"wrong length", r, 2, 2, 1, make([]float32, 3)},
		{"no experts", r, 1, 0, 1, nil},
		{"negative tokens", r, -1, 2, 1, nil},
	}
	for _, tc := range tests {
		if err := SkewedLogits(tc.r, tc.tokens, tc.experts, tc.s, tc.dst); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: SkewedLogits = %v, want ErrInvalid", tc.name, err)
		}
	}
}
