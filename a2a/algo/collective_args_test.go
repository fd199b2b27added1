package algo

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/a2a-moe/a2a/a2a/reduce"
)

// collPlanners is every collective planner with what it requires.
var collPlanners = []struct {
	name  string
	plan  func(*Schedule, CollArgs) error
	needs collNeeds
}{
	{"allreduce-ring", PlanAllReduceRing, collReduces},
	{"allreduce-recdoubling", PlanAllReduceRecursiveDoubling, collReduces},
	{"allreduce-ll", PlanAllReduceLL, collReduces},
	{"allreduce-hierarchical", PlanAllReduceHierarchical, collReduces},
	{"reducescatter-ring", PlanReduceScatterRing, collReduces},
	{"allgather-ring", PlanAllGatherRing, 0},
	{"allgatherv-ring", PlanAllGatherVRing, collCounts},
	{"broadcast-tree", PlanBroadcastTree, collRooted},
	{"broadcast-scatterallgather", PlanBroadcastScatterAllGather, collRooted},
	{"reduce-tree", PlanReduceTree, collReduces | collRooted},
	{"gather-direct", PlanGatherDirect, collRooted},
	{"gatherv-direct", PlanGatherVDirect, collRooted | collCounts},
	{"scatter-direct", PlanScatterDirect, collRooted},
	{"scatterv-direct", PlanScatterVDirect, collRooted | collCounts},
	{"barrier-dissemination", PlanBarrierDissemination, collNoData},
	{"barrier-ll", PlanBarrierLL, collNoData},
}

// validArgs is a call every planner of needs accepts, at rank 1 of 4.
func validArgs(needs collNeeds) CollArgs {
	a := CollArgs{Rank: 1, World: 4, Bytes: 16, ElemSize: 4, DType: uint8(reduce.Float32), Op: uint8(reduce.Sum),
		Root: 2, Streams: 1}
	if needs&collCounts != 0 {
		a.Counts = []int{4, 8, 0, 12}
	}
	if needs&collNoData != 0 {
		a.Bytes = 0
	}
	return a
}

func TestCollArgsValidate(t *testing.T) {
	const any collNeeds = 0xff // applies to every planner
	tests := []struct {
		name    string
		applies collNeeds // planners with any of these needs (any: all)
		mutate  func(a *CollArgs)
		want    string
	}{
		{"world zero", any, func(a *CollArgs) { a.World, a.Rank = 0, 0 }, "world 0 < 1"},
		{"rank too big", any, func(a *CollArgs) { a.Rank = 4 }, "rank 4 out of range [0, 4)"},
		{"rank negative", any, func(a *CollArgs) { a.Rank = -1 }, "rank -1 out of range"},
		{"no streams", any, func(a *CollArgs) { a.Streams = 0 }, "streams 0 < 1"},
		{"negative block", any, func(a *CollArgs) { a.BlockSize = -1 }, "block size -1 < 0"},
		{"negative element", any, func(a *CollArgs) { a.ElemSize = -1 }, "element size -1 < 0"},
		{"short hosts", any, func(a *CollArgs) { a.Hosts = []int{0, 0, 1} }, "len(Hosts)=3, want world 4"},
		{"negative host", any, func(a *CollArgs) { a.Hosts = []int{0, 0, -1, 1} }, "Hosts[2]=-1 < 0"},
		{"element unset", collReduces, func(a *CollArgs) { a.ElemSize = 0 }, "element size unset"},
		{"dtype unset", collReduces, func(a *CollArgs) { a.DType = 0 }, "dtype unset"},
		{"op unset", collReduces, func(a *CollArgs) { a.Op = 0 }, "op unset"},
		{"short counts", collCounts, func(a *CollArgs) { a.Counts = a.Counts[:3] }, "len(Counts)=3, want world 4"},
		{"negative count", collCounts, func(a *CollArgs) { a.Counts[1] = -4 }, "Counts[1]=-4 < 0"},
		{"partial element count", collCounts, func(a *CollArgs) { a.Counts[3] = 6 }, "Counts[3]=6 is not a multiple of the 4-byte element"},
		{"root too big", collRooted, func(a *CollArgs) { a.Root = 4 }, "root 4 out of range [0, 4)"},
		{"root negative", collRooted, func(a *CollArgs) { a.Root = -1 }, "root -1 out of range"},
		{"barrier with data", collNoData, func(a *CollArgs) { a.Bytes = 4 }, "carries no data"},
	}
	sized := []struct {
		name   string
		mutate func(a *CollArgs)
		want   string
	}{
		{"negative bytes", func(a *CollArgs) { a.Bytes = -4 }, "bytes -4 < 0"},
		{"partial element", func(a *CollArgs) { a.Bytes = 6 }, "6 bytes is not a multiple of the 4-byte element"},
	}
	for _, pl := range collPlanners {
		t.Run(pl.name, func(t *testing.T) {
			var s Schedule
			if err := pl.plan(&s, validArgs(pl.needs)); err != nil {
				t.Fatalf("valid args: %v", err)
			}
			name := strings.SplitN(pl.name, "-", 2)[0]
			check := func(what string, mutate func(a *CollArgs), want string) {
				a := validArgs(pl.needs)
				a.Counts = append([]int(nil), a.Counts...)
				mutate(&a)
				err := pl.plan(&s, a)
				if err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), name+": ") {
					t.Errorf("%s: plan = %v, want an error %q starting with %q", what, err, want, name)
				}
			}
			n := 0
			for _, tt := range tests {
				if tt.applies == any || pl.needs&tt.applies != 0 {
					check(tt.name, tt.mutate, tt.want)
					n++
				}
			}
			if pl.needs&(collCounts|collNoData) == 0 {
				for _, tt := range sized {
					check(tt.name, tt.mutate, tt.want)
					n++
				}
			}
			if n < 9 {
				t.Fatalf("only %d negative cases", n)
			}
		})
	}
}

