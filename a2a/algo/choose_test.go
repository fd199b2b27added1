package algo

import (
	"math"
	"testing"
)

// TestChooser checks the one rule of automatic choice: the pick is the
// lowest estimate among the candidates priced, the others say why they were
// left out, and pricing allocates nothing once warm.
func TestChooser(t *testing.T) {
	uniform := func(p, n int) []int {
		m := make([]int, p*p)
		for i := range m {
			if i/p != i%p {
				m[i] = n
			}
		}
		return m
	}
	hot := func(p, n int) []int { // every rank sends 16x more to rank 0
		m := uniform(p, n)
		for i := 1; i < p; i++ {
			m[i*p] = 16 * n
		}
		return m
	}
	hostsOf := func(p, per int) []int {
		h := make([]int, p)
		for r := range h {
			h[r] = r / per
		}
		return h
	}
	slow := testLinks()
	slow.Remote.Alpha = 200e-6
	for _, c := range []struct {
		name   string
		args   ChoiceArgs
		priced []Algo // candidates with an estimate
	}{
		{"two ranks", ChoiceArgs{World: 2, Streams: 1, Window: 4, Links: testLinks()}, []Algo{AlgoPairwise}},
		{"no matrix", ChoiceArgs{World: 8, Streams: 1, Window: 4, Hosts: hostsOf(8, 4), Links: testLinks()}, []Algo{AlgoPairwise, AlgoFullmesh}},
		{"one host uniform", ChoiceArgs{World: 8, Streams: 1, Window: 4, Matrix: uniform(8, 1<<10), Links: testLinks()}, []Algo{AlgoPairwise, AlgoFullmesh}},
		{"hosts, small, slow links", ChoiceArgs{World: 8, Streams: 1, Window: 4, Matrix: uniform(8, 1<<10), Hosts: hostsOf(8, 2), Links: slow}, []Algo{AlgoPairwise, AlgoFullmesh, AlgoStaged}},
		{"hosts, large", ChoiceArgs{World: 8, Streams: 2, Window: 4, Matrix: uniform(8, 1<<20), Hosts: hostsOf(8, 2), Links: testLinks()}, []Algo{AlgoPairwise, AlgoFullmesh, AlgoStaged}},
		{"one per host", ChoiceArgs{World: 4, Streams: 1, Window: 4, Matrix: uniform(4, 1<<10), Hosts: hostsOf(4, 1), Links: testLinks()}, []Algo{AlgoPairwise, AlgoFullmesh}},
		{"uneven hosts", ChoiceArgs{World: 3, Streams: 1, Window: 4, Matrix: uniform(3, 1<<10), Hosts: []int{0, 0, 1}, Links: testLinks()}, []Algo{AlgoPairwise, AlgoFullmesh}},
		{"hot receiver", ChoiceArgs{World: 8, Streams: 1, Window: 4, Matrix: hot(8, 1<<12), Links: testLinks()}, []Algo{AlgoPairwise, AlgoFullmesh, AlgoSkew}},
		{"hot, too many ranks", ChoiceArgs{World: 300, Streams: 1, Window: 4, Matrix: hot(300, 64), Links: testLinks()}, []Algo{AlgoPairwise, AlgoFullmesh}},
	} {
		var ch Chooser
		cands, pick := ch.Price(c.args)
		if len(cands) != 4 {
			t.Fatalf("%s: %d candidates", c.name, len(cands))
		}
		best := math.Inf(1)
		for _, cand := range cands {
			want := false
			for _, a := range c.priced {
				want = want || a == cand.Algo
			}
			switch {
			case want && (cand.Why != "" || math.IsInf(cand.Estimate, 1)):
				t.Errorf("%s: %s left out: %q", c.name, cand.Algo, cand.Why)
			case !want && (cand.Why == "" || !math.IsInf(cand.Estimate, 1)):
				t.Errorf("%s: %s priced %g, want it left out with a reason", c.name, cand.Algo, cand.Estimate)
			}
			best = min(best, cand.Estimate)
		}
		for _, cand := range cands {
			if cand.Algo == pick && cand.Estimate != best {
				t.Errorf("%s: picked %s at %g, the lowest estimate is %g", c.name, pick, cand.Estimate, best)
			}
		}
		if ch.Choose(c.args) != pick {
			t.Errorf("%s: Choose and Price disagree", c.name)
		}
		if c.args.World <= 64 {
			if allocs := testing.AllocsPerRun(20, func() { ch.Price(c.args) }); allocs != 0 {
				t.Errorf("%s: %v allocations per Price once warm", c.name, allocs)
			}
		}
	}
}

