package algo

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

type planFunc func(*Schedule, AllToAllVArgs) error

var planners = []struct {
	name string
	algo Algo
	plan planFunc
}{
	{"pairwise", AlgoPairwise, PlanPairwise},
	{"fullmesh", AlgoFullmesh, PlanFullmesh},
}

// pattern is the byte rank src sends rank dst at index k of their block.
func pattern(src, dst, k int) byte {
	return byte(src*131 + dst*29 + k*7 + (k>>8)*13 + 1)
}

// matrix generators: m[i*p+j] = bytes rank i sends rank j.
type genFunc func(rng *rand.Rand, p, scale int) []int

var generators = []struct {
	name string
	gen  genFunc
}{
	{"zeros", func(rng *rand.Rand, p, scale int) []int { return make([]int, p*p) }},
	{"giant-pair", func(rng *rand.Rand, p, scale int) []int {
		m := randomMatrix(rng, p, scale/16, 0)
		m[rng.IntN(p)*p+rng.IntN(p)] = scale*4 + rng.IntN(scale)
		return m
	}},
	{"all-to-one", func(rng *rand.Rand, p, scale int) []int {
		m := make([]int, p*p)
		t := rng.IntN(p)
		for i := range p {
			m[i*p+t] = 1 + rng.IntN(scale)
		}
		return m
	}},
	{"one-to-all", func(rng *rand.Rand, p, scale int) []int {
		m := make([]int, p*p)
		s := rng.IntN(p)
		for j := range p {
			m[s*p+j] = 1 + rng.IntN(scale)
		}
		return m
	}},
	{"uniform", func(rng *rand.Rand, p, scale int) []int {
		m := make([]int, p*p)
		c := rng.IntN(scale + 1)
		for i := range m {
			m[i] = c
		}
		return m
	}},
	{"lognormal", func(rng *rand.Rand, p, scale int) []int {
		m := make([]int, p*p)
		for i := range m {
			m[i] = min(int(float64(scale)/8*math.Exp(1.5*rng.NormFloat64())), 4*scale)
		}
		return m
	}},
	{"random-zeros", func(rng *rand.Rand, p, scale int) []int { return randomMatrix(rng, p, scale, 0.5) }},
	{"random", func(rng *rand.Rand, p, scale int) []int { return randomMatrix(rng, p, scale, 0) }},
}

func randomMatrix(rng *rand.Rand, p, scale int, zeroProb float64) []int {
	m := make([]int, p*p)
	for i := range m {
		if rng.Float64() >= zeroProb {
			m[i] = rng.IntN(scale + 1)
		}
	}
	return m
}

// argsFor is rank r's view of matrix m.
func argsFor(m []int, p, r, streams, window, block int) AllToAllVArgs {
	a := AllToAllVArgs{Rank: r, World: p, SendCounts: make([]int, p), RecvCounts: make([]int, p),
		Streams: streams, Window: window, BlockSize: block}
	for j := range p {
		a.SendCounts[j] = m[r*p+j]
		a.RecvCounts[j] = m[j*p+r]
	}
	return a
}

type simCase struct {
	p, streams, window, block int
	m                         []int
	cut                       []int  // LL cutoffs by pair (symmetric), or nil
	quiet                     []bool // LLQuiet by pair (symmetric), or nil
}

func (c simCase) String() string {
	return fmt.Sprintf("p=%d streams=%d window=%d block=%d matrix=%v ll=%v", c.p, c.streams, c.window, c.block, c.m, c.cut)
}

// args is rank r's view of the case.
func (c simCase) args(r int) AllToAllVArgs {
	a := argsFor(c.m, c.p, r, c.streams, c.window, c.block)
	if c.cut != nil {
		a.LLCutoff = c.cut[r*c.p : (r+1)*c.p]
	}
	if c.quiet != nil {
		a.LLQuiet = c.quiet[r*c.p : (r+1)*c.p]
	}
	return a
}