// TestCollPlanNoAllocsOnReuse: re-planning into a used Schedule allocates
// nothing, at 64 ranks with uneven hosts (folds) and V counts.
func TestCollPlanNoAllocsOnReuse(t *testing.T) {
	const p = 64
	hosts := make([]int, p)
	counts := make([]int, p)
	for i := range hosts {
		hosts[i] = (i * 7) % 5
		counts[i] = 4 * ((i * 13) % 9)
	}
	for _, pl := range collPlanners {
		for _, r := range []int{0, 37, p - 1} {
			a := CollArgs{Rank: r, World: p, Bytes: 4 << 10, ElemSize: 4, DType: uint8(reduce.Int32), Op: uint8(reduce.Sum),
				Root: 5, Streams: 2, BlockSize: 256, Hosts: hosts}
			if pl.needs&collCounts != 0 {
				a.Counts = counts
			}
			if pl.needs&collNoData != 0 {
				a.Bytes = 0
			}
			var s Schedule
			if err := pl.plan(&s, a); err != nil {
				t.Fatal(err)
			}
			var err error
			allocs := testing.AllocsPerRun(20, func() { err = pl.plan(&s, a) })
			if err != nil || allocs != 0 {
				t.Fatalf("%s rank %d: %v allocations per reused plan (err %v), want 0", pl.name, r, allocs, err)
			}
		}
	}
	link := DefaultLink()
	if allocs := testing.AllocsPerRun(20, func() {
		ChooseAllReduce(p, 1<<20, hosts, link)
		ChooseBroadcast(p, 1<<20, link)
	}); allocs != 0 {
		t.Fatalf("selection: %v allocations, want 0", allocs)
	}
}

