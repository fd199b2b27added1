package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

// replaceLayer is the workload of the Replace tests: skewed, so that
// Balance has something to even out.
var replaceLayer = layer{experts: 8, k: 2, hidden: 8, tokens: 48, dtype: reduce.Float32, skew: 1.2, seed: 7}

func replaceConfig(l layer, pl *routing.Placement) Config {
	return Config{Experts: l.experts, K: l.k, Hidden: l.hidden, DType: l.dtype, CapacityFactor: l.capacity,
		Placement: pl, Logger: discard}
}

// replaceGroup starts ranks dispatchers of l on the contiguous placement,
// each rank's parameter store holding its experts; rb, when not nil, is
// every rank's Rebalance with its store as the mover.
func replaceGroup(t *testing.T, ranks int, l layer, rb *Rebalance) ([]*Dispatcher, []*paramStore, *routing.Placement) {
	t.Helper()
	return replaceGroupOn(t, startNATS(t), ranks, l, rb)
}

// replaceGroupOn is replaceGroup on the NATS server at url.
func replaceGroupOn(t *testing.T, url string, ranks int, l layer, rb *Rebalance) ([]*Dispatcher, []*paramStore, *routing.Placement) {
	t.Helper()
	comms := group(t, url, ranks, nil)
	pl0, _ := routing.Contiguous(l.experts, ranks)
	stores := make([]*paramStore, ranks)
	for r := range stores {
		stores[r] = newParamStore(pl0, r)
	}
	cfgs := make([]Config, ranks)
	for r := range cfgs {
		cfgs[r] = replaceConfig(l, pl0)
		if rb != nil {
			cfgs[r].Rebalance = *rb
			cfgs[r].Rebalance.Mover = stores[r]
		}
	}
	return newDispatchersOf(t, comms, cfgs), stores, pl0
}

// TestReplace runs verified steps under the contiguous placement, re-places
// the experts twice (a hand-made table with replicas, then Balance of the
// measured load with redundant slots) and runs verified steps after each:
// the experts computed after a move run on parameters that moved, and the
// statistics count the changed slots and the bytes of the copies.
func TestReplace(t *testing.T) {
	const ranks = 4
	l := replaceLayer
	ds, stores, _ := replaceGroup(t, ranks, l, nil)
	pl1, err := routing.FromSlots(l.experts, ranks, []int{0, 1, 7, 0, 2, 3, 0, 4, 5, 1, 6, 7})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	step := 0
	run := func(n int) {
		t.Helper()
		mustAll(t, onAll(ranks, func(r int) error {
			for s := step; s < step+n; s++ {
				if err := replicaStep(ds[r], l, r, s, stores[r]); err != nil {
					return err
				}
			}
			return nil
		}))
		step += n
	}
	replace := func(pl *routing.Placement) {
		t.Helper()
		old := ds[0].Placement()
		wantMoves, wantChanged := planMoves(old, pl, func(int) int { return 0 })
		var wantBytes int64
		for _, mv := range wantMoves {
			wantBytes += int64(8 + len(expertParams(mv.expert)))
		}
		mustAll(t, onAll(ranks, func(r int) error { return ds[r].Replace(ctx, pl, stores[r]) }))
		for r, d := range ds {
			st := d.LastReplace()
			if d.Placement() != pl || st.ChangedSlots != wantChanged || st.Copies != len(wantMoves) || st.GroupBytes != wantBytes {
				t.Errorf("rank %d: placement switched %v, stats %+v, want %d changed slots, %d copies, %d bytes",
					r, d.Placement() == pl, st, wantChanged, len(wantMoves), wantBytes)
			}
			var imports []int
			for _, mv := range wantMoves {
				if mv.to == r {
					imports = append(imports, mv.expert)
				}
			}
			if got := stores[r].imported; !slices.Equal(got, imports) {
				t.Errorf("rank %d imported experts %v, want %v", r, got, imports)
			}
			stores[r].imported = nil
		}
	}
	run(3)
	replace(pl1)
	run(3)
	load := ds[0].Load()
	pl2, err := routing.Balance(load, ranks, ranks, l.experts+4)
	if err != nil {
		t.Fatal(err)
	}
	replace(pl2)
	run(3)
	// Replacing with the placement in force moves nothing.
	replace(pl2)
	if st := ds[0].LastReplace(); st.ChangedSlots != 0 || st.GroupBytes != 0 {
		t.Errorf("replacing with the same placement: %+v, want nothing moved", st)
	}
	run(1)
	if n := ds[1].Replacements(); n != 3 {
		t.Errorf("Replacements %d, want 3", n)
	}
}