// runCase plans every rank into scheds (reused across calls), checks the
// framing rule on each schedule, simulates, and checks every received byte.
func runCase(t *testing.T, plan planFunc, want Algo, scheds []*Schedule, c simCase) {
	t.Helper()
	p := c.p
	send, recv := make([][]byte, p), make([][]byte, p)
	for r := range p {
		a := c.args(r)
		if err := plan(scheds[r], a); err != nil {
			t.Fatalf("%v: rank %d: plan: %v", c, r, err)
		}
		checkFraming(t, c, r, scheds[r], a)
		for j := range p {
			for k := range a.SendCounts[j] {
				send[r] = append(send[r], pattern(r, j, k))
			}
		}
		total := 0
		for _, n := range a.RecvCounts {
			total += n
		}
		recv[r] = make([]byte, total)
		for i := range recv[r] {
			recv[r][i] = 0xA5 ^ byte(i) // garbage the pattern is unlikely to match everywhere
		}
	}
	if err := Simulate(scheds[:p], send, recv); err != nil {
		t.Fatalf("%v: simulate: %v", c, err)
	}
	for r := range p {
		off := 0
		for i := range p {
			for k := range c.m[i*p+r] {
				if got, w := recv[r][off+k], pattern(i, r, k); got != w {
					t.Fatalf("%v: rank %d byte %d of block from %d = %#x, want %#x", c, r, k, i, got, w)
				}
			}
			off += c.m[i*p+r]
		}
	}
	for r := range p {
		if scheds[r].Algo != want {
			t.Fatalf("%v: rank %d planned %v, want %v", c, r, scheds[r].Algo, want)
		}
	}
}

// checkFraming verifies the framing rule and the self-copy rule on one rank's
// schedule, independently of the simulator.
func checkFraming(t *testing.T, c simCase, r int, s *Schedule, a AllToAllVArgs) {
	t.Helper()
	block := c.block
	if block == 0 {
		block = DefaultBlockSize
	}
	type msg struct {
		kind  StepKind
		peer  int
		bytes int
		n     int
	}
	// Frames of one message may interleave with other messages' frames (pairwise
	// sends frame f of both directions as sub-round f), but within a message
	// they come in order, on the rule's streams, and complete.
	open := map[[2]int]*msg{}
	seen := map[[2]int]bool{}
	copies := 0
	for _, st := range s.Steps {
		switch st.Kind {
		case StepCopy:
			copies++
			if st.Src.Len != a.SendCounts[r] {
				t.Fatalf("%v: rank %d copies %d bytes, want %d", c, r, st.Src.Len, a.SendCounts[r])
			}
			continue
		case StepStore, StepLoad:
			n, other := a.SendCounts[st.Peer], StepSend
			sp := st.Src
			if st.Kind == StepLoad {
				n, other, sp = a.RecvCounts[st.Peer], StepRecv, st.Dst
			}
			key := [2]int{int(st.Kind), st.Peer}
			if !a.llMessage(st.Peer, n) || seen[key] || sp.Len != n || st.CountOnly == a.llData(st.Peer, n) {
				t.Fatalf("%v: rank %d: unexpected or second %v (cutoff %d)", c, r, st, a.LLCutoff[st.Peer])
			}
			seen[key] = true
			if !st.CountOnly {
				seen[[2]int{int(other), st.Peer}] = true // the block needs no frames
			}
			continue
		case StepSend, StepRecv:
		default:
			t.Fatalf("%v: rank %d: unexpected %v", c, r, st)
		}
		if st.Peer == r {
			t.Fatalf("%v: rank %d talks to itself: %v", c, r, st)
		}
		key := [2]int{int(st.Kind), st.Peer}
		if seen[key] {
			t.Fatalf("%v: rank %d: second %v message with %d", c, r, st.Kind, st.Peer)
		}
		cur := open[key]
		if cur == nil {
			cur = &msg{kind: st.Kind, peer: st.Peer}
			open[key] = cur
		}
		sp := st.Src
		if st.Kind == StepRecv {
			sp = st.Dst
		}
		if st.Stream != cur.n%c.streams {
			t.Fatalf("%v: rank %d: frame %d of message with %d on stream %d", c, r, cur.n, cur.peer, st.Stream)
		}
		if sp.Len > block || (!st.Last && sp.Len != block) {
			t.Fatalf("%v: rank %d: frame %v has %d bytes with block %d", c, r, st, sp.Len, block)
		}
		// The first frame from a peer that stores no LL message to this
		// rank in this operation, and only that one, watches its slot.
		watch := st.Kind == StepRecv && cur.n == 0 && a.llPeer(st.Peer) && !a.llMessage(st.Peer, a.RecvCounts[st.Peer])
		if st.WatchLL != watch {
			t.Fatalf("%v: rank %d: frame %d of %v message with %d: WatchLL %v, want %v", c, r, cur.n, st.Kind, cur.peer, st.WatchLL, watch)
		}
		cur.bytes += sp.Len
		cur.n++
		if st.Last {
			want := a.SendCounts[cur.peer]
			if cur.kind == StepRecv {
				want = a.RecvCounts[cur.peer]
			}
			if cur.bytes != want || cur.n != FrameCount(want, c.block) {
				t.Fatalf("%v: rank %d: %v message with %d: %d bytes in %d frames, want %d in %d", c, r, cur.kind, cur.peer, cur.bytes, cur.n, want, FrameCount(want, c.block))
			}
			seen[key] = true
			delete(open, key)
		}
	}
	want := 2 * (c.p - 1)
	for j := range c.p {
		if j != r && a.llMessage(j, a.SendCounts[j]) {
			want++ // a store besides the data, by LL or frames
		}
		if j != r && a.llMessage(j, a.RecvCounts[j]) {
			want++ // a load
		}
	}
	if len(open) != 0 || len(seen) != want {
		t.Fatalf("%v: rank %d: %d complete messages, want %d (%d open)", c, r, len(seen), want, len(open))
	}
	if wantCopies := min(1, a.SendCounts[r]); copies != wantCopies {
		t.Fatalf("%v: rank %d: %d copies, want %d", c, r, copies, wantCopies)
	}
}