// TestCollShapes pins the round counts at world 8 (the most over all ranks
// and roots, and how many of those rounds use the network), so a change in
// an algorithm's structure is deliberate.
func TestCollShapes(t *testing.T) {
	const p = 8
	tests := []struct {
		name        string
		plan        func(*Schedule, CollArgs) error
		hosts       []int
		rounds, net int
	}{
		{"allreduce-ring", PlanAllReduceRing, nil, 14, 14},
		{"allreduce-recdoubling", PlanAllReduceRecursiveDoubling, nil, 4, 3},
		{"allreduce-ll", PlanAllReduceLL, nil, 4, 1},
		{"allreduce-hierarchical 2x4", PlanAllReduceHierarchical, []int{0, 0, 0, 0, 1, 1, 1, 1}, 8, 8},
		{"allreduce-hierarchical 4x2", PlanAllReduceHierarchical, []int{0, 0, 1, 1, 2, 2, 3, 3}, 8, 8},
		{"allreduce-hierarchical one host", PlanAllReduceHierarchical, nil, 14, 14},
		{"reducescatter-ring", PlanReduceScatterRing, nil, 8, 7},
		{"allgather-ring", PlanAllGatherRing, nil, 7, 7},
		{"allgatherv-ring", PlanAllGatherVRing, nil, 7, 7},
		{"broadcast-tree", PlanBroadcastTree, nil, 3, 3},
		{"broadcast-scatterallgather", PlanBroadcastScatterAllGather, nil, 8, 8},
		{"reduce-tree", PlanReduceTree, nil, 4, 3},
		{"gather-direct", PlanGatherDirect, nil, 1, 1},
		{"gatherv-direct", PlanGatherVDirect, nil, 1, 1},
		{"scatter-direct", PlanScatterDirect, nil, 1, 1},
		{"scatterv-direct", PlanScatterVDirect, nil, 1, 1},
		{"barrier-dissemination", PlanBarrierDissemination, nil, 3, 3},
	}
	for _, tt := range tests {
		rounds, net := 0, 0
		for root := range p {
			for r := range p {
				a := CollArgs{Rank: r, World: p, Bytes: 4 * 64, ElemSize: 4, DType: uint8(reduce.Float32), Op: uint8(reduce.Sum),
					Root: root, Streams: 1, Hosts: tt.hosts, Counts: []int{4, 8, 4, 8, 4, 8, 4, 8}}
				if strings.HasPrefix(tt.name, "barrier") {
					a.Bytes, a.Counts = 0, nil
				}
				var s Schedule
				if err := tt.plan(&s, a); err != nil {
					t.Fatal(err)
				}
				n := 0
				for i := range s.NumRounds() {
					for _, st := range s.Round(i) {
						if st.Kind != StepCopy && st.Kind != StepReduce {
							n++
							break
						}
					}
				}
				rounds, net = max(rounds, s.NumRounds()), max(net, n)
			}
		}
		t.Logf("%-34s world %d: %2d rounds, %2d with network traffic", tt.name, p, rounds, net)
		if rounds != tt.rounds || net != tt.net {
			t.Errorf("%s: %d rounds (%d network), want %d (%d)", tt.name, rounds, net, tt.rounds, tt.net)
		}
	}
}

// TestBarrierDissemination checks the barrier property on the schedules:
// tracking which ranks' arrival each rank has heard of (directly or through
// earlier messages), every rank has heard of all before it leaves. It also
// shows the check fails when a round is missing.
func TestBarrierDissemination(t *testing.T) {
	heard := func(scheds []*Schedule, rounds int) []uint64 {
		p := len(scheds)
		know := make([]uint64, p)
		for r := range know {
			know[r] = 1 << r
		}
		for k := range rounds {
			next := append([]uint64(nil), know...)
			for r, s := range scheds {
				for _, st := range s.Round(k) {
					if st.Kind == StepRecv {
						next[r] |= know[st.Peer] // what the sender knew entering round k
					}
				}
			}
			know = next
		}
		return know
	}
	for p := 1; p <= 16; p++ {
		scheds := newScheds(p)
		send, recv := make([][]byte, p), make([][]byte, p)
		for r := range p {
			if err := PlanBarrierDissemination(scheds[r], CollArgs{Rank: r, World: p, Streams: 2}); err != nil {
				t.Fatal(err)
			}
			if got := scheds[r].NumRounds(); got != log2ceil(p) {
				t.Fatalf("p=%d rank %d: %d rounds, want %d", p, r, got, log2ceil(p))
			}
			checkCollSchedule(t, "barrier", &collCase{p: p, streams: 2, e: 1}, r, scheds[r], false, false)
		}
		if err := Simulate(scheds, send, recv); err != nil {
			t.Fatalf("p=%d: %v", p, err)
		}
		all := uint64(1)<<p - 1
		for r, k := range heard(scheds, log2ceil(p)) {
			if k != all {
				t.Fatalf("p=%d: rank %d leaves having heard of %b", p, r, k)
			}
		}
		if p > 2 {
			incomplete := false
			for _, k := range heard(scheds, log2ceil(p)-1) {
				incomplete = incomplete || k != all
			}
			if !incomplete {
				t.Fatalf("p=%d: one round short still reaches everyone: the check is vacuous", p)
			}
		}
	}
}

