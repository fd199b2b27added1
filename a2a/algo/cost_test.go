package algo

import (
	"math"
	"math/rand/v2"
	"testing"
)

// hand is a 3-rank matrix small enough to price by hand.
var hand = []int{
	0, 100, 200,
	300, 0, 50,
	10, 20, 0,
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestEstimateHandComputed(t *testing.T) {
	unit := Link{Alpha: 1, Beta: 0.01, Lanes: 1}
	tests := []struct {
		name            string
		algo            Algo
		m               []int
		world, str, win int
		link            Link
		want            float64
	}{
		// k=1: max(100, 50, 10) = 100; k=2: max(200, 300, 20) = 300.
		{"pairwise", AlgoPairwise, hand, 3, 1, 0, unit, 2*1 + 0.01*(100+300)},
		// Messages below a block are one frame: streams and lanes do not help.
		{"pairwise small messages ignore streams", AlgoPairwise, hand, 3, 4, 0, Link{1, 0.01, 8}, 2*1 + 0.01*(100+300)},
		// One round of distances {1, 2}; moved bytes max(sent, recvd):
		// rank 0 max(300, 310), rank 1 max(350, 120), rank 2 max(30, 250).
		{"fullmesh one round", AlgoFullmesh, hand, 3, 1, 2, unit, 1 + 0.01*350},
		// Same with two lanes: rank 1's 350 over its two transfers, but no
		// less than its slowest message (300).
		{"fullmesh two lanes", AlgoFullmesh, hand, 3, 1, 2, Link{1, 0.01, 2}, 1 + 0.01*300},
		// Window 1: round d=1 moves max 100, round d=2 moves max 300.
		{"fullmesh window 1", AlgoFullmesh, hand, 3, 1, 1, unit, 2*1 + 0.01*(100+300)},
		// A 4 MiB message is 4 frames: 2 streams and 2 lanes halve it.
		{"pairwise big message over streams", AlgoPairwise, []int{0, 4 << 20, 0, 0}, 2, 2, 0, Link{1, 1e-6, 2}, 1 + 1e-6*float64(4<<20)/2},
		{"single rank", AlgoFullmesh, []int{5}, 1, 1, 0, unit, 0},
		{"wrong matrix size", AlgoPairwise, hand[:8], 3, 1, 0, unit, math.Inf(1)},
		{"negative count", AlgoPairwise, []int{0, -1, 0, 0}, 2, 1, 0, unit, math.Inf(1)},
		{"unpriced algorithm", AlgoLL, hand, 3, 1, 0, unit, math.Inf(1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := EstimateAllToAllV(tt.algo, tt.m, tt.world, tt.str, tt.win, tt.link)
			if !(near(got, tt.want) || math.IsInf(got, 1) && math.IsInf(tt.want, 1)) {
				t.Fatalf("EstimateAllToAllV = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestEstimateNominalMatchesExplicit: the O(p) uniform shortcut prices
// exactly what the explicit nominal matrix prices.
func TestEstimateNominalMatchesExplicit(t *testing.T) {
	link := DefaultLink()
	for _, p := range []int{1, 2, 3, 5, 16, 37} {
		m := make([]int, p*p)
		for i := range m {
			m[i] = NominalPairBytes
		}
		for _, a := range []Algo{AlgoPairwise, AlgoFullmesh, AlgoAuto} {
			for _, w := range []int{0, 1, 3} {
				nominal := EstimateAllToAllV(a, nil, p, 2, w, link)
				explicit := EstimateAllToAllV(a, m, p, 2, w, link)
				if nominal != explicit {
					t.Fatalf("p=%d %v window %d: nominal %v, explicit %v", p, a, w, nominal, explicit)
				}
			}
		}
	}
	// Pairwise on a uniform matrix is the textbook (p-1)(alpha + beta n).
	got := EstimateAllToAllV(AlgoPairwise, nil, 8, 1, 0, link)
	if want := 7 * (link.Alpha + link.Beta*NominalPairBytes); !near(got, want) {
		t.Fatalf("pairwise nominal p=8: %v, want %v", got, want)
	}
}

func TestChooseAllToAllV(t *testing.T) {
	link := DefaultLink()
	if got := ChooseAllToAllV(1, 1, 0, nil, link); got != AlgoPairwise {
		t.Errorf("world 1: %v", got)
	}
	if got := ChooseAllToAllV(2, 4, 4, []int{0, 1 << 30, 5, 0}, link); got != AlgoPairwise {
		t.Errorf("world 2: %v", got)
	}
	// Concurrency hides per-round latency: fullmesh wins on many ranks.
	if got := ChooseAllToAllV(16, 1, 0, nil, link); got != AlgoFullmesh {
		t.Errorf("world 16 nominal: %v, want fullmesh", got)
	}
	// Window 1 on a uniform matrix costs exactly what pairwise costs: ties
	// go to pairwise.
	if got := ChooseAllToAllV(16, 1, 1, nil, link); got != AlgoPairwise {
		t.Errorf("world 16 window 1: %v, want pairwise", got)
	}
	// Auto prices the cheaper of the two.
	pw := EstimateAllToAllV(AlgoPairwise, nil, 16, 1, 0, link)
	fm := EstimateAllToAllV(AlgoFullmesh, nil, 16, 1, 0, link)
	if auto := EstimateAllToAllV(AlgoAuto, nil, 16, 1, 0, link); auto != min(pw, fm) {
		t.Errorf("auto %v, pairwise %v, fullmesh %v", auto, pw, fm)
	}

	// Determinism: every rank calls with its own copy of the same inputs and
	// must get the same answer.
	rng := rand.New(rand.NewPCG(3, 9))
	for i := range 200 {
		p := 1 + rng.IntN(24)
		g := generators[i%len(generators)]
		m := g.gen(rng, p, 1<<uint(rng.IntN(24)))
		streams, window := 1+rng.IntN(3), rng.IntN(6)
		l := Link{Alpha: rng.Float64() * 1e-4, Beta: rng.Float64() * 1e-9, Lanes: rng.IntN(4)}
		first := ChooseAllToAllV(p, streams, window, m, l)
		for range 3 {
			cp := append([]int(nil), m...)
			if got := ChooseAllToAllV(p, streams, window, cp, l); got != first {
				t.Fatalf("%s p=%d: chose %v then %v", g.name, p, first, got)
			}
		}
		if first != AlgoPairwise && first != AlgoFullmesh {
			t.Fatalf("chose %v", first)
		}
		pw := EstimateAllToAllV(AlgoPairwise, m, p, streams, window, l)
		fm := EstimateAllToAllV(AlgoFullmesh, m, p, streams, window, l)
		if want := map[bool]Algo{true: AlgoFullmesh, false: AlgoPairwise}[p > 2 && fm < pw]; first != want {
			t.Fatalf("%s p=%d: chose %v with pairwise %v fullmesh %v", g.name, p, first, pw, fm)
		}
	}
}