func TestAllToAllVProperty(t *testing.T) {
	const cases = 1200
	worlds := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16}
	streams := []int{1, 2, 3}
	windows := []int{1, 2, 4, 0}
	blocks := []int{7, 64, 7, 64, 1, 0}
	for pi, pl := range planners {
		t.Run(pl.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(42, uint64(pi)))
			scheds := make([]*Schedule, 16)
			for i := range scheds {
				scheds[i] = new(Schedule)
			}
			seenGen := make([]int, len(generators))
			for i := range cases {
				c := simCase{
					p:       worlds[rng.IntN(len(worlds))],
					streams: streams[rng.IntN(len(streams))],
					window:  windows[rng.IntN(len(windows))],
					block:   blocks[rng.IntN(len(blocks))],
				}
				scale := 64 + rng.IntN(256)
				if c.block == 1 { // one-byte frames: keep the frame count sane
					scale = 12
				}
				if i%100 == 99 { // a few big matrices, with blocks to match
					scale, c.block = 20000, 1024+rng.IntN(3000)
				}
				g := i % len(generators)
				seenGen[g]++
				c.m = generators[g].gen(rng, c.p, scale)
				runCase(t, pl.plan, pl.algo, scheds, c)
			}
			for g, n := range seenGen {
				if n < cases/len(generators)-1 {
					t.Errorf("generator %s ran %d times", generators[g].name, n)
				}
			}
		})
	}
}

