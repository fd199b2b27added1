package routing

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// balanceShape is one set of Balance arguments besides the loads.
type balanceShape struct {
	ranks, ranksPerHost, slots int
}

// checkBalanced asserts the properties every Balance result has: the shape
// asked for, every expert at least one replica, every rank full, no expert
// twice on a rank, replicas within one host under the hierarchical policy,
// the packing bound, and the same result from a second call.
func checkBalanced(t *testing.T, load []float64, sh balanceShape, pl *Placement) {
	t.Helper()
	if err := pl.Validate(); err != nil {
		t.Fatalf("Balance result does not validate: %v", err)
	}
	if pl.Experts != len(load) || pl.Ranks != sh.ranks || pl.Slots() != sh.slots {
		t.Fatalf("placement of %d experts, %d ranks, %d slots; want %d, %d, %d",
			pl.Experts, pl.Ranks, pl.Slots(), len(load), sh.ranks, sh.slots)
	}
	spr := pl.SlotsPerRank()
	for s := range pl.Slots() {
		if pl.SlotExpert(s) == EmptySlot {
			t.Fatalf("slot %d (rank %d) empty, want every rank's %d slots filled", s, s/spr, spr)
		}
	}
	hier := hierarchical(len(load), sh.ranks, sh.ranksPerHost, sh.slots)
	group := sh.ranks // ranks packed together
	if hier {
		group = sh.ranksPerHost
	}
	for e := range pl.Experts {
		rs := pl.Replicas(e)
		if len(rs) < 1 || len(rs) > group {
			t.Fatalf("expert %d has %d replicas, want 1..%d", e, len(rs), group)
		}
		seen := map[int]bool{}
		for _, s := range rs {
			r := s / spr
			if seen[r] {
				t.Fatalf("expert %d twice on rank %d (slots %v)", e, r, rs)
			}
			seen[r] = true
			if r/group != rs[0]/spr/group {
				t.Fatalf("expert %d replicas %v span packing groups of %d ranks", e, rs, group)
			}
		}
	}
	checkBound(t, load, pl, group)
	if hier {
		checkHostBound(t, load, pl, sh.ranksPerHost)
	}
	again, err := Balance(load, sh.ranks, sh.ranksPerHost, sh.slots)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again.slot, pl.slot) {
		t.Fatalf("Balance not deterministic:\n%v\n%v", pl.slot, again.slot)
	}
}

// checkBound asserts, for each group of ranks packed together, max <= mean +
// (1-1/R)(wmax-wmin) over the group's replica loads.
func checkBound(t *testing.T, load []float64, pl *Placement, group int) {
	t.Helper()
	rl, err := pl.RankLoad(load)
	if err != nil {
		t.Fatal(err)
	}
	spr := pl.SlotsPerRank()
	for g := 0; g < pl.Ranks; g += group {
		wmax, wmin := 0.0, math.Inf(1)
		for s := g * spr; s < (g+group)*spr; s++ {
			e := pl.SlotExpert(s)
			w := load[e] / float64(len(pl.Replicas(e)))
			wmax, wmin = max(wmax, w), min(wmin, w)
		}
		loads := rl[g : g+group]
		mean := sum(loads) / float64(group)
		bound := mean + (1-1/float64(group))*(wmax-wmin)
		if top := slices.Max(loads); top > bound*(1+1e-9)+1e-9 {
			t.Fatalf("ranks %d..%d: busiest %v > bound %v (mean %v, replica loads %v..%v)",
				g, g+group-1, top, bound, mean, wmin, wmax)
		}
	}
}

// checkHostBound asserts the hosts' bound with whole experts as the items.
func checkHostBound(t *testing.T, load []float64, pl *Placement, ranksPerHost int) {
	t.Helper()
	hosts := pl.Ranks / ranksPerHost
	hostLoad := make([]float64, hosts)
	for e, r := range pl.Owner {
		hostLoad[r/ranksPerHost] += load[e]
	}
	mean := sum(load) / float64(hosts)
	bound := mean + (1-1/float64(hosts))*(slices.Max(load)-slices.Min(load))
	if top := slices.Max(hostLoad); top > bound*(1+1e-9)+1e-9 {
		t.Fatalf("busiest host %v > bound %v (host loads %v)", top, bound, hostLoad)
	}
}

func sum(xs []float64) float64 {
	total := 0.0
	for _, x := range xs {
		total += x
	}
	return total
}

