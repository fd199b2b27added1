package routing

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestPerExpert(t *testing.T) {
	tests := []struct {
		tokens, k, experts int
		factor             float64
		want               int
	}{
		{4096, 2, 16, 1, 512},
		{4096, 2, 16, 1.25, 640},
		{10, 1, 3, 1, 4},        // ceil(3.33)
		{5, 2, 16, 1, 1},        // ceil(0.625)
		{100, 1, 1, 1.1, 100},   // capped at tokens
		{1000, 1, 10, 1.1, 110}, // 100*1.1 = 110.00000000000001 in float64: still 110
		{6, 1, 2, 4.0 / 3, 4},   // 3*1.333... = 3.9999999999999996: 4
		{6, 1, 2, 5.0 / 3, 5},   // 3*1.666... = 5.000000000000001: 5
		{6, 1, 2, 1.01, 4},      // genuinely above 3
		{8, 2, 2, 4, 8},         // 16 capped at tokens
		{8, 2, 2, math.Inf(1), 8},
		{8, 2, 2, 0, 8},  // no drop
		{8, 2, 2, -1, 8}, // no drop
		{8, 2, 2, math.NaN(), 8},
		{0, 2, 2, 1, 0},
	}
	for _, tc := range tests {
		got := Capacity{Factor: tc.factor}.PerExpert(tc.tokens, tc.k, tc.experts)
		if got != tc.want {
			t.Errorf("PerExpert(%d, %d, %d) factor %v = %d, want %d", tc.tokens, tc.k, tc.experts, tc.factor, got, tc.want)
		}
	}
}

func TestApplyDropsLowestWeights(t *testing.T) {
	// Six tokens, top-1, all on expert 0 (expert 1 idle): capacity 3*factor.
	ex := []int32{0, 0, 0, 0, 0, 0}
	w := []float32{0.5, 0.1, 0.9, 0.1, 0.3, 0.7}
	tests := []struct {
		name   string
		factor float64
		kept   []int32 // expert per token after Apply
	}{
		// Capacity 3: drop both 0.1 and the 0.3.
		{"cap 3", 1, []int32{0, Dropped, 0, Dropped, Dropped, 0}},
		// Capacity 4: drop the two 0.1.
		{"cap 4", 4.0 / 3, []int32{0, Dropped, 0, Dropped, 0, 0}},
		// Capacity 5: of the tied 0.1, the higher token index goes.
		{"cap 5 tie", 5.0 / 3, []int32{0, 0, 0, Dropped, 0, 0}},
		{"cap 6", 2, ex},
		{"no drop", 0, ex},
	}
	var scratch CapacityScratch
	for _, tc := range tests {
		var d Decision
		if err := FromAssignments(ex, w, 6, 1, 2, &d); err != nil {
			t.Fatal(err)
		}
		n, err := Capacity{Factor: tc.factor}.Apply(&d, 2, &scratch)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(d.Expert, tc.kept) {
			t.Errorf("%s: experts after Apply %v, want %v", tc.name, d.Expert, tc.kept)
		}
		wantDropped := 0
		for i, e := range tc.kept {
			if e == Dropped {
				wantDropped++
				if d.Weight[i] != 0 {
					t.Errorf("%s: dropped token %d keeps weight %v", tc.name, i, d.Weight[i])
				}
			} else if d.Weight[i] != w[i] {
				t.Errorf("%s: kept token %d weight %v, want %v (no renormalisation)", tc.name, i, d.Weight[i], w[i])
			}
		}
		if n != wantDropped {
			t.Errorf("%s: Apply dropped %d, want %d", tc.name, n, wantDropped)
		}
	}
}