// TestLLProperty runs pairwise, fullmesh and ll with random LL cutoffs per
// pair (some pairs without LL) on the simulator's random matrices: small
// blocks go by one store each, larger ones announce their length and follow
// as frames (or, on quiet pairs, follow without the announcement), and
// every byte still lands.
func TestLLProperty(t *testing.T) {
	const cases = 600
	worlds := []int{1, 2, 3, 4, 5, 7, 8, 12, 16}
	for pi, pl := range append(planners[:len(planners):len(planners)], struct {
		name string
		algo Algo
		plan planFunc
	}{"ll", AlgoLL, PlanLL}) {
		t.Run(pl.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(pi)))
			scheds := make([]*Schedule, 16)
			for i := range scheds {
				scheds[i] = new(Schedule)
			}
			for i := range cases {
				c := simCase{p: worlds[rng.IntN(len(worlds))], streams: 1 + rng.IntN(3), window: rng.IntN(4), block: []int{0, 64, 100}[rng.IntN(3)]}
				c.m = generators[i%len(generators)].gen(rng, c.p, 64+rng.IntN(256))
				c.cut = make([]int, c.p*c.p)
				for x := range c.p {
					for y := range x {
						v := []int{-1, 0, 8, 64, 200, 1 << 20}[rng.IntN(6)]
						c.cut[x*c.p+y], c.cut[y*c.p+x] = v, v
					}
				}
				if i%2 == 1 { // quiet pairs: larger blocks by frames alone
					c.quiet = make([]bool, c.p*c.p)
					for x := range c.p {
						for y := range x {
							q := rng.IntN(2) == 0
							c.quiet[x*c.p+y], c.quiet[y*c.p+x] = q, q
						}
					}
				}
				runCase(t, pl.plan, pl.algo, scheds, c)
			}
		})
	}
}

// TestLLMismatch: a pair that disagrees about its block's length is caught
// in the LL round, whichever side thinks it small.
func TestLLMismatch(t *testing.T) {
	for _, tc := range []struct{ sent, expected int }{{10, 20}, {10, 100}, {100, 10}, {100, 200}} {
		var s0, s1 Schedule
		cut := []int{32, 32}
		a0 := AllToAllVArgs{Rank: 0, World: 2, SendCounts: []int{0, tc.sent}, RecvCounts: []int{0, 0}, Streams: 1, LLCutoff: cut}
		a1 := AllToAllVArgs{Rank: 1, World: 2, SendCounts: []int{0, 0}, RecvCounts: []int{tc.expected, 0}, Streams: 1, LLCutoff: cut}
		if err := PlanLL(&s0, a0); err != nil {
			t.Fatal(err)
		}
		if err := PlanLL(&s1, a1); err != nil {
			t.Fatal(err)
		}
		send := [][]byte{make([]byte, tc.sent), nil}
		recv := [][]byte{nil, make([]byte, tc.expected)}
		if err := Simulate([]*Schedule{&s0, &s1}, send, recv); !errors.Is(err, ErrMismatch) {
			t.Errorf("%d sent, %d expected: %v, want ErrMismatch", tc.sent, tc.expected, err)
		}
	}
}

// TestPlanShapes pins the round structure each algorithm promises.
func TestPlanShapes(t *testing.T) {
	for _, p := range []int{1, 2, 3, 5, 8, 13} {
		for _, w := range []int{0, 1, 2, 3, 4, 100} {
			m := make([]int, p*p)
			for i := range m {
				m[i] = 10
			}
			for r := range p {
				a := argsFor(m, p, r, 1, w, 0)
				var s Schedule
				if err := PlanPairwise(&s, a); err != nil {
					t.Fatal(err)
				}
				if want := max(1, p-1); s.NumRounds() != want {
					t.Fatalf("pairwise p=%d: %d rounds, want %d", p, s.NumRounds(), want)
				}
				if first := s.Round(0); first[0].Kind != StepCopy {
					t.Fatalf("pairwise p=%d: the local copy does not lead round 0: %v", p, first)
				}
				for k := 1; k < p; k++ {
					rd := s.Round(k - 1)
					if k == 1 {
						rd = rd[1:] // after the local copy
					}
					if len(rd) != 2 || rd[0].Kind != StepSend || rd[0].Peer != (r+k)%p || rd[1].Kind != StepRecv || rd[1].Peer != (r-k+p)%p {
						t.Fatalf("pairwise p=%d rank %d round %d: %v", p, r, k, rd)
					}
				}
				if err := PlanFullmesh(&s, a); err != nil {
					t.Fatal(err)
				}
				c := fullmeshWindow(w, p)
				wantRounds := max(1, (p-1+c-1)/c)
				if s.NumRounds() != wantRounds {
					t.Fatalf("fullmesh p=%d window=%d: %d rounds, want %d", p, w, s.NumRounds(), wantRounds)
				}
				j := 0
				for i := range s.NumRounds() {
					for _, st := range s.Round(i) {
						if st.Kind == StepCopy {
							continue
						}
						d := fullmeshDistance(j/2, p)
						want := (r + d) % p
						if st.Kind == StepRecv {
							want = (r - d + p) % p
						}
						if st.Peer != want || j/2/c != i {
							t.Fatalf("fullmesh p=%d window=%d rank %d round %d: step %v, want peer %d in round %d", p, w, r, i, st, want, j/2/c)
						}
						j++
					}
				}
			}
		}
	}
}