func TestBalanceCases(t *testing.T) {
	tests := []struct {
		name string
		load []float64
		sh   balanceShape
		want []int // slot table; nil: only the properties
	}{
		{"one replica each", []float64{4, 3, 2, 1}, balanceShape{2, 2, 4}, []int{0, 3, 1, 2}},
		{"hot expert replicated", []float64{10, 1, 1, 1}, balanceShape{2, 2, 6}, []int{0, 1, 2, 0, 1, 3}},
		{"replicas capped at ranks", []float64{100, 1}, balanceShape{2, 2, 4}, []int{0, 1, 0, 1}},
		{"all zero", []float64{0, 0, 0, 0}, balanceShape{2, 1, 4}, nil},
		{"one rank", []float64{5, 1, 2}, balanceShape{1, 1, 3}, []int{0, 1, 2}},
		{"two hosts", []float64{8, 1, 1, 1, 6, 1, 1, 1}, balanceShape{4, 2, 12}, nil},
		{"hosts do not divide experts", []float64{8, 1, 1, 1, 6, 1, 1}, balanceShape{4, 2, 8}, nil},
		{"host too small for its slots", []float64{8, 1, 1, 1}, balanceShape{4, 2, 12}, nil},
		{"hosts filled by full replication", []float64{8, 1, 1, 1}, balanceShape{4, 2, 8}, []int{0, 3, 0, 3, 1, 2, 1, 2}},
		{"straddling expert", []float64{10, 1, 1, 1, 1, 3}, balanceShape{3, 3, 9}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pl, err := Balance(tc.load, tc.sh.ranks, tc.sh.ranksPerHost, tc.sh.slots)
			if err != nil {
				t.Fatal(err)
			}
			checkBalanced(t, tc.load, tc.sh, pl)
			if tc.want != nil && !slices.Equal(pl.slot, tc.want) {
				t.Errorf("slots %v, want %v", pl.slot, tc.want)
			}
		})
	}
}

func TestBalanceInvalid(t *testing.T) {
	tests := []struct {
		name string
		load []float64
		sh   balanceShape
	}{
		{"no experts", nil, balanceShape{2, 2, 2}},
		{"negative load", []float64{1, -1}, balanceShape{2, 2, 2}},
		{"NaN load", []float64{1, math.NaN()}, balanceShape{2, 2, 2}},
		{"infinite load", []float64{1, math.Inf(1)}, balanceShape{2, 2, 2}},
		{"no ranks", []float64{1, 1}, balanceShape{0, 1, 2}},
		{"no ranks per host", []float64{1, 1}, balanceShape{2, 0, 2}},
		{"partial host", []float64{1, 1, 1}, balanceShape{3, 2, 3}},
		{"slots not a multiple", []float64{1, 1, 1}, balanceShape{2, 2, 3}},
		{"fewer slots than experts", []float64{1, 1, 1, 1}, balanceShape{2, 2, 2}},
		{"more slots than one per rank each", []float64{1, 1}, balanceShape{2, 2, 6}},
	}
	for _, tc := range tests {
		pl, err := Balance(tc.load, tc.sh.ranks, tc.sh.ranksPerHost, tc.sh.slots)
		if !errors.Is(err, ErrInvalid) || pl != nil {
			t.Errorf("%s: got (%v, %v), want nil and ErrInvalid", tc.name, pl, err)
		}
	}
}

// randomLoads draws loads of one of a few shapes: uniform, Zipf-like, a few
// hot experts, ties, and zeros.
func randomLoads(r *rand.Rand, experts int) []float64 {
	load := make([]float64, experts)
	kind := r.IntN(5)
	for e := range load {
		switch kind {
		case 0:
			load[e] = r.Float64() * 100
		case 1:
			load[e] = 1000 / math.Pow(float64(e+1), 0.5+r.Float64())
		case 2:
			load[e] = float64(r.IntN(3))
		case 3:
			load[e] = 7
		default:
			if r.IntN(8) == 0 {
				load[e] = 1000 * r.Float64()
			} else {
				load[e] = r.Float64()
			}
		}
	}
	r.Shuffle(len(load), func(i, j int) { load[i], load[j] = load[j], load[i] })
	return load
}

// randomShape draws a valid shape for the given number of experts.
func randomShape(r *rand.Rand, experts int) balanceShape {
	for {
		hosts, perHost := 1+r.IntN(4), 1+r.IntN(4)
		ranks := hosts * perHost
		lo := (experts + ranks - 1) / ranks // slots per rank
		hi := experts
		if lo > hi {
			continue
		}
		spr := lo + r.IntN(min(hi-lo+1, 4))
		return balanceShape{ranks, perHost, spr * ranks}
	}
}

func TestBalanceRandom(t *testing.T) {
	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 20))
		load := randomLoads(r, 1+r.IntN(40))
		sh := randomShape(r, len(load))
		pl, err := Balance(load, sh.ranks, sh.ranksPerHost, sh.slots)
		if err != nil {
			t.Fatalf("seed %d: Balance(%v, %+v): %v", seed, load, sh, err)
		}
		t.Run(fmt.Sprint(seed), func(t *testing.T) { checkBalanced(t, load, sh, pl) })
	}
}

