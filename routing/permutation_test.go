package routing

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestBuildSmall(t *testing.T) {
	pl, err := Contiguous(4, 2) // rank 0: experts 0,1; rank 1: experts 2,3
	if err != nil {
		t.Fatal(err)
	}
	var d Decision
	// t0: [3, 0], t1: [1, dropped], t2: [0, 3]
	if err := FromAssignments([]int32{3, 0, 1, Dropped, 0, 3}, []float32{0.6, 0.4, 1, 0, 0.8, 0.2}, 3, 2, 4, &d); err != nil {
		t.Fatal(err)
	}
	var p Plan
	if err := p.Build(&d, pl); err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		// rank 0: expert 0 (t0s1, t2s0), expert 1 (t1s0); rank 1: expert 3 (t0s0, t2s1).
		{"Order", p.Order, []int32{1, 4, 2, 0, 5}},
		{"Weight", p.Weight, []float32{0.4, 0.8, 1, 0.6, 0.2}},
		{"Row", p.Row, []int32{3, 0, 2, -1, 1, 4}},
		{"RankRows", p.RankRows, []int{3, 2}},
		{"RankStart", p.RankStart, []int{0, 3, 5}},
		{"ExpertRows", p.ExpertRows, []int{2, 1, 0, 2}},
		{"ExpertStart", p.ExpertStart, []int{0, 2, 3, 3}},
		{"LocalRows(0)", p.LocalRows(0, nil), []int{2, 1}},
		{"LocalRows(1)", p.LocalRows(1, nil), []int{0, 2}},
		{"Rows", p.Rows, 5},
		{"Token(1)", p.Token(1), 2},
	}
	for _, c := range checks {
		if !equalAny(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func equalAny(a, b any) bool {
	switch a := a.(type) {
	case []int32:
		return slices.Equal(a, b.([]int32))
	case []int:
		return slices.Equal(a, b.([]int))
	case []float32:
		return slices.Equal(a, b.([]float32))
	}
	return a == b
}

// TestPlanProperties builds plans for random routings with drops under both
// contiguous and scattered placements and checks every invariant of the plan,
// then round-trips rows through Pack/Unpack and Combine.
func TestPlanProperties(t *testing.T) {
	tests := []struct {
		name                      string
		tokens, experts, ranks, k int
		table                     bool
		factor                    float64
		seed                      uint64
	}{
		{"contiguous 16/4 top2", 500, 16, 4, 2, false, 1, 1},
		{"contiguous 10/4 top3", 300, 10, 4, 3, false, 1.1, 2},
		{"table 12/5 top2", 400, 12, 5, 2, true, 0.8, 3},
		{"table 8/3 top1", 200, 8, 3, 1, true, 1, 4},
		{"more ranks than experts", 100, 3, 5, 2, false, 1, 5},
		{"no drop k=E", 50, 4, 2, 4, true, 0, 6},
		{"zero tokens", 0, 8, 2, 2, false, 1, 7},
	}
	var p Plan // reused across cases, shrinking and growing
	drops := 0
	t.Cleanup(func() {
		if drops == 0 {
			t.Errorf("no case dropped anything; the round trip must cover dropped slots")
		}
	})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(tc.seed, 1))
			var pl *Placement
			var err error
			if tc.table {
				owner := make([]int, tc.experts)
				for e := range owner {
					owner[e] = r.IntN(tc.ranks)
				}
				pl, err = FromTable(tc.experts, tc.ranks, owner)
			} else {
				pl, err = Contiguous(tc.experts, tc.ranks)
			}
			if err != nil {
				t.Fatal(err)
			}
			d := randomDecision(t, r, tc.tokens, tc.experts, tc.k, 1)
			n, err := Capacity{Factor: tc.factor}.Apply(d, tc.experts, nil)
			if err != nil {
				t.Fatal(err)
			}
			drops += n
			if err := p.Build(d, pl); err != nil {
				t.Fatal(err)
			}
			checkPlan(t, &p, d, pl)
			checkRoundTrip(t, &p, d, r)
		})
	}
}