func TestFullmeshDistanceOrder(t *testing.T) {
	if got := fmt.Sprint(distances(6)); got != "[1 5 2 4 3]" {
		t.Fatalf("distances(6) = %s", got)
	}
	if got := fmt.Sprint(distances(7)); got != "[1 6 2 5 3 4]" {
		t.Fatalf("distances(7) = %s", got)
	}
	for p := 2; p <= 300; p++ {
		seen := make([]bool, p)
		for _, d := range distances(p) {
			if d < 1 || d >= p || seen[d] {
				t.Fatalf("p=%d: distance %d out of range or repeated: %v", p, d, distances(p))
			}
			seen[d] = true
		}
	}
}

func distances(p int) []int {
	var ds []int
	for j := range p - 1 {
		ds = append(ds, fullmeshDistance(j, p))
	}
	return ds
}

func TestValidate(t *testing.T) {
	ok := AllToAllVArgs{Rank: 1, World: 3, SendCounts: []int{1, 2, 3}, RecvCounts: []int{4, 2, 6}, Streams: 1}
	tests := []struct {
		name   string
		mutate func(a *AllToAllVArgs)
		want   string // "" means valid
	}{
		{"valid", func(a *AllToAllVArgs) {}, ""},
		{"valid defaults and options", func(a *AllToAllVArgs) { a.Window, a.BlockSize, a.Streams = 7, 3, 4 }, ""},
		{"world zero", func(a *AllToAllVArgs) { a.World, a.Rank = 0, 0 }, "world 0"},
		{"rank negative", func(a *AllToAllVArgs) { a.Rank = -1 }, "rank -1 out of range"},
		{"rank too big", func(a *AllToAllVArgs) { a.Rank = 3 }, "rank 3 out of range"},
		{"short send counts", func(a *AllToAllVArgs) { a.SendCounts = a.SendCounts[:2] }, "len(SendCounts)=2"},
		{"long recv counts", func(a *AllToAllVArgs) { a.RecvCounts = append(a.RecvCounts, 1) }, "len(RecvCounts)=4"},
		{"no streams", func(a *AllToAllVArgs) { a.Streams = 0 }, "streams 0"},
		{"negative window", func(a *AllToAllVArgs) { a.Window = -1 }, "window -1"},
		{"negative block", func(a *AllToAllVArgs) { a.BlockSize = -5 }, "block size -5"},
		{"negative send", func(a *AllToAllVArgs) { a.SendCounts[2] = -1 }, "SendCounts[2]=-1"},
		{"negative recv", func(a *AllToAllVArgs) { a.RecvCounts[0] = -3 }, "RecvCounts[0]=-3"},
		{"self mismatch", func(a *AllToAllVArgs) { a.RecvCounts[1] = 5 }, "sends itself 2 bytes but expects 5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := ok
			a.SendCounts = append([]int(nil), ok.SendCounts...)
			a.RecvCounts = append([]int(nil), ok.RecvCounts...)
			tt.mutate(&a)
			err := a.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want error containing %q", err, tt.want)
			}
			for _, pl := range planners {
				s := Schedule{Steps: []Step{{Kind: StepCopy}}, RoundEnds: []int{1}}
				if err := pl.plan(&s, a); err == nil {
					t.Fatalf("%s planned invalid args", pl.name)
				}
			}
		})
	}
}