// TestRebalanceInDispatch lets Dispatch re-place the experts by itself
// (Config.Rebalance) under a skewed load: every step is verified, the
// experts run on moved parameters, and the estimated rank imbalance falls.
func TestRebalanceInDispatch(t *testing.T) {
	const ranks = 4
	l := replaceLayer
	l.skew = 1.5
	ds, stores, _ := replaceGroup(t, ranks, l, &Rebalance{Every: 4, Threshold: 1.05, Redundant: 4})
	var before float64
	mustAll(t, onAll(ranks, func(r int) error {
		for step := range 10 {
			if step == 4 && r == 0 {
				before = ds[0].rankImbalance(ds[0].Load())
			}
			if err := replicaStep(ds[r], l, r, step, stores[r]); err != nil {
				return err
			}
		}
		return nil
	}))
	after := ds[0].rankImbalance(ds[0].Load())
	for r, d := range ds {
		if d.Replacements() < 1 || d.Placement().Slots() != l.experts+4 {
			t.Errorf("rank %d: %d re-placements, %d slots, want at least one, to %d slots", r, d.Replacements(), d.Placement().Slots(), l.experts+4)
		}
	}
	if !(after < before) {
		t.Errorf("estimated rank imbalance %.3f before the re-placement, %.3f after: want lower", before, after)
	}
}

// TestReplaceRefused: a placement the ranks disagree on, or another
// layer's, is refused on every rank with ErrMismatch; a bad argument on one
// rank fails every rank. The placement stays, and the next step verifies.
func TestReplaceRefused(t *testing.T) {
	const ranks = 3
	l := replaceLayer
	ds, stores, pl0 := replaceGroup(t, ranks, l, nil)
	other, _ := routing.FromSlots(l.experts, ranks, []int{0, 1, 2, 3, 4, 0, 5, 6, 7})
	stranger, _ := routing.Contiguous(l.experts+1, ranks)
	moves, _ := planMoves(pl0, other, func(int) int { return 0 })
	source := moves[0].from
	step := 0
	for _, tc := range []struct {
		name string
		pl   func(r int) *routing.Placement
		m    func(r int) ExpertMover
		want func(r int) error // the error kind rank r must get
	}{
		{"rank 0 differs",
			func(r int) *routing.Placement { return map[bool]*routing.Placement{true: other, false: pl0}[r == 0] }, nil,
			func(int) error { return a2a.ErrMismatch }},
		{"another layer's", func(int) *routing.Placement { return stranger }, nil,
			func(int) error { return a2a.ErrMismatch }},
		{"another layer's on rank 2",
			func(r int) *routing.Placement {
				return map[bool]*routing.Placement{true: stranger, false: other}[r == 2]
			}, nil,
			func(int) error { return a2a.ErrMismatch }},
		{"no mover on rank 1", func(int) *routing.Placement { return other },
			func(r int) ExpertMover {
				if r == 1 {
					return nil
				}
				return stores[r]
			},
			func(r int) error { return map[bool]error{true: a2a.ErrInvalidArgument, false: a2a.ErrAborted}[r == 1] }},
		{"export fails on a source", func(int) *routing.Placement { return other },
			func(r int) ExpertMover {
				if r == source {
					return &paramStore{params: map[int][]byte{}} // holds nothing
				}
				return stores[r]
			},
			func(int) error { return a2a.ErrAborted }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := onAll(ranks, func(r int) error {
				var m ExpertMover = stores[r]
				if tc.m != nil {
					m = tc.m(r)
				}
				return ds[r].Replace(context.Background(), tc.pl(r), m)
			})
			for r, err := range errs {
				if !errors.Is(err, tc.want(r)) {
					t.Errorf("rank %d: %v, want %v", r, err, tc.want(r))
				}
				if ds[r].Placement() != pl0 || ds[r].Replacements() != 0 {
					t.Errorf("rank %d: the placement changed", r)
				}
			}
			mustAll(t, onAll(ranks, func(r int) error { return replicaStep(ds[r], l, r, step, stores[r]) }))
			step++
		})
	}
}

