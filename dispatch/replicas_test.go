package dispatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

// refSlot is the slot rank r's token t goes to for expert e, by the rule the
// package documents: the replica on r, else the replicas on r's host, else
// all, spread by (t+r) mod their number.
func refSlot(pl *routing.Placement, hosts []int, r, t, e int) int {
	spr := pl.SlotsPerRank()
	var near, all []int
	for _, s := range pl.Replicas(e) {
		if s/spr == r {
			return s
		}
		all = append(all, s)
		if hosts[s/spr] == hosts[r] {
			near = append(near, s)
		}
	}
	if len(near) > 0 {
		all = near
	}
	return all[(t+r)%len(all)]
}

// filledSlots lists rank r's slots that hold an expert.
func filledSlots(pl *routing.Placement, r int) []int {
	spr := pl.SlotsPerRank()
	var out []int
	for s := r * spr; s < (r+1)*spr; s++ {
		if pl.SlotExpert(s) != routing.EmptySlot {
			out = append(out, s)
		}
	}
	return out
}

// checkReceivedReplicas verifies that h holds, for every local slot and
// source rank, exactly the rows of that rank's tokens whose assignment chose
// that slot's replica, in token order.
func checkReceivedReplicas(l layer, r, step int, pl *routing.Placement, hosts []int, h *Handle) error {
	rb := l.hidden * l.dtype.Size()
	slots := filledSlots(pl, r)
	if h.LocalExperts() != len(slots) {
		return fmt.Errorf("%d local slots, want %d", h.LocalExperts(), len(slots))
	}
	total := 0
	for li, s := range slots {
		e := pl.SlotExpert(s)
		if h.Expert(li) != e {
			return fmt.Errorf("local slot %d holds expert %d, want %d", li, h.Expert(li), e)
		}
		for src, seg := range h.Segments(li) {
			dec, want := l.dispatched(src, step), l.tokenRows(src, step)
			n := 0
			for a, x := range dec.Expert {
				t := a / dec.K
				if int(x) != e || refSlot(pl, hosts, src, t, e) != s {
					continue
				}
				if n >= seg.Rows {
					return fmt.Errorf("slot %d (expert %d) from rank %d: %d rows, want more", s, e, src, seg.Rows)
				}
				if got := h.Recv()[seg.Offset+n*rb : seg.Offset+(n+1)*rb]; !bytes.Equal(got, want[t*rb:(t+1)*rb]) {
					return fmt.Errorf("slot %d (expert %d) from rank %d row %d: not token %d's row", s, e, src, n, t)
				}
				n++
			}
			if n != seg.Rows {
				return fmt.Errorf("slot %d (expert %d) from rank %d: %d rows, want %d", s, e, src, seg.Rows, n)
			}
			total += n
		}
	}
	if h.Rows() != total {
		return fmt.Errorf("Rows %d, want %d", h.Rows(), total)
	}
	return nil
}

// hostsOf returns the host ordinal of every rank of c's group.
func hostsOf(c *a2a.Comm) []int {
	hosts := make([]int, c.Size())
	for r := range hosts {
		hosts[r] = c.Host(r)
	}
	return hosts
}

// replicaStep runs one verified step on rank r: the rows each slot got, the
// combined outputs, and that the experts computed from the parameters
// store holds (when not nil) for them.
func replicaStep(d *Dispatcher, l layer, r, step int, store *paramStore) error {
	ctx := context.Background()
	tok := l.tokenRows(r, step)
	h, err := d.Dispatch(ctx, tok, l.decision(r, step))
	if err != nil {
		return fmt.Errorf("step %d: %w", step, err)
	}
	defer h.Release()
	if err := checkReceivedReplicas(l, r, step, d.Placement(), hostsOf(d.comm), h); err != nil {
		return fmt.Errorf("step %d: received: %w", step, err)
	}
	if store != nil {
		for li := range h.LocalExperts() {
			if err := store.check(h.Expert(li)); err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
		}
	}
	runExperts(h, l.dtype, l.hidden, h.Output())
	out := make([]byte, len(tok))
	if err := d.Combine(ctx, h, h.Output(), out); err != nil {
		return fmt.Errorf("step %d: combine: %w", step, err)
	}
	if err := checkCombined(l, r, step, out); err != nil {
		return fmt.Errorf("step %d: combined: %w", step, err)
	}
	return nil
}