func TestFrameCount(t *testing.T) {
	tests := []struct{ n, block, want int }{
		{0, 7, 1}, {1, 7, 1}, {7, 7, 1}, {8, 7, 2}, {14, 7, 2}, {15, 7, 3},
		{0, 0, 1}, {DefaultBlockSize, 0, 1}, {DefaultBlockSize + 1, 0, 2},
	}
	for _, tt := range tests {
		if got := FrameCount(tt.n, tt.block); got != tt.want {
			t.Errorf("FrameCount(%d, %d) = %d, want %d", tt.n, tt.block, got, tt.want)
		}
	}
}

func TestAllLL(t *testing.T) {
	// Rank 1 of 3 sends {5, 9, 2} and receives {3, 9, 7}; its own block
	// (index 1) is a local copy whatever its size or cutoff.
	tests := []struct {
		name   string
		cutoff []int
		want   bool
	}{
		{"no cutoff", nil, false},
		{"all fit", []int{5, -1, 7}, true},
		{"all fit with room", []int{100, 0, 100}, true},
		{"send above cutoff", []int{4, 100, 100}, false},
		{"recv above cutoff", []int{100, 100, 6}, false},
		{"peer left to frames", []int{-1, 100, 100}, false},
		{"zero cutoff", []int{0, 100, 100}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := AllToAllVArgs{Rank: 1, World: 3, SendCounts: []int{5, 9, 2}, RecvCounts: []int{3, 9, 7}, Streams: 1, LLCutoff: tt.cutoff}
			if err := a.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if got := a.AllLL(); got != tt.want {
				t.Errorf("AllLL() = %v, want %v", got, tt.want)
			}
		})
	}
	// A world of one has no peer, so everything (nothing) goes by LL once
	// LL is on.
	solo := AllToAllVArgs{Rank: 0, World: 1, SendCounts: []int{8}, RecvCounts: []int{8}, Streams: 1, LLCutoff: []int{-1}}
	if !solo.AllLL() {
		t.Errorf("AllLL() = false for a world of one with LL on, want true")
	}
}

func TestPlanNoAllocsOnReuse(t *testing.T) {
	const p = 64
	rng := rand.New(rand.NewPCG(7, 7))
	m := randomMatrix(rng, p, 5000, 0.2)
	m[3*p+3] = 0 // an empty self block
	for _, pl := range planners {
		for _, r := range []int{0, 3, p - 1} {
			a := argsFor(m, p, r, 3, 0, 1000)
			var s Schedule
			if err := pl.plan(&s, a); err != nil {
				t.Fatal(err)
			}
			var err error
			allocs := testing.AllocsPerRun(50, func() { err = pl.plan(&s, a) })
			if err != nil || allocs != 0 {
				t.Fatalf("%s rank %d: %v allocations per reused plan (err %v), want 0", pl.name, r, allocs, err)
			}
		}
	}
	allocs := testing.AllocsPerRun(50, func() { ChooseAllToAllV(p, 2, 0, m, DefaultLink()) })
	if allocs != 0 {
		t.Fatalf("ChooseAllToAllV: %v allocations, want 0", allocs)
	}
}

func benchmarkPlan(b *testing.B, plan planFunc) {
	const p = 1024
	counts := make([]int, p)
	for i := range counts {
		counts[i] = 64 << 10
	}
	a := AllToAllVArgs{Rank: 517, World: p, SendCounts: counts, RecvCounts: counts, Streams: 2}
	var s Schedule
	if err := plan(&s, a); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := plan(&s, a); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPlanFullmesh(b *testing.B) { benchmarkPlan(b, PlanFullmesh) }
func BenchmarkPlanPairwise(b *testing.B) { benchmarkPlan(b, PlanPairwise) }

func BenchmarkChooseAllToAllVNominal(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		ChooseAllToAllV(1024, 2, 0, nil, DefaultLink())
	}
}

