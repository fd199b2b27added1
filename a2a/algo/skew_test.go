package algo

import (
	"math/rand/v2"
	"testing"
)

func TestSkewProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	cases := 0
	for _, p := range []int{1, 2, 3, 4, 5, 7, 8, 13} {
		scheds := make([]*Schedule, p)
		for i := range scheds {
			scheds[i] = &Schedule{}
		}
		for trial := range 60 {
			var m []int
			switch trial % 4 {
			case 0:
				m = randomMatrix(rng, p, 400, 0.3)
			case 1: // zipf-like: a few hot receivers
				m = make([]int, p*p)
				for i := range m {
					m[i] = 400 / (1 + i%p) / (1 + i%p)
				}
			case 2:
				m = make([]int, p*p)
			default:
				m = randomMatrix(rng, p, 50, 0)
				m[rng.IntN(p*p)] = 5000
			}
			window := trial % 3
			block := []int{0, 7, 64}[trial%3]
			send, recv := make([][]byte, p), make([][]byte, p)
			for r := range p {
				if err := PlanSkew(scheds[r], SkewArgs{Rank: r, World: p, Matrix: m, Streams: 1 + trial%2, Window: window, BlockSize: block}); err != nil {
					t.Fatal(err)
				}
				send[r], recv[r] = stagedBuffers(m, p, r)
			}
			if err := Simulate(scheds, send, recv); err != nil {
				t.Fatalf("p=%d trial %d: %v", p, trial, err)
			}
			for r := range p {
				if err := checkStagedRecv(m, p, r, recv[r]); err != nil {
					t.Fatalf("p=%d trial %d rank %d: %v", p, trial, r, err)
				}
			}
			cases++
		}
	}
	t.Logf("%d skew cases", cases)
}

// TestSkewBeatsPairwiseOnSkew: on a matrix whose heavy pairs pairwise spreads
// over every round, the matchings group them and the estimate drops.
func TestSkewBeatsPairwiseOnSkew(t *testing.T) {
	const p = 4
	m := make([]int, p*p)
	for i := range p {
		for j := range p {
			m[i*p+j] = 1 << 10
		}
	}
	// Heavy pairs 0->1, 1->0 (distance +1 and -1), 2->3, 3->2: pairwise meets
	// a heavy pair in rounds k=1 and k=3; the matchings put all four in one.
	for _, pr := range [][2]int{{0, 1}, {1, 0}, {2, 3}, {3, 2}} {
		m[pr[0]*p+pr[1]] = 1 << 20
	}
	link := Link{Alpha: 10e-6, Beta: 1 / 3e9, Lanes: 1}
	pw := EstimateAllToAllV(AlgoPairwise, m, p, 1, 1, link)
	sk := EstimateSkew(m, p, 1, link)
	if sk >= pw*0.6 {
		t.Fatalf("skew estimate %.1f us, pairwise %.1f us: want < 60%%", sk*1e6, pw*1e6)
	}
	var s Schedule
	if n := testing.AllocsPerRun(20, func() { _ = PlanSkew(&s, SkewArgs{Rank: 1, World: p, Matrix: m, Streams: 1}) }); n != 0 {
		t.Errorf("%v allocations per re-plan", n)
	}
	if err := PlanSkew(&s, SkewArgs{Rank: 0, World: SkewMaxWorld + 1, Matrix: make([]int, (SkewMaxWorld+1)*(SkewMaxWorld+1)), Streams: 1}); err == nil {
		t.Error("world above SkewMaxWorld accepted")
	}
}