// TestChooserCrowdedMachine checks the bound of machines whose ranks
// outnumber their cores: hosts that share one machine's cores (the test
// bed's namespaces) price every candidate by the work of all their ranks,
// so staged, whose local phase adds bytes, loses to the flat algorithms
// there at sizes where its fewer remote bytes win on dedicated cores.
func TestChooserCrowdedMachine(t *testing.T) {
	const p = 8
	matrix := make([]int, p*p) // 32 KiB per pair, 8x that to rank 0
	for i := range p {
		for j := range p {
			if i != j {
				matrix[i*p+j] = 32 << 10
			}
		}
		matrix[i*p] *= 8
	}
	hosts := []int{0, 0, 1, 1, 2, 2, 3, 3}
	oneMachine := make([]int, p)
	links := testLinks()
	for _, c := range []struct {
		name     string
		machines []int
		cores    []int
		want     Algo
		bounded  bool // estimates raised by the machine's work
	}{
		{"dedicated cores", nil, nil, AlgoStaged, false},
		{"cores unknown", oneMachine, []int{0}, AlgoStaged, false},
		{"enough cores", oneMachine, []int{8}, AlgoStaged, false},
		{"8 ranks on 2 cores", oneMachine, []int{2}, AlgoFullmesh, true},
		{"a machine per host, 1 core each", hosts, []int{1, 1, 1, 1}, AlgoFullmesh, true},
	} {
		args := ChoiceArgs{World: p, Streams: 2, Window: 4, Matrix: matrix, Hosts: hosts, Links: links, Machines: c.machines, Cores: c.cores}
		var ch Chooser
		cands, pick := ch.Price(args)
		if pick != c.want {
			t.Errorf("%s: picked %s, want %s (%+v)", c.name, pick, c.want, cands)
		}
		var free Chooser
		plain, _ := free.Price(ChoiceArgs{World: p, Streams: 2, Window: 4, Matrix: matrix, Hosts: hosts, Links: links})
		for i, cand := range cands {
			switch raised := cand.Estimate > plain[i].Estimate; {
			case cand.Estimate < plain[i].Estimate:
				t.Errorf("%s: %s estimate %g below the per-rank model's %g", c.name, cand.Algo, cand.Estimate, plain[i].Estimate)
			case raised != c.bounded && cand.Why == "":
				t.Errorf("%s: %s estimate %g, per-rank %g: raised=%v, want %v", c.name, cand.Algo, cand.Estimate, plain[i].Estimate, raised, c.bounded)
			}
		}
		if c.machines != nil {
			bound := LowerBoundCrowded(matrix, hosts, c.machines, c.cores, links)
			if (bound > 0) != c.bounded {
				t.Errorf("%s: LowerBoundCrowded %g, want it positive only on crowded machines", c.name, bound)
			}
			for _, cand := range cands {
				if cand.Estimate < bound {
					t.Errorf("%s: %s estimated %g below the crowded lower bound %g", c.name, cand.Algo, cand.Estimate, bound)
				}
			}
		}
		if allocs := testing.AllocsPerRun(20, func() { ch.Price(args) }); allocs != 0 {
			t.Errorf("%s: %v allocations per Price once warm", c.name, allocs)
		}
	}
}