// TestApplyHandBuiltWeights covers weights FromAssignments would reject but a
// hand-built Decision may hold: negative weights sort below zero and -0 ties
// with +0 (so the token index decides).
func TestApplyHandBuiltWeights(t *testing.T) {
	negZero := float32(math.Copysign(0, -1))
	d := Decision{Tokens: 5, K: 1, Expert: []int32{0, 0, 0, 0, 0}, Weight: []float32{-1, negZero, 0, 0.5, -2}}
	// Capacity 5/2*0.8 = 2: drop -2 (t4), -1 (t0), then of the zeros t2.
	n, err := Capacity{Factor: 0.8}.Apply(&d, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int32{Dropped, 0, Dropped, 0, Dropped}; n != 3 || !slices.Equal(d.Expert, want) {
		t.Errorf("dropped %d, experts %v; want 3, %v", n, d.Expert, want)
	}
}

// randomDecision routes skewed logits so some experts overflow.
func randomDecision(t testing.TB, r *rand.Rand, tokens, experts, k int, skew float64) *Decision {
	t.Helper()
	logits := make([]float32, tokens*experts)
	if err := SkewedLogits(r, tokens, experts, skew, logits); err != nil {
		t.Fatal(err)
	}
	// Quantise so equal weights (and the token-index tie-break) occur.
	for i := range logits {
		logits[i] = float32(math.Round(float64(logits[i])*2) / 2)
	}
	d := new(Decision)
	if err := (Gate{Experts: experts, K: k}).Route(logits, tokens, d); err != nil {
		t.Fatal(err)
	}
	return d
}

func cloneDecision(d *Decision) *Decision {
	return &Decision{Tokens: d.Tokens, K: d.K, Expert: slices.Clone(d.Expert), Weight: slices.Clone(d.Weight)}
}

func TestApplyPolicyProperty(t *testing.T) {
	tests := []struct {
		tokens, experts, k int
		skew, factor       float64
		seed               uint64
	}{
		{300, 8, 2, 1.5, 1, 1},
		{300, 8, 2, 0.5, 1.25, 2},
		{500, 16, 4, 1, 1, 3},
		{200, 4, 1, 2, 0.5, 4},
		{100, 6, 6, 1, 0.5, 5}, // k == E: every expert gets every token
	}
	var scratch CapacityScratch
	for _, tc := range tests {
		r := rand.New(rand.NewPCG(tc.seed, 0))
		orig := randomDecision(t, r, tc.tokens, tc.experts, tc.k, tc.skew)
		c := Capacity{Factor: tc.factor}
		limit := c.PerExpert(tc.tokens, tc.k, tc.experts)

		d := cloneDecision(orig)
		n, err := c.Apply(d, tc.experts, &scratch)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Errorf("case %+v: nothing dropped, the test needs overflow", tc)
		}
		// Deterministic: a second run on a fresh copy (and fresh scratch) agrees.
		again := cloneDecision(orig)
		if _, err := c.Apply(again, tc.experts, nil); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(again.Expert, d.Expert) || !slices.Equal(again.Weight, d.Weight) {
			t.Errorf("case %+v: Apply is not deterministic", tc)
		}

		count := make([]int, tc.experts)
		dropped := 0
		// worstKept[e]: the kept assignment of e first in drop order;
		// bestDropped[e]: the dropped one last in drop order.
		worstKept := make([]int, tc.experts)
		bestDropped := make([]int, tc.experts)
		for e := range worstKept {
			worstKept[e], bestDropped[e] = -1, -1
		}
		// before reports whether assignment a is dropped before b.
		before := func(a, b int) bool {
			if orig.Weight[a] != orig.Weight[b] {
				return orig.Weight[a] < orig.Weight[b]
			}
			return a > b
		}
		for i, e := range orig.Expert {
			if d.Expert[i] == Dropped {
				dropped++
				if d.Weight[i] != 0 {
					t.Fatalf("dropped slot %d has weight %v", i, d.Weight[i])
				}
				if bestDropped[e] < 0 || before(bestDropped[e], i) {
					bestDropped[e] = i
				}
				continue
			}
			if d.Expert[i] != e || d.Weight[i] != orig.Weight[i] {
				t.Fatalf("kept slot %d changed: %d/%v, was %d/%v", i, d.Expert[i], d.Weight[i], e, orig.Weight[i])
			}
			count[e]++
			if worstKept[e] < 0 || before(i, worstKept[e]) {
				worstKept[e] = i
			}
		}
		if dropped != n {
			t.Errorf("Apply reported %d drops, decision shows %d", n, dropped)
		}
		for e := range tc.experts {
			if count[e] > limit {
				t.Errorf("expert %d keeps %d > capacity %d", e, count[e], limit)
			}
			if bestDropped[e] >= 0 {
				if count[e] != limit {
					t.Errorf("expert %d dropped assignments but keeps %d < capacity %d", e, count[e], limit)
				}
				if worstKept[e] >= 0 && before(worstKept[e], bestDropped[e]) {
					t.Errorf("expert %d kept assignment %d (w %v) but dropped %d (w %v)", e,
						worstKept[e], orig.Weight[worstKept[e]], bestDropped[e], orig.Weight[bestDropped[e]])
				}
			}
		}
	}
}

func TestApplyNoDrop(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 0))
	orig := randomDecision(t, r, 400, 8, 2, 3) // heavily skewed
	for _, f := range []float64{0, -2, math.NaN()} {
		d := cloneDecision(orig)
		n, err := Capacity{Factor: f}.Apply(d, 8, nil)
		if err != nil || n != 0 || !slices.Equal(d.Expert, orig.Expert) || !slices.Equal(d.Weight, orig.Weight) {
			t.Errorf("factor %v: dropped %d err %v, want untouched decision", f, n, err)
		}
	}
}

func TestApplyErrors(t *testing.T) {
	good := func() *Decision {
		var d Decision
		if err := FromAssignments([]int32{0, 3}, []float32{1, 1}, 1, 2, 4, &d); err != nil {
			t.Fatal(err)
		}
		return &d
	}
	tests := []struct {
		name    string
		d       *Decision
		experts int
	}{
		{"nil decision", nil, 4},
		{"expert beyond experts", good(), 3},
		{"no experts", good(), 0},
		{"weights short", func() *Decision { d := good(); d.Weight = d.Weight[:1]; return d }(), 4},
		{"shape mismatch", func() *Decision { d := good(); d.Tokens = 2; return d }(), 4},
	}
	for _, tc := range tests {
		if _, err := (Capacity{Factor: 1}).Apply(tc.d, tc.experts, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Apply = %v, want ErrInvalid", tc.name, err)
		}
	}
}

func TestApplyAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 0))
	orig := randomDecision(t, r, 1024, 16, 2, 1.2)
	d := cloneDecision(orig)
	c := Capacity{Factor: 1}
	var scratch CapacityScratch
	if n, err := c.Apply(d, 16, &scratch); err != nil || n == 0 {
		t.Fatalf("Apply dropped %d, err %v; the test needs the drop path", n, err)
	}
	if n := testing.AllocsPerRun(20, func() {
		copy(d.Expert, orig.Expert)
		copy(d.Weight, orig.Weight)
		if _, err := c.Apply(d, 16, &scratch); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Apply allocates %v times per call with reused scratch", n)
	}
}