func TestEstimateCollectivesHandComputed(t *testing.T) {
	unit := Link{Alpha: 1, Beta: 0.01, Lanes: 1}
	tests := []struct {
		name string
		got  float64
		want float64
	}{
		{"ring p=4", EstimateAllReduce(AlgoRing, 4, 100, nil, unit), 6 * (1 + 0.25)},
		{"recdoubling p=4", EstimateAllReduce(AlgoRecursiveDoubling, 4, 100, nil, unit), 2 * 2},
		{"recdoubling p=5 folds", EstimateAllReduce(AlgoRecursiveDoubling, 5, 100, nil, unit), 2*2 + 2*2},
		{"hierarchical 2x4", EstimateAllReduce(AlgoHierarchical, 8, 800, []int{0, 0, 0, 0, 1, 1, 1, 1}, unit), 6*(1+2) + 2*(1+1)},
		{"hierarchical 3+1 folds into the leader", EstimateAllReduce(AlgoHierarchical, 4, 100, []int{0, 0, 0, 1}, unit), 2*(1+0.5) + 4*(1+1)},
		{"world 1", EstimateAllReduce(AlgoRing, 1, 100, nil, unit), 0},
		{"unpriced allreduce", EstimateAllReduce(AlgoPairwise, 4, 100, nil, unit), math.Inf(1)},
		{"tree p=8", EstimateBroadcast(AlgoTree, 8, 100, unit), 3 * 2},
		{"scatterallgather p=8", EstimateBroadcast(AlgoScatterAllGather, 8, 800, unit), (1 + 7) + 7*(1+1)},
		{"unpriced broadcast", EstimateBroadcast(AlgoRing, 8, 100, unit), math.Inf(1)},
		{"negative bytes", EstimateBroadcast(AlgoTree, 8, -1, unit), math.Inf(1)},
	}
	for _, tt := range tests {
		if !(near(tt.got, tt.want) || math.IsInf(tt.got, 1) && math.IsInf(tt.want, 1)) {
			t.Errorf("%s: %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

func TestChooseCollectives(t *testing.T) {
	link := DefaultLink()
	twoHosts := []int{0, 0, 0, 0, 1, 1, 1, 1}
	tests := []struct {
		name string
		got  Algo
		want Algo
	}{
		{"allreduce world 1", ChooseAllReduce(1, 1<<20, nil, link), AlgoRing},
		{"allreduce small", ChooseAllReduce(8, 64, nil, link), AlgoRecursiveDoubling},
		{"allreduce small on two hosts", ChooseAllReduce(8, 64, twoHosts, link), AlgoRecursiveDoubling},
		{"allreduce large", ChooseAllReduce(8, 64<<20, nil, link), AlgoRing},
		{"allreduce large on two hosts", ChooseAllReduce(8, 64<<20, twoHosts, link), AlgoHierarchical},
		{"allreduce large, a single-rank host", ChooseAllReduce(8, 64<<20, []int{0, 0, 0, 0, 0, 0, 0, 1}, link), AlgoRing},
		{"allreduce large, one rank per host", ChooseAllReduce(4, 64<<20, []int{0, 1, 2, 3}, link), AlgoRing},
		{"allreduce large, one host", ChooseAllReduce(4, 64<<20, []int{7, 7, 7, 7}, link), AlgoRing},
		{"broadcast world 2", ChooseBroadcast(2, 64<<20, link), AlgoTree},
		{"broadcast small", ChooseBroadcast(8, 64, link), AlgoTree},
		{"broadcast large", ChooseBroadcast(8, 64<<20, link), AlgoScatterAllGather},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	for _, n := range []int{0, 64, 4 << 10, 1 << 20, 64 << 20} {
		for _, p := range []int{2, 3, 8, 13, 64} {
			ring, rd := EstimateAllReduce(AlgoRing, p, n, nil, link), EstimateAllReduce(AlgoRecursiveDoubling, p, n, nil, link)
			if auto := EstimateAllReduce(AlgoAuto, p, n, nil, link); auto != min(ring, rd) {
				t.Errorf("allreduce p=%d n=%d: auto %v, ring %v, recdoubling %v", p, n, auto, ring, rd)
			}
			tree, sag := EstimateBroadcast(AlgoTree, p, n, link), EstimateBroadcast(AlgoScatterAllGather, p, n, link)
			if auto := EstimateBroadcast(AlgoAuto, p, n, link); p > 2 && auto != min(tree, sag) {
				t.Errorf("broadcast p=%d n=%d: auto %v, tree %v, scatterallgather %v", p, n, auto, tree, sag)
			}
		}
	}
}

func TestPlanDispatch(t *testing.T) {
	a := CollArgs{Rank: 0, World: 8, Bytes: 64, ElemSize: 4, DType: uint8(reduce.Float32), Op: uint8(reduce.Sum), Streams: 1,
		Hosts: []int{0, 0, 0, 0, 1, 1, 1, 1}}
	var s Schedule
	for _, algo := range []Algo{AlgoRing, AlgoRecursiveDoubling, AlgoHierarchical, AlgoLL} {
		if err := PlanAllReduce(&s, algo, a); err != nil || s.Algo != algo {
			t.Fatalf("PlanAllReduce(%v) = %v, planned %v", algo, err, s.Algo)
		}
	}
	if err := PlanAllReduce(&s, AlgoAuto, a); err != nil || s.Algo != ChooseAllReduce(8, 64, a.Hosts, DefaultLink()) {
		t.Fatalf("PlanAllReduce(auto) = %v, planned %v", err, s.Algo)
	}
	for _, algo := range []Algo{AlgoTree, AlgoScatterAllGather} {
		if err := PlanBroadcast(&s, algo, a); err != nil || s.Algo != algo {
			t.Fatalf("PlanBroadcast(%v) = %v, planned %v", algo, err, s.Algo)
		}
	}
	if err := PlanBroadcast(&s, AlgoAuto, a); err != nil || s.Algo != AlgoTree {
		t.Fatalf("PlanBroadcast(auto) = %v, planned %v", err, s.Algo)
	}
	if err := PlanAllReduce(&s, AlgoPairwise, a); err == nil || !strings.Contains(err.Error(), "allreduce: no pairwise algorithm") {
		t.Fatalf("PlanAllReduce(pairwise) = %v", err)
	}
	if err := PlanBroadcast(&s, AlgoRing, a); err == nil || !strings.Contains(err.Error(), "broadcast: no ring algorithm") {
		t.Fatalf("PlanBroadcast(ring) = %v", err)
	}
}

// TestAlgoIDs pins the wire ids and checks every name parses back.
func TestAlgoIDs(t *testing.T) {
	if AlgoDirect != 9 || AlgoHierarchical != 10 || AlgoScatterAllGather != 11 {
		t.Fatalf("algorithm ids moved: direct %d hierarchical %d scatterallgather %d", AlgoDirect, AlgoHierarchical, AlgoScatterAllGather)
	}
	for a := AlgoAuto; a <= AlgoScatterAllGather; a++ {
		got, err := ParseAlgo(a.String())
		if err != nil || got != a {
			t.Fatalf("ParseAlgo(%q) = %v, %v", a.String(), got, err)
		}
	}
	if _, err := ParseAlgo("ring2"); err == nil {
		t.Fatal("ParseAlgo accepted an unknown name")
	}
}

func TestDescribeReduce(t *testing.T) {
	var s Schedule
	a := CollArgs{Rank: 0, World: 2, Bytes: 16, ElemSize: 4, DType: uint8(reduce.Float32), Op: uint8(reduce.Sum), Streams: 1}
	if err := PlanAllReduceRing(&s, a); err != nil {
		t.Fatal(err)
	}
	want := `ring: 2 rounds, 4 steps, scratch 8 B
round 0: send 8 B, recv 8 B, copy 0 B, reduce 8 B
  send -> 1: 8 B in 1 frame
  recvreduce <- 1: 8 B in 1 frame into recv
round 1: send 8 B, recv 8 B, copy 0 B
  send -> 1: 8 B in 1 frame
  recv <- 1: 8 B in 1 frame
`
	if got := s.String(); got != want {
		t.Fatalf("String() =\n%s\nwant\n%s", got, want)
	}
	st := s.Round(0)[1]
	if got := st.String(); got != "recvreduce scratch[0:8] from 1 stream 0 into recv[0:8] with send[0:8] last" {
		t.Fatalf("step = %q", got)
	}
	if !errors.Is(s.Describe(failWriter{}), errWrite) {
		t.Fatal("Describe swallowed a write error")
	}
}

// TestBarrierLL: one round in which every rank stores to and loads from
// every peer, deadlock-free on the simulator for every world size.
func TestBarrierLL(t *testing.T) {
	for p := 1; p <= 16; p++ {
		scheds := newScheds(p)
		send, recv := make([][]byte, p), make([][]byte, p)
		for r := range p {
			if err := PlanBarrierLL(scheds[r], CollArgs{Rank: r, World: p, Streams: 1}); err != nil {
				t.Fatal(err)
			}
			s := scheds[r]
			if s.NumRounds() != min(1, p-1) || len(s.Steps) != 2*(p-1) {
				t.Fatalf("p=%d rank %d: %d rounds, %d steps", p, r, s.NumRounds(), len(s.Steps))
			}
			peers := map[[2]int]bool{}
			for _, st := range s.Steps {
				if (st.Kind != StepStore && st.Kind != StepLoad) || st.Peer == r || peers[[2]int{int(st.Kind), st.Peer}] {
					t.Fatalf("p=%d rank %d: unexpected %v", p, r, st)
				}
				peers[[2]int{int(st.Kind), st.Peer}] = true
			}
		}
		if err := Simulate(scheds, send, recv); err != nil {
			t.Fatalf("p=%d: %v", p, err)
		}
	}
}

// TestAllReduceLLTwoRanks pins the 2-rank LL AllReduce to one round (a
// store, and a load that reduces the peer's input with this rank's as it
// arrives, in rank order) and, in place, to two: the exchange with each
// rank's input read from send (no copy to scratch), then one reduction
// straight into recv (no copy after it). Every local step is an engine
// round's worth of per-call CPU at 8 B.
func TestAllReduceLLTwoRanks(t *testing.T) {
	for _, inPlace := range []bool{false, true} {
		for r := range 2 {
			var s Schedule
			if err := PlanAllReduceLL(&s, CollArgs{Rank: r, World: 2, Bytes: 8, ElemSize: 4, DType: uint8(reduce.Float32), Op: uint8(reduce.Sum),
				Streams: 1, BlockSize: 8, InPlace: inPlace}); err != nil {
				t.Fatal(err)
			}
			for _, st := range s.Steps {
				if st.Kind == StepCopy {
					t.Fatalf("rank %d in place %t: a copy step %v", r, inPlace, st)
				}
			}
			if !inPlace {
				ld := s.Round(0)[1]
				if s.NumRounds() != 1 || ld.Kind != StepLoad || ld.Dst.Buf != BufRecv || ld.With.Buf != BufSend || ld.LandedFirst != (r == 1) {
					t.Fatalf("rank %d: %d rounds, load %v, want one round whose load reduces into recv, landed first on rank 1", r, s.NumRounds(), ld)
				}
				continue
			}
			if s.NumRounds() != 2 {
				t.Fatalf("rank %d in place: %d rounds, want 2", r, s.NumRounds())
			}
			last := s.Round(1)
			if len(last) != 1 || last[0].Kind != StepReduce || last[0].Dst.Buf != BufRecv || last[0].With.Len != 8 {
				t.Fatalf("rank %d in place: last round %v, want one three-operand reduce into recv", r, last)
			}
		}
	}
}
