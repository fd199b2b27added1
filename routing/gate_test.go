package routing

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// refRoute is the textbook gate: full softmax in float64, sort experts by
// probability (ties: lower id), keep k, renormalise.
func refRoute(row []float32, k int) ([]int32, []float64) {
	m := math.Inf(-1)
	for _, v := range row {
		m = max(m, float64(v))
	}
	p := make([]float64, len(row))
	sum := 0.0
	for e, v := range row {
		p[e] = math.Exp(float64(v) - m)
		sum += p[e]
	}
	ids := make([]int32, len(row))
	for e := range ids {
		ids[e] = int32(e)
		p[e] /= sum
	}
	slices.SortStableFunc(ids, func(a, b int32) int {
		switch {
		case p[a] > p[b]:
			return -1
		case p[a] < p[b]:
			return 1
		}
		return 0
	})
	ids = ids[:k]
	w := make([]float64, k)
	tot := 0.0
	for s, e := range ids {
		tot += p[e]
		w[s] = p[e]
	}
	for s := range w {
		w[s] /= tot
	}
	return ids, w
}

func TestRouteMatchesReference(t *testing.T) {
	tests := []struct {
		name               string
		tokens, experts, k int
		seed               uint64
		ties               bool // draw logits from a tiny set so ties are common
	}{
		{"top2 of 16", 200, 16, 2, 1, false},
		{"top1", 200, 8, 1, 2, false},
		{"k equals E", 100, 6, 6, 3, false},
		{"one expert", 10, 1, 1, 4, false},
		{"ties top2", 300, 8, 2, 5, true},
		{"ties top4", 300, 8, 4, 6, true},
		{"ties k equals E", 100, 5, 5, 7, true},
		{"many experts", 50, 128, 8, 8, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(tc.seed, 0))
			logits := make([]float32, tc.tokens*tc.experts)
			for i := range logits {
				if tc.ties {
					logits[i] = float32(r.IntN(3)) * 0.5
				} else {
					logits[i] = float32(r.NormFloat64() * 2)
				}
			}
			var d Decision
			if err := (Gate{Experts: tc.experts, K: tc.k}).Route(logits, tc.tokens, &d); err != nil {
				t.Fatal(err)
			}
			if d.Tokens != tc.tokens || d.K != tc.k || len(d.Expert) != tc.tokens*tc.k {
				t.Fatalf("decision shape %d x %d (%d ids)", d.Tokens, d.K, len(d.Expert))
			}
			for tok := range tc.tokens {
				ids, w := refRoute(logits[tok*tc.experts:(tok+1)*tc.experts], tc.k)
				got := d.Expert[tok*tc.k : (tok+1)*tc.k]
				if !slices.Equal(got, ids) {
					t.Fatalf("token %d: experts %v, want %v (logits %v)", tok, got, ids, logits[tok*tc.experts:(tok+1)*tc.experts])
				}
				sum := 0.0
				for s := range ids {
					gw := float64(d.Weight[tok*tc.k+s])
					if math.Abs(gw-w[s]) > 1e-6 {
						t.Fatalf("token %d slot %d: weight %v, want %v", tok, s, gw, w[s])
					}
					sum += gw
				}
				if math.Abs(sum-1) > 1e-6 {
					t.Fatalf("token %d: weights sum to %v, want 1", tok, sum)
				}
			}
		})
	}
}

func TestRouteTieBreakAndMask(t *testing.T) {
	inf := float32(math.Inf(-1))
	tests := []struct {
		name    string
		logits  []float32
		k       int
		experts []int32
		weights []float32
	}{
		{"all equal", []float32{1, 1, 1, 1}, 2, []int32{0, 1}, []float32{0.5, 0.5}},
		{"tie for second", []float32{0, 2, 1, 1}, 2, []int32{1, 2}, nil},
		{"tie at top, later ids", []float32{0, 3, 0, 3}, 3, []int32{1, 3, 0}, nil},
		{"masked experts skipped", []float32{inf, 0, inf, 0}, 2, []int32{1, 3}, []float32{0.5, 0.5}},
		{"masked expert chosen with zero weight", []float32{inf, 5, inf, inf}, 2, []int32{1, 0}, []float32{1, 0}},
	}
	for _, tc := range tests {
		var d Decision
		if err := (Gate{Experts: len(tc.logits), K: tc.k}).Route(tc.logits, 1, &d); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(d.Expert, tc.experts) {
			t.Errorf("%s: experts %v, want %v", tc.name, d.Expert, tc.experts)
		}
		if tc.weights != nil && !slices.Equal(d.Weight, tc.weights) {
			t.Errorf("%s: weights %v, want %v", tc.name, d.Weight, tc.weights)
		}
	}
}