func checkPlan(t *testing.T, p *Plan, d *Decision, pl *Placement) {
	t.Helper()
	if p.Rows != d.Kept() || len(p.Order) != p.Rows || len(p.Weight) != p.Rows || len(p.Row) != len(d.Expert) {
		t.Fatalf("sizes: rows %d order %d weight %d row %d, kept %d slots %d",
			p.Rows, len(p.Order), len(p.Weight), len(p.Row), d.Kept(), len(d.Expert))
	}
	rankRows := make([]int, pl.Ranks)
	expertRows := make([]int, pl.Experts)
	type key struct{ rank, local, token int }
	var prev key
	for i, a := range p.Order {
		e := d.Expert[a]
		if e == Dropped {
			t.Fatalf("row %d packs dropped assignment %d", i, a)
		}
		if p.Row[a] != int32(i) {
			t.Fatalf("Row[Order[%d]] = %d, not the inverse", i, p.Row[a])
		}
		if p.Weight[i] != d.Weight[a] {
			t.Fatalf("row %d weight %v, want %v", i, p.Weight[i], d.Weight[a])
		}
		k := key{pl.Owner[e], pl.Local[e], int(a) / d.K}
		if i > 0 && !(k.rank > prev.rank || k.rank == prev.rank && (k.local > prev.local || k.local == prev.local && k.token > prev.token)) {
			t.Fatalf("row %d %+v does not follow row %d %+v in (rank, expert, token) order", i, k, i-1, prev)
		}
		prev = k
		rankRows[k.rank]++
		expertRows[e]++
		if i < p.RankStart[k.rank] || i >= p.RankStart[k.rank+1] {
			t.Fatalf("row %d for rank %d outside [%d, %d)", i, k.rank, p.RankStart[k.rank], p.RankStart[k.rank+1])
		}
		if i < p.ExpertStart[e] || i >= p.ExpertStart[e]+p.ExpertRows[e] {
			t.Fatalf("row %d for expert %d outside its range", i, e)
		}
	}
	for a, row := range p.Row {
		if (row < 0) != (d.Expert[a] == Dropped) {
			t.Fatalf("Row[%d] = %d for expert %d", a, row, d.Expert[a])
		}
	}
	if !slices.Equal(rankRows, p.RankRows) || !slices.Equal(expertRows, p.ExpertRows) {
		t.Fatalf("counts: rank %v (want %v), expert %v (want %v)", p.RankRows, rankRows, p.ExpertRows, expertRows)
	}
	if p.RankStart[0] != 0 || p.RankStart[pl.Ranks] != p.Rows {
		t.Fatalf("RankStart = %v", p.RankStart)
	}
	for r := range pl.Ranks {
		if p.RankStart[r+1]-p.RankStart[r] != p.RankRows[r] {
			t.Fatalf("RankStart = %v inconsistent with RankRows %v", p.RankStart, p.RankRows)
		}
		sum := 0
		for _, n := range p.LocalRows(r, nil) {
			sum += n
		}
		if sum != p.RankRows[r] {
			t.Fatalf("rank %d local rows sum %d, want %d", r, sum, p.RankRows[r])
		}
	}
}

func checkRoundTrip(t *testing.T, p *Plan, d *Decision, r *rand.Rand) {
	t.Helper()
	const rowBytes = 12
	src := make([]byte, d.Tokens*rowBytes)
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	packed := make([]byte, p.Rows*rowBytes)
	if err := p.Pack(packed, src, rowBytes); err != nil {
		t.Fatal(err)
	}
	for i := range p.Rows {
		tok := p.Token(i)
		if !bytes.Equal(packed[i*rowBytes:(i+1)*rowBytes], src[tok*rowBytes:(tok+1)*rowBytes]) {
			t.Fatalf("packed row %d is not token %d", i, tok)
		}
	}
	slots := bytes.Repeat([]byte{0xAA}, len(d.Expert)*rowBytes) // dirty: dropped slots must be zeroed
	if err := p.Unpack(slots, packed, rowBytes); err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, rowBytes)
	for a, e := range d.Expert {
		got := slots[a*rowBytes : (a+1)*rowBytes]
		want := zero
		if e != Dropped {
			tok := a / d.K
			want = src[tok*rowBytes : (tok+1)*rowBytes]
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("unpacked slot %d = %x, want %x", a, got, want)
		}
	}

	// Combine: expert "outputs" are arbitrary rows; compare with a direct sum.
	const hidden = 5
	out := make([]float32, p.Rows*hidden)
	for i := range out {
		out[i] = float32(r.NormFloat64())
	}
	dst := make([]float32, d.Tokens*hidden)
	for i := range dst {
		dst[i] = float32(math.NaN()) // must be overwritten
	}
	if err := p.Combine(dst, out, hidden); err != nil {
		t.Fatal(err)
	}
	for tok := range d.Tokens {
		for j := range hidden {
			var want float32
			for s := range d.K {
				a := tok*d.K + s
				if d.Expert[a] == Dropped {
					continue
				}
				want += d.Weight[a] * out[int(p.Row[a])*hidden+j]
			}
			// Tolerance: the compiler may fuse multiply-adds differently here.
			if got := dst[tok*hidden+j]; math.Abs(float64(got-want)) > 1e-5*(1+math.Abs(float64(want))) {
				t.Fatalf("combine token %d [%d] = %v, want %v", tok, j, got, want)
			}
		}
	}
}