// TestReplaceRankLost loses a rank in the middle of Replace (its Comm
// closes while it exports, or while it imports, after the parameters
// moved): every rank gets a typed error and stays on the old placement.
func TestReplaceRankLost(t *testing.T) {
	const ranks = 4
	l := replaceLayer
	pl0, _ := routing.Contiguous(l.experts, ranks)
	pl1, _ := routing.FromSlots(l.experts, ranks, []int{0, 1, 7, 0, 2, 3, 0, 4, 5, 1, 6, 7})
	moves, _ := planMoves(pl0, pl1, func(int) int { return 0 })
	for _, tc := range []struct {
		name    string
		lost    int // the rank lost
		import_ bool
	}{
		{"while exporting", moves[0].from, false},
		{"while importing", moves[0].to, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds, stores, start := replaceGroup(t, ranks, l, nil)
			lose := func(int) error { ds[tc.lost].comm.Close(); return nil }
			if tc.import_ {
				stores[tc.lost].onImport = lose
			} else {
				stores[tc.lost].onExport = lose
			}
			mustAll(t, onAll(ranks, func(r int) error { return replicaStep(ds[r], l, r, 0, stores[r]) }))
			errs := onAll(ranks, func(r int) error { return ds[r].Replace(context.Background(), pl1, stores[r]) })
			for r, err := range errs {
				typed := errors.Is(err, a2a.ErrPeerLost) || errors.Is(err, a2a.ErrAborted) || (r == tc.lost && errors.Is(err, a2a.ErrClosed))
				if !typed {
					t.Errorf("rank %d: %v, want ErrPeerLost or ErrAborted (ErrClosed on the lost rank)", r, err)
				}
				if ds[r].Placement() != start || ds[r].Replacements() != 0 || ds[r].LastReplace() != (ReplaceStats{}) {
					t.Errorf("rank %d: switched to the new placement after %v", r, err)
				}
				if r != tc.lost && fmt.Sprint(ds[r].LocalExperts()) != fmt.Sprint(pl0.PerRank[r]) {
					t.Errorf("rank %d: local experts %v, want %v", r, ds[r].LocalExperts(), pl0.PerRank[r])
				}
			}
		})
	}
}