func TestRouteErrors(t *testing.T) {
	nan := float32(math.NaN())
	tests := []struct {
		name   string
		gate   Gate
		logits []float32
		tokens int
		nilDec bool
	}{
		{"logits too short", Gate{4, 2}, make([]float32, 7), 2, false},
		{"logits too long", Gate{4, 2}, make([]float32, 9), 2, false},
		{"k above E", Gate{4, 5}, make([]float32, 8), 2, false},
		{"k zero", Gate{4, 0}, make([]float32, 8), 2, false},
		{"no experts", Gate{0, 1}, nil, 0, false},
		{"negative tokens", Gate{4, 1}, nil, -1, false},
		{"NaN logit", Gate{4, 2}, []float32{0, 1, 2, 3, 0, nan, 1, 1}, 2, false},
		{"+Inf logit", Gate{2, 1}, []float32{0, float32(math.Inf(1))}, 1, false},
		{"all -Inf", Gate{2, 1}, []float32{float32(math.Inf(-1)), float32(math.Inf(-1))}, 1, false},
		{"nil decision", Gate{2, 1}, []float32{0, 1}, 1, true},
	}
	for _, tc := range tests {
		d := &Decision{}
		if tc.nilDec {
			d = nil
		}
		if err := tc.gate.Route(tc.logits, tc.tokens, d); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Route = %v, want ErrInvalid", tc.name, err)
		}
	}
}

func TestFromAssignments(t *testing.T) {
	var d Decision
	ex := []int32{2, 0, Dropped, 1, 3, 2}
	w := []float32{0.7, 0.3, 0.9, 1, 0.25, 0.5}
	if err := FromAssignments(ex, w, 3, 2, 4, &d); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.Expert, ex) || !slices.Equal(d.Weight, []float32{0.7, 0.3, 0, 1, 0.25, 0.5}) {
		t.Errorf("decision = %v %v", d.Expert, d.Weight)
	}
	if d.Kept() != 5 || d.Tokens != 3 || d.K != 2 {
		t.Errorf("kept %d tokens %d k %d, want 5 3 2", d.Kept(), d.Tokens, d.K)
	}

	tests := []struct {
		name          string
		ex            []int32
		w             []float32
		tokens, k, ne int
	}{
		{"id too high", []int32{0, 4}, []float32{1, 1}, 1, 2, 4},
		{"id negative", []int32{0, -2}, []float32{1, 1}, 1, 2, 4},
		{"duplicate in token", []int32{1, 1}, []float32{1, 1}, 1, 2, 4},
		{"ids short", []int32{0}, []float32{1, 1}, 1, 2, 4},
		{"weights short", []int32{0, 1}, []float32{1}, 1, 2, 4},
		{"weights long", []int32{0, 1}, []float32{1, 1, 1}, 1, 2, 4},
		{"NaN weight", []int32{0, 1}, []float32{1, float32(math.NaN())}, 1, 2, 4},
		{"Inf weight", []int32{0, 1}, []float32{1, float32(math.Inf(1))}, 1, 2, 4},
		{"negative weight", []int32{0, 1}, []float32{1, -0.5}, 1, 2, 4},
		{"k above E", []int32{0, 1}, []float32{1, 1}, 1, 2, 1},
		{"k zero", nil, nil, 1, 0, 4},
	}
	for _, tc := range tests {
		if err := FromAssignments(tc.ex, tc.w, tc.tokens, tc.k, tc.ne, &d); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: FromAssignments = %v, want ErrInvalid", tc.name, err)
		}
	}
}