func TestPlanErrors(t *testing.T) {
	pl4, err := Contiguous(4, 2)
	if err != nil {
		t.Fatal(err)
	}
	pl8, err := Contiguous(8, 2)
	if err != nil {
		t.Fatal(err)
	}
	var d Decision
	if err := FromAssignments([]int32{7, 0}, []float32{1, 1}, 1, 2, 8, &d); err != nil {
		t.Fatal(err)
	}
	var p Plan
	broken := *pl4
	broken.Owner = []int{0, 0, 1}
	for name, build := range map[string]func() error{
		"expert beyond placement": func() error { return p.Build(&d, pl4) },
		"nil placement":           func() error { return p.Build(&d, nil) },
		"broken placement":        func() error { return p.Build(&d, &broken) },
		"nil decision":            func() error { return p.Build(nil, pl8) },
	} {
		if err := build(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Build = %v, want ErrInvalid", name, err)
		}
	}
	if err := p.Build(&d, pl8); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"pack short source":      func() error { return p.Pack(make([]byte, 8), make([]byte, 3), 4) },
		"pack short destination": func() error { return p.Pack(make([]byte, 7), make([]byte, 4), 4) },
		"pack negative row":      func() error { return p.Pack(nil, nil, -1) },
		"unpack short dst":       func() error { return p.Unpack(make([]byte, 7), make([]byte, 8), 4) },
		"unpack short src":       func() error { return p.Unpack(make([]byte, 8), make([]byte, 7), 4) },
		"combine short dst":      func() error { return p.Combine(make([]float32, 2), make([]float32, 6), 3) },
		"combine short src":      func() error { return p.Combine(make([]float32, 3), make([]float32, 5), 3) },
	} {
		if err := call(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

func TestBuildAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 0))
	d := randomDecision(t, r, 1024, 16, 2, 1)
	if _, err := (Capacity{Factor: 1}).Apply(d, 16, nil); err != nil {
		t.Fatal(err)
	}
	pl, err := Contiguous(16, 4)
	if err != nil {
		t.Fatal(err)
	}
	var p Plan
	if err := p.Build(d, pl); err != nil {
		t.Fatal(err)
	}
	const rowBytes = 64
	src := make([]byte, d.Tokens*rowBytes)
	packed := make([]byte, p.Rows*rowBytes)
	if n := testing.AllocsPerRun(20, func() {
		if err := p.Build(d, pl); err != nil {
			t.Fatal(err)
		}
		if err := p.Pack(packed, src, rowBytes); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Build+Pack allocate %v times per step on a reused plan", n)
	}
}

// BenchmarkPack gathers T=4096 tokens, top-2 of 16 experts, rows of 1024
// bf16 values (2 KiB), into send order: 16 MiB per op.
func BenchmarkPack(b *testing.B) {
	const tokens, experts, k, rowBytes = 4096, 16, 2, 1024 * 2
	r := rand.New(rand.NewPCG(1, 0))
	d := randomDecision(b, r, tokens, experts, k, 0)
	pl, err := Contiguous(experts, 4)
	if err != nil {
		b.Fatal(err)
	}
	var p Plan
	if err := p.Build(d, pl); err != nil {
		b.Fatal(err)
	}
	src := make([]byte, tokens*rowBytes)
	dst := make([]byte, p.Rows*rowBytes)
	b.SetBytes(int64(p.Rows * rowBytes))
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Pack(dst, src, rowBytes); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStep is the per-step routing cost without data movement: gate,
// capacity and plan for T=4096, E=16, k=2 over 4 ranks.
func BenchmarkStep(b *testing.B) {
	const tokens, experts, k = 4096, 16, 2
	r := rand.New(rand.NewPCG(2, 0))
	logits := make([]float32, tokens*experts)
	if err := SkewedLogits(r, tokens, experts, 1, logits); err != nil {
		b.Fatal(err)
	}
	pl, err := Contiguous(experts, 4)
	if err != nil {
		b.Fatal(err)
	}
	g, c := Gate{Experts: experts, K: k}, Capacity{Factor: 1.25}
	var (
		d       Decision
		scratch CapacityScratch
		p       Plan
	)
	b.ReportAllocs()
	for b.Loop() {
		if err := g.Route(logits, tokens, &d); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Apply(&d, experts, &scratch); err != nil {
			b.Fatal(err)
		}
		if err := p.Build(&d, pl); err != nil {
			b.Fatal(err)
		}
	}
}