// groupRows is the group's kept rows per expert at step, as Load sums them.
func groupRows(l layer, ranks, step int) []int {
	rows := make([]int, l.experts)
	for r := range ranks {
		for _, e := range l.dispatched(r, step).Expert {
			if e != routing.Dropped {
				rows[e]++
			}
		}
	}
	return rows
}

// TestReplicaDispatch dispatches over placements with replicas, on one host
// and on two (faked with Config.Host), with every row and combined element
// checked, and checks that Load is the same on every rank and is the moving
// average of the group's rows.
func TestReplicaDispatch(t *testing.T) {
	l8 := layer{experts: 8, k: 2, hidden: 8, tokens: 40, dtype: reduce.Float32, skew: 1.2, seed: 3}
	cases := []struct {
		name        string
		ranks, host int // ranks per host
		l           layer
		slots       []int // FromSlots table; nil: Balance with extra slots
		extra       int
		counts      CountsMode
		rows        RowPath
	}{
		{name: "4ranks/1host/inband", ranks: 4, host: 4, l: l8,
			slots: []int{0, 1, 2, 0, 3, 4, 0, 5, 6, 1, 7, routing.EmptySlot}},
		{name: "4ranks/2hosts/nats/bf16", ranks: 4, host: 2, counts: CountsNATS,
			l:     layer{experts: 8, k: 3, hidden: 6, tokens: 33, dtype: reduce.BFloat16, skew: 1, capacity: 1.5, seed: 4},
			slots: []int{0, 1, 2, 3, 0, 4, 5, 1, 0, 6, 7, 2}},
		{name: "3ranks/alltoallv/balance", ranks: 3, host: 3, l: l8, rows: RowsAllToAllV, extra: 4},
		{name: "4ranks/2hosts/balance/drops", ranks: 4, host: 2, extra: 8,
			l: layer{experts: 12, k: 2, hidden: 5, tokens: 50, dtype: reduce.Float32, skew: 1.5, capacity: 1.25, preDrop: true, seed: 5}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			comms := group(t, startNATS(t), tc.ranks, func(c *a2a.Config) { c.Host = fmt.Sprintf("host%d", c.Rank/tc.host) })
			var pl *routing.Placement
			var err error
			if tc.slots != nil {
				pl, err = routing.FromSlots(tc.l.experts, tc.ranks, tc.slots)
			} else {
				load := make([]float64, tc.l.experts)
				for e := range load {
					load[e] = 100 / float64(e+1)
				}
				pl, err = routing.Balance(load, tc.ranks, tc.host, tc.l.experts+tc.extra)
			}
			if err != nil {
				t.Fatal(err)
			}
			ds := newDispatchers(t, comms, Config{Experts: tc.l.experts, K: tc.l.k, Hidden: tc.l.hidden, DType: tc.l.dtype,
				CapacityFactor: tc.l.capacity, Placement: pl, Counts: tc.counts, Rows: tc.rows, Logger: discard})
			const steps = 4
			mustAll(t, onAll(tc.ranks, func(r int) error {
				for step := range steps {
					if err := replicaStep(ds[r], tc.l, r, step, nil); err != nil {
						return err
					}
				}
				return nil
			}))
			// The estimate trails by one dispatch: steps 0..steps-2.
			want := make([]float64, tc.l.experts)
			for step := range steps - 1 {
				for e, n := range groupRows(tc.l, tc.ranks, step) {
					if step == 0 {
						want[e] = float64(n)
					} else {
						want[e] = LoadDecay*float64(n) + (1-LoadDecay)*want[e]
					}
				}
			}
			for r, d := range ds {
				if got := d.Load(); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("rank %d: Load %v, want %v", r, got, want)
				}
			}
		})
	}
}