func FuzzBalance(f *testing.F) {
	f.Add([]byte{9, 1, 1, 1, 5, 0, 2, 2}, uint8(3), uint8(2), uint8(1))
	f.Add([]byte{255, 0, 0, 0}, uint8(2), uint8(1), uint8(2))
	f.Fuzz(func(t *testing.T, raw []byte, hosts, perHost, extra uint8) {
		if len(raw) == 0 || len(raw) > 64 {
			return
		}
		load := make([]float64, len(raw))
		for e, b := range raw {
			load[e] = float64(b)
		}
		ranks := (1 + int(hosts)%4) * (1 + int(perHost)%4)
		spr := (len(load)+ranks-1)/ranks + int(extra)%3
		if spr > len(load) {
			return
		}
		sh := balanceShape{ranks, 1 + int(perHost)%4, spr * ranks}
		pl, err := Balance(load, sh.ranks, sh.ranksPerHost, sh.slots)
		if err != nil {
			t.Fatalf("Balance(%v, %+v): %v", load, sh, err)
		}
		checkBalanced(t, load, sh, pl)
	})
}

// zipfLoad is the per-expert load of one routed step with Zipf-skewed
// logits: the measured input of the quality goal.
func zipfLoad(t testing.TB, tokens, experts, k int, skew float64) []int {
	r := rand.New(rand.NewPCG(20, 1))
	logits := make([]float32, tokens*experts)
	if err := SkewedLogits(r, tokens, experts, skew, logits); err != nil {
		t.Fatal(err)
	}
	var d Decision
	if err := (Gate{Experts: experts, K: k}).Route(logits, tokens, &d); err != nil {
		t.Fatal(err)
	}
	pl, err := Contiguous(experts, 1)
	if err != nil {
		t.Fatal(err)
	}
	var l Load
	if err := l.Measure(&d, pl); err != nil {
		t.Fatal(err)
	}
	return l.PerExpert
}

// TestBalanceZipfGoal is issue 20's goal: Zipf skew 1.2, 64 experts, top-4,
// 8 ranks, 8 redundant slots: max/mean rank load <= 1.10 after Balance, on one
// host and on 4 hosts of 2 ranks. The bounds are the measured figures (2048
// tokens, seed 20: 4.896 before with the contiguous one-replica placement,
// 1.001 after on one host, 1.031 on 4 x 2) with a little margin.
func TestBalanceZipfGoal(t *testing.T) {
	counts := zipfLoad(t, 2048, 64, 4, 1.2)
	load := make([]float64, len(counts))
	for e, c := range counts {
		load[e] = float64(c)
	}
	before, err := Contiguous(64, 8)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := before.RankLoad(load)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("before (contiguous, one replica): max/mean %.3f", Imbalance(rl))
	if got := Imbalance(rl); got < 4.5 {
		t.Errorf("max/mean %.3f before Balance, want the measured skew (4.9)", got)
	}
	for _, tc := range []struct {
		name         string
		ranksPerHost int
		bound        float64
	}{
		{"one host", 8, 1.02},
		{"4 hosts x 2", 2, 1.05},
	} {
		pl, err := Balance(load, 8, tc.ranksPerHost, 72)
		if err != nil {
			t.Fatal(err)
		}
		rl, err := pl.RankLoad(load)
		if err != nil {
			t.Fatal(err)
		}
		got := Imbalance(rl)
		t.Logf("%s: after Balance max/mean %.3f", tc.name, got)
		if got > tc.bound {
			t.Errorf("%s: max/mean %.3f after Balance, want <= %.3f", tc.name, got, tc.bound)
		}
	}
}

func BenchmarkBalance(b *testing.B) {
	for _, bc := range []struct {
		experts, ranks, ranksPerHost, slots int
	}{
		{256, 64, 8, 320},
		{256, 64, 64, 320},
	} {
		r := rand.New(rand.NewPCG(1, 2))
		load := make([]float64, bc.experts)
		for e := range load {
			load[e] = 1e4 / math.Pow(float64(e+1), 1.2)
		}
		r.Shuffle(len(load), func(i, j int) { load[i], load[j] = load[j], load[i] })
		name := fmt.Sprintf("E%d/R%d", bc.experts, bc.ranks)
		if bc.ranksPerHost == bc.ranks {
			name += "/onehost"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := Balance(load, bc.ranks, bc.ranksPerHost, bc.slots); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestDealGreedyStrands shows why pack keeps the rounds: filling the lightest
// bin with room can leave an expert's last replica only bins that hold it,
// while rounds of one item per bin place every replica on a bin of its own.
func TestDealGreedyStrands(t *testing.T) {
	items := []item{{0, 10}, {1, 1}, {2, 1}, {3, 1}, {4, 0.5}, {4, 0.5}}
	if _, ok := dealGreedy(items, 2, 3); ok {
		t.Fatal("filling the lightest bin placed every item, want the last replica stranded")
	}
	to, ok := dealGreedy(items, 2, 1)
	if !ok {
		t.Fatal("rounds left an item without a bin")
	}
	if to[4] == to[5] {
		t.Errorf("rounds put both replicas of expert 4 on bin %d (deal %v)", to[4], to)
	}
	lists := pack(slices.Clone(items), 2)
	for b, l := range lists {
		if len(l) != 3 || l[0] == l[1] || l[1] == l[2] || l[0] == l[2] {
			t.Errorf("pack: bin %d holds %v, want 3 distinct experts", b, l)
		}
	}
}