// TestSameHostPairsMeet: in every AllToAllV algorithm each ordered pair of
// ranks on one host has a message (a first frame or an LL store), however
// empty its block. The length check needs it, and package dispatch relies on
// it: a rank's AllToAllV returns only after each same-host rank entered it.
func TestSameHostPairsMeet(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for i := range 200 {
		p := 1 + rng.IntN(9)
		per := 1 + rng.IntN(p)
		for p%per != 0 {
			per--
		}
		hosts := make([]int, p)
		for r := range hosts {
			hosts[r] = r / per // staged wants equal hosts; ranks of a host consecutive
		}
		m := make([]int, p*p)
		for k := range m {
			if rng.IntN(3) > 0 { // plenty of empty blocks
				m[k] = rng.IntN(3000)
			}
		}
		plans := map[string]func(s *Schedule, r int) error{
			"pairwise": func(s *Schedule, r int) error { return PlanPairwise(s, argsOf(r, p, m)) },
			"fullmesh": func(s *Schedule, r int) error { return PlanFullmesh(s, argsOf(r, p, m)) },
			"ll": func(s *Schedule, r int) error {
				a := argsOf(r, p, m)
				a.LLCutoff = make([]int, p)
				for j := range p {
					a.LLCutoff[j] = -1
					if hosts[j] == hosts[r] && j != r {
						a.LLCutoff[j] = 256
					}
				}
				return PlanLL(s, a)
			},
			"skew": func(s *Schedule, r int) error {
				return PlanSkew(s, SkewArgs{Rank: r, World: p, Matrix: m, Streams: 1, BlockSize: 1024})
			},
			"staged": func(s *Schedule, r int) error {
				return PlanStaged(s, StagedArgs{Rank: r, World: p, Matrix: m, Hosts: hosts, Streams: 1, BlockSize: 1024})
			},
		}
		for name, plan := range plans {
			for r := range p {
				var s Schedule
				if err := plan(&s, r); err != nil {
					t.Fatalf("case %d %s rank %d: %v", i, name, r, err)
				}
				met := map[int]bool{}
				for _, st := range s.Steps {
					if st.Kind == StepSend || st.Kind == StepStore {
						met[st.Peer] = true
					}
				}
				for j := range p {
					if j != r && hosts[j] == hosts[r] && !met[j] {
						t.Fatalf("case %d %s (p=%d, %d per host): rank %d sends nothing to same-host rank %d", i, name, p, per, r, j)
					}
				}
			}
		}
	}
}

func argsOf(r, p int, m []int) AllToAllVArgs {
	a := AllToAllVArgs{Rank: r, World: p, SendCounts: make([]int, p), RecvCounts: make([]int, p), Streams: 1, BlockSize: 1024}
	for j := range p {
		a.SendCounts[j], a.RecvCounts[j] = m[r*p+j], m[j*p+r]
	}
	return a
}

// TestLLRoundMerges: where every LL peer is quiet, the LL messages ride with
// the first frames (a window of every peer makes the whole exchange one
// round); where a peer announces a length, the LL round stays its own, so
// that the announcement is loaded before that peer's frames.
func TestLLRoundMerges(t *testing.T) {
	const p = 4
	m := make([]int, p*p) // small blocks to and from odd ranks, large to and from even ones
	for i := range p {
		for j := range p {
			if i != j {
				m[i*p+j] = 100
				if (i+j)%2 == 0 {
					m[i*p+j] = 5000
				}
			}
		}
	}
	cut := make([]int, p*p)
	for i := range cut {
		cut[i] = 1024
	}
	for _, tc := range []struct {
		name   string
		quiet  bool
		rounds int
	}{{"quiet", true, 1}, {"announced", false, 2}} {
		var quiet []bool
		if tc.quiet {
			quiet = make([]bool, p*p)
			for i := range quiet {
				quiet[i] = true
			}
		}
		c := simCase{p: p, streams: 1, window: p - 1, m: m, cut: cut, quiet: quiet}
		scheds := make([]*Schedule, p)
		for r := range scheds {
			scheds[r] = &Schedule{}
		}
		for _, plan := range []struct {
			f    planFunc
			algo Algo
		}{{PlanFullmesh, AlgoFullmesh}, {PlanLL, AlgoLL}} {
			runCase(t, plan.f, plan.algo, scheds, c)
			for r, s := range scheds {
				if got := s.NumRounds(); got != tc.rounds {
					t.Errorf("%s, %v: rank %d planned %d rounds, want %d", tc.name, plan.algo, r, got, tc.rounds)
				}
			}
		}
	}
}