// TestPlanMoves: only changed slots count, and only those whose rank lacks
// the expert get a copy, from a holder on the same host when there is one,
// for placements from constructors and assembled by hand.
func TestPlanMoves(t *testing.T) {
	mk := func(experts, ranks int, slots ...int) *routing.Placement {
		pl, err := routing.FromSlots(experts, ranks, slots)
		if err != nil {
			t.Fatal(err)
		}
		return pl
	}
	contiguous, _ := routing.Contiguous(4, 2)
	byHand := &routing.Placement{Experts: 4, Ranks: 2, Owner: []int{0, 0, 1, 1}, Local: []int{0, 1, 0, 1},
		PerRank: [][]int{{0, 1}, {2, 3}}}
	oneHost := func(int) int { return 0 }
	for _, tc := range []struct {
		name     string
		from, to *routing.Placement
		host     func(int) int
		changed  int
		moves    []move
	}{
		{"same", contiguous, contiguous, oneHost, 0, nil},
		{"swap two", contiguous, mk(4, 2, 0, 2, 1, 3), oneHost, 2,
			[]move{{expert: 2, from: 1, to: 0}, {expert: 1, from: 0, to: 1}}},
		{"by hand, a slot more per rank", byHand, mk(4, 2, 0, 1, 2, 2, 3, 0), oneHost, 2,
			[]move{{expert: 2, from: 1, to: 0}, {expert: 0, from: 0, to: 1}}},
		{"reordered on its rank", contiguous, mk(4, 2, 1, 0, 2, 3), oneHost, 2, nil},
		{"copy from the same host", mk(4, 4, 0, 1, 0, 2, 3, 1, 3, 2), mk(4, 4, 2, 1, 0, 2, 3, 0, 1, 3),
			// Expert 1 reaches rank 3 from rank 2, on its host, not from rank 0;
			// expert 0 has no holder on rank 2's host. Rank 3 holds expert 3
			// already: its changed slot moves nothing.
			func(r int) int { return r / 2 }, 4,
			[]move{{expert: 2, from: 1, to: 0}, {expert: 0, from: 0, to: 2}, {expert: 1, from: 2, to: 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			moves, changed := planMoves(tc.from, tc.to, tc.host)
			if changed != tc.changed || !slices.Equal(moves, tc.moves) {
				t.Errorf("planMoves: %v, %d changed; want %v, %d", moves, changed, tc.moves, tc.changed)
			}
		})
	}
}

// TestReplaceBetweenSteps: Replace refuses to run while a step is in
// flight (dispatched, not combined), without touching the Comm, and runs
// once the step is combined.
func TestReplaceBetweenSteps(t *testing.T) {
	const ranks = 2
	l := replaceLayer
	ds, stores, pl0 := replaceGroup(t, ranks, l, nil)
	pl1, _ := routing.FromSlots(l.experts, ranks, []int{0, 1, 2, 3, 7, 4, 5, 6, 7, 0})
	ctx := context.Background()
	mustAll(t, onAll(ranks, func(r int) error {
		tok := l.tokenRows(r, 0)
		h, err := ds[r].Dispatch(ctx, tok, l.decision(r, 0))
		if err != nil {
			return err
		}
		if err := ds[r].Replace(ctx, pl1, stores[r]); !errors.Is(err, a2a.ErrInvalidArgument) || ds[r].Placement() != pl0 {
			return fmt.Errorf("Replace with a step in flight: %v, want ErrInvalidArgument and no switch", err)
		}
		runExperts(h, l.dtype, l.hidden, h.Output())
		out := make([]byte, len(tok))
		if err := ds[r].Combine(ctx, h, h.Output(), out); err != nil {
			return err
		}
		if err := checkCombined(l, r, 0, out); err != nil {
			return err
		}
		if err := ds[r].Replace(ctx, pl1, stores[r]); err != nil {
			return fmt.Errorf("Replace after the combine (handle not yet released): %w", err)
		}
		h.Release()
		return replicaStep(ds[r], l, r, 1, stores[r])
	}))
}

// TestReplaceLostInVote loses a rank in Replace's vote (its Comm closes)
// after it sent its vote to none, one, two or all three of its peers, for
// every rank of four, so that some survivors heard every vote and switched
// while others did not. Every survivor ends Replace switched with no error
// (its next step then fails with a typed error) or on the old placement with
// a typed error; after Shrink and Settle they all report the same
// Placement(), the dispatcher built on its Shrink starts, and a step on it
// verifies.
func TestReplaceLostInVote(t *testing.T) {
	const ranks = 4
	l := replaceLayer
	url := startNATS(t)
	pl1, _ := routing.FromSlots(l.experts, ranks, []int{0, 1, 7, 0, 2, 3, 0, 4, 5, 1, 6, 7})
	var mixed, forward, kept atomic.Int32
	for lost := range ranks {
		for sent := range ranks {
			t.Run(fmt.Sprintf("rank %d after %d votes", lost, sent), func(t *testing.T) {
				ds, stores, pl0 := replaceGroupOn(t, url, ranks, l, nil)
				ds[lost].replicas.voteSent = func(n int) {
					if n == sent {
						ds[lost].comm.Close()
					}
				}
				mustAll(t, onAll(ranks, func(r int) error { return replicaStep(ds[r], l, r, 0, stores[r]) }))
				errs := onAll(ranks, func(r int) error { return ds[r].Replace(context.Background(), pl1, stores[r]) })
				// The survivors' Comm after the loss. A closed Comm is a
				// peer that left, which does not abort the others as a
				// killed one does, so there is nothing to Shrink: the
				// survivors join a group of their own in their old order
				// (TestDemoKilledInVote kills a process and shrinks).
				var survivors []int
				switched := 0
				for r, err := range errs {
					if r != lost {
						survivors = append(survivors, r)
						if err == nil {
							switched++
						}
					}
				}
				mustAll(t, onAll(ranks, func(r int) error {
					if r == lost {
						return nil
					}
					return checkLostInVote(ds[r], errs[r], pl0, pl1, l, r)
				}))
				shrunk := group(t, url, ranks-1, nil)
				mustAll(t, onAll(ranks-1, func(i int) error { return ds[survivors[i]].Settle(context.Background(), shrunk[i]) }))
				var want *routing.Placement
				for r, d := range ds {
					if r == lost {
						continue
					}
					if want == nil {
						want = d.Placement()
					}
					if d.Placement() != want {
						t.Errorf("rank %d settled on another placement than the other survivors (the new one: %v)", r, d.Placement() == pl1)
					}
				}
				if switched > 0 && switched < ranks-1 {
					mixed.Add(1)
				}
				if want == pl1 {
					forward.Add(1)
				} else {
					kept.Add(1)
				}
				if !t.Failed() {
					shrunkStep(t, shrunk, survivors, l, want)
				}
			})
		}
	}
	t.Logf("%d of %d runs left some survivors switched and others not before Settle; settled on the new placement %d times, the old %d",
		mixed.Load(), ranks*ranks, forward.Load(), kept.Load())
	if mixed.Load() == 0 {
		t.Errorf("no run lost the rank with its vote heard by some survivors only: the window was not exercised")
	}
}

// checkLostInVote checks a survivor's Replace outcome err: switched with no
// error, the loss then failing its next step, or a typed error and no
// switch. It closes the dispatcher, as the demo does before it shrinks:
// Settle works on a closed one.
func checkLostInVote(d *Dispatcher, err error, pl0, pl1 *routing.Placement, l layer, r int) error {
	defer d.Close()
	switch {
	case err == nil && d.Placement() != pl1:
		return fmt.Errorf("Replace succeeded without switching")
	case err == nil:
		if err := replicaStep(d, l, r, 1, nil); !errors.Is(err, a2a.ErrPeerLost) {
			return fmt.Errorf("the step after the loss: %v, want ErrPeerLost", err)
		}
	case !errors.Is(err, a2a.ErrPeerLost) && !errors.Is(err, a2a.ErrAborted):
		return fmt.Errorf("Replace: %v, want ErrPeerLost or ErrAborted", err)
	case d.Placement() != pl0:
		return fmt.Errorf("Replace failed (%v) and switched", err)
	}
	return nil
}

// shrunkStep builds the dispatchers of the survivors' Comms (survivors
// their old ranks) on pl's Shrink,
// each rank with the parameters of its experts (as from a checkpoint), and
// runs a verified step on them.
func shrunkStep(t *testing.T, comms []*a2a.Comm, survivors []int, l layer, pl *routing.Placement) {
	t.Helper()
	spl, err := pl.Shrink(survivors)
	if err != nil {
		t.Fatal(err)
	}
	cfgs, stores := make([]Config, len(comms)), make([]*paramStore, len(comms))
	for r := range comms {
		cfgs[r], stores[r] = replaceConfig(l, spl), newParamStore(spl, r)
	}
	ds := newDispatchersOf(t, comms, cfgs)
	mustAll(t, onAll(len(comms), func(r int) error { return replicaStep(ds[r], l, r, 2, stores[r]) }))
}

// TestSettle: with no Replace interrupted Settle changes nothing; a rank in
// doubt of a placement no survivor switched to stays where it is; and
// survivors on placements that no doubt links fail with ErrMismatch.
func TestSettle(t *testing.T) {
	const ranks = 3
	l := replaceLayer
	url := startNATS(t)
	ds, _, pl0 := replaceGroupOn(t, url, ranks, l, nil)
	other, _ := routing.FromSlots(l.experts, ranks, []int{0, 1, 2, 3, 4, 0, 5, 6, 7})
	settle := func() []error {
		c := group(t, url, ranks, nil)
		return onAll(ranks, func(r int) error { return ds[r].Settle(context.Background(), c[r]) })
	}
	mustAll(t, settle())
	ds[1].replicas.doubt = &doubt{pl: other}
	mustAll(t, settle())
	for r, d := range ds {
		if d.Placement() != pl0 || d.replicas.doubt != nil || d.Replacements() != 0 {
			t.Errorf("rank %d: switched %v, in doubt %v, after a Settle no survivor switched in", r, d.Placement() != pl0, d.replicas.doubt != nil)
		}
	}
	ds[0].switchTo(other)
	for r, err := range settle() {
		if !errors.Is(err, a2a.ErrMismatch) {
			t.Errorf("rank %d: Settle of unrelated placements: %v, want ErrMismatch", r, err)
		}
	}
}