func TestDecisionReset(t *testing.T) {
	d := Decision{Expert: make([]int32, 2, 64), Weight: make([]float32, 2, 64)}
	d.Expert[0], d.Weight[0] = 3, 1
	base := &d.Expert[:1][0]
	d.Reset(10, 4)
	if len(d.Expert) != 40 || &d.Expert[0] != base {
		t.Errorf("Reset did not reuse storage (len %d)", len(d.Expert))
	}
	if d.Kept() != 0 || slices.ContainsFunc(d.Weight, func(w float32) bool { return w != 0 }) {
		t.Errorf("Reset left live slots: %v %v", d.Expert, d.Weight)
	}
}

func TestRouteAllocs(t *testing.T) {
	const tokens, experts, k = 512, 16, 2
	r := rand.New(rand.NewPCG(11, 0))
	logits := make([]float32, tokens*experts)
	if err := SkewedLogits(r, tokens, experts, 1, logits); err != nil {
		t.Fatal(err)
	}
	g := Gate{Experts: experts, K: k}
	var d Decision
	if err := g.Route(logits, tokens, &d); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(20, func() {
		if err := g.Route(logits, tokens, &d); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Route allocates %v times per call on a reused decision", n)
	}
}

// TestRoute2MatchesGeneral checks the top-2 fast path against the general
// selection loop bit for bit: random logits, logits drawn from a few values
// (ties), masked experts, two experts only, and the same errors for NaN, +Inf
// and all-masked rows.
func TestRoute2MatchesGeneral(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	inf := float32(math.Inf(-1))
	for _, experts := range []int{2, 3, 5, 16, 64} {
		for trial := range 200 {
			const tokens = 37
			logits := make([]float32, tokens*experts)
			for i := range logits {
				switch trial % 4 {
				case 0:
					logits[i] = float32(rng.NormFloat64() * 3)
				case 1:
					logits[i] = float32(rng.IntN(3)) // many ties
				case 2:
					logits[i] = float32(rng.NormFloat64())
					if rng.IntN(3) == 0 {
						logits[i] = inf
					}
				case 3:
					logits[i] = float32(rng.NormFloat64() * 1e3)
				}
			}
			if trial%4 == 2 {
				logits[experts] = 1 // token 1 keeps a finite logit
			}
			bad := -1
			if trial%10 == 9 {
				bad = rng.IntN(len(logits))
				logits[bad] = []float32{float32(math.NaN()), float32(math.Inf(1))}[rng.IntN(2)]
			}
			var fast, slow Decision
			fast.resize(tokens, 2)
			slow.resize(tokens, 2)
			errFast := route2(logits, tokens, experts, &fast)
			errSlow := routeK(logits, tokens, experts, 2, &slow)
			if (errFast == nil) != (errSlow == nil) || errFast != nil && errFast.Error() != errSlow.Error() {
				t.Fatalf("experts %d trial %d: errors %v and %v", experts, trial, errFast, errSlow)
			}
			if errFast != nil {
				continue
			}
			if !slices.Equal(fast.Expert, slow.Expert) {
				t.Fatalf("experts %d trial %d: experts %v, want %v", experts, trial, fast.Expert, slow.Expert)
			}
			for i := range fast.Weight {
				if math.Float32bits(fast.Weight[i]) != math.Float32bits(slow.Weight[i]) {
					t.Fatalf("experts %d trial %d slot %d: weight %v, want %v", experts, trial, i, fast.Weight[i], slow.Weight[i])
				}
			}
		}
	}
}

// BenchmarkRoute is the gate of the dispatch benchmarks' target step: 4096
// tokens, 16 experts, top-2.
func BenchmarkRoute(b *testing.B) {
	const tokens, experts, k = 4096, 16, 2
	rng := rand.New(rand.NewPCG(42, 0))
	logits := make([]float32, tokens*experts)
	if err := SkewedLogits(rng, tokens, experts, 0, logits); err != nil {
		b.Fatal(err)
	}
	var d Decision
	g := Gate{Experts: experts, K: k}
	for b.Loop() {
		if err := g.Route(logits, tokens, &d); err != nil {
			b.Fatal(err)
		}
	}
}