// paramStore is one rank's expert parameters, the ExpertMover of the tests:
// expert e's parameters are expertParams(e), and a rank starts with those of
// the experts it hosts only, so an expert it computes later must have moved.
type paramStore struct {
	mu       sync.Mutex
	params   map[int][]byte
	imported []int
	// onExport and onImport, when set, run first (the tests lose a rank there).
	onExport, onImport func(e int) error
}

func expertParams(e int) []byte {
	b := make([]byte, 40+8*e)
	for i := range b {
		b[i] = byte(e*31 + i*7)
	}
	return b
}

func newParamStore(pl *routing.Placement, r int) *paramStore {
	s := &paramStore{params: map[int][]byte{}}
	for _, slot := range filledSlots(pl, r) {
		e := pl.SlotExpert(slot)
		s.params[e] = expertParams(e)
	}
	return s
}

func (s *paramStore) Export(e int) ([]byte, error) {
	if s.onExport != nil {
		if err := s.onExport(e); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.params[e]
	if !ok {
		return nil, fmt.Errorf("export of expert %d, which this rank does not hold", e)
	}
	return p, nil
}

func (s *paramStore) Import(e int, p []byte) error {
	if s.onImport != nil {
		if err := s.onImport(e); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.params[e]; ok {
		return fmt.Errorf("import of expert %d, which this rank holds already", e)
	}
	s.params[e] = bytes.Clone(p)
	s.imported = append(s.imported, e)
	return nil
}

// check fails unless the store holds expert e's true parameters.
func (s *paramStore) check(e int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.params[e]
	switch {
	case !ok:
		return fmt.Errorf("expert %d computed here without its parameters", e)
	case !bytes.Equal(p, expertParams(e)):
		return fmt.Errorf("expert %d's parameters arrived corrupted", e)
	}
	return nil
}

// TestNewRefusesDifferentLayouts: ranks whose placements have the same
// primaries (Owner) but different replicas, or whose Rebalance settings
// differ, fail New with ErrMismatch: both change where rows go.
func TestNewRefusesDifferentLayouts(t *testing.T) {
	const ranks = 2
	l := replaceLayer
	a, errA := routing.FromSlots(l.experts, ranks, []int{0, 1, 2, 3, 4, 5, 6, 7, 0, 1})
	b, errB := routing.FromSlots(l.experts, ranks, []int{0, 1, 2, 3, 4, 5, 6, 7, 0, 2})
	if err := errors.Join(errA, errB); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(a.Owner) != fmt.Sprint(b.Owner) {
		t.Fatalf("the two placements differ in their primaries: %v, %v", a.Owner, b.Owner)
	}
	mover := &paramStore{params: map[int][]byte{}}
	for _, tc := range []struct {
		name string
		cfg  func(r int) Config
	}{
		{"replicas", func(r int) Config { return replaceConfig(l, map[bool]*routing.Placement{true: a, false: b}[r == 0]) }},
		{"rebalance", func(r int) Config {
			cfg := replaceConfig(l, a)
			cfg.Rebalance = Rebalance{Every: 10 + r, Redundant: 2, Mover: mover}
			return cfg
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := group(t, startNATS(t), ranks, nil)
			errs := onAll(ranks, func(r int) error {
				d, err := New(context.Background(), comms[r], tc.cfg(r))
				if err == nil {
					d.Close()
				}
				return err
			})
			for r, err := range errs {
				if !errors.Is(err, a2a.ErrMismatch) {
					t.Errorf("rank %d: %v, want ErrMismatch", r, err)
				}
			}
		})
	}
}