// TestChooserCrowdedRelay: on a crowded machine staged's remote phase waits
// for the cores to finish its local phase, so its estimate is the crowded
// bound plus the remote alpha, and the flat algorithm, whose remote latency
// overlaps the crowded work, wins where the bound alone tied them (the test
// bed's 1 KiB uniform case: 8 ranks, 4 hosts, one machine of 2 cores). With
// a core per rank nothing changes.
func TestChooserCrowdedRelay(t *testing.T) {
	const p = 8
	matrix := make([]int, p*p)
	for i := range matrix {
		if i/p != i%p {
			matrix[i] = 1 << 10
		}
	}
	hosts := []int{0, 0, 1, 1, 2, 2, 3, 3}
	for _, remoteAlpha := range []float64{0, 200e-6} { // 0: the built-in
		links := testLinks()
		if remoteAlpha > 0 {
			links.Remote.Alpha = remoteAlpha
		}
		args := ChoiceArgs{World: p, Streams: 2, Window: 4, Matrix: matrix, Hosts: hosts, Links: links,
			Machines: make([]int, p), Cores: []int{2}, LLLocal: 512, LLRemote: 4096}
		var ch Chooser
		cands, pick := ch.Price(args)
		if pick == AlgoStaged {
			t.Errorf("remote alpha %g: picked staged on the crowded machine: %+v", links.Remote.Alpha, cands)
		}
		bound := LowerBoundCrowded(matrix, hosts, args.Machines, args.Cores, links)
		if got, want := cands[2].Estimate, bound+links.Remote.Alpha; got < want*(1-1e-9) {
			t.Errorf("remote alpha %g: staged estimated %g, want at least the crowded bound %g plus the remote alpha", links.Remote.Alpha, got, bound)
		}
		args.Machines, args.Cores = nil, nil
		var free Chooser
		plain, _ := free.Price(args)
		if plain[2].Estimate >= cands[2].Estimate {
			t.Errorf("remote alpha %g: staged %g with a core per rank, %g crowded: the relay should cost only when crowded", links.Remote.Alpha, plain[2].Estimate, cands[2].Estimate)
		}
	}
}

// TestChooserLL checks the LL round in the flat algorithms' prices: blocks
// within their pair's cutoff cost one round, all peers at once, and the
// frames of larger ones ride with it, so across hosts with a slow network
// fullmesh beats staged's two phases at small sizes, and larger blocks are
// priced as before.
func TestChooserLL(t *testing.T) {
	const p = 8
	uniform := func(n int) []int {
		m := make([]int, p*p)
		for i := range m {
			if i/p != i%p {
				m[i] = n
			}
		}
		return m
	}
	hosts := []int{0, 0, 1, 1, 2, 2, 3, 3}
	links := testLinks()
	links.Remote.Alpha = 200e-6
	for _, c := range []struct {
		name       string
		n          int
		local, rem int
		want       Algo
		cheaper    bool // fullmesh below its price without LL
	}{
		{"8 B, no LL", 8, 0, 0, AlgoStaged, false},
		// One LL round either way: the tie goes to pairwise.
		{"8 B, LL everywhere", 8, 512, 4096, AlgoPairwise, true},
		// The remote blocks go in the LL round, the local ones by frames
		// that ride with it: one remote crossing, like staged, without
		// staged's local phase before it.
		{"1 KiB, local pairs by frames", 1024, 512, 4096, AlgoFullmesh, true},
		{"64 KiB, above every cutoff", 64 << 10, 512, 4096, AlgoStaged, false},
	} {
		args := ChoiceArgs{World: p, Streams: 2, Window: 4, Matrix: uniform(c.n), Hosts: hosts, Links: links, LLLocal: c.local, LLRemote: c.rem}
		var ch, plain Chooser
		cands, pick := ch.Price(args)
		if pick != c.want {
			t.Errorf("%s: picked %s, want %s (%+v)", c.name, pick, c.want, cands)
		}
		args.LLLocal, args.LLRemote = 0, 0
		noLL, _ := plain.Price(args)
		if got := cands[1].Estimate < noLL[1].Estimate; got != c.cheaper {
			t.Errorf("%s: fullmesh %g with LL, %g without: cheaper=%v, want %v", c.name, cands[1].Estimate, noLL[1].Estimate, got, c.cheaper)
		}
		if c.want == AlgoPairwise && cands[0].Estimate != linkTime(7*c.n, links.Remote) {
			t.Errorf("%s: pairwise %g, want one LL round %g", c.name, cands[0].Estimate, linkTime(7*c.n, links.Remote))
		}
		args.LLLocal, args.LLRemote = c.local, c.rem
		if allocs := testing.AllocsPerRun(20, func() { ch.Price(args) }); allocs != 0 {
			t.Errorf("%s: %v allocations per Price once warm", c.name, allocs)
		}
	}
}
