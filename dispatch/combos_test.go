package dispatch

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

// comboWire is the wire-format dimension of TestModeCombinations.
type comboWire struct {
	name string
	wire WireFormat
	keep bool
}

// comboModes are the ways a step is driven: Dispatch/Combine, their Async
// forms, and the split DispatchSend/CombineSend (Async outside the decode
// mode). Each is followed by Wait.
var comboModes = []string{"sync", "async", "split"}

// TestModeCombinations is issue 19's table: FP8 {off, on, kept} x hierarchy
// {off, on} x decode {off, MaxTokens} x {sync, async, split} x capacity
// {unlimited, 1.0 with drops}, on one host (3 ranks) and on 2 fake hosts of
// 2 ranks. Every received row is checked (in its dtype exactly, in FP8
// within |x|/16 plus half its block's smallest subnormal step, or the kept
// FP8 bytes and scales exactly) and every combined element within its bound
// (the relay path's: one rounding per host's partial sum). Capacity 1.0
// must drop assignments. The hierarchy on one host, or with the decode
// mode, is refused with ErrInvalidArgument at New on every rank, and the
// Comm stays usable. One group per placement; each valid configuration
// runs two steps per mode on one dispatcher, so the decode mode reuses
// both buffer sets.
func TestModeCombinations(t *testing.T) {
	wires := []comboWire{{"same", WireSame, false}, {"fp8", WireFP8, false}, {"fp8-keep", WireFP8, true}}
	placements := []struct {
		name   string
		ranks  int
		hostOf func(int) int
	}{
		{"host1", 3, func(int) int { return 0 }},
		{"hosts2x2", 4, func(r int) int { return r / 2 }},
	}
	url := startNATS(t)
	for pi, p := range placements {
		comms := group(t, url, p.ranks, fakeHosts(p.hostOf))
		for wi, w := range wires {
			for _, hier := range []bool{false, true} {
				for _, decode := range []bool{false, true} {
					for ci, capacity := range []float64{0, 1} {
						name := fmt.Sprintf("%s/%s/hier=%v/decode=%v/capacity=%v", p.name, w.name, hier, decode, capacity)
						t.Run(name, func(t *testing.T) {
							l := layer{experts: 8, k: 3, hidden: 136, tokens: 10, dtype: reduce.BFloat16, capacity: capacity,
								seed: uint64(1900 + 100*pi + 10*wi + ci)}
							if capacity > 0 {
								l.skew = 1.5
							}
							if w.wire == WireFP8 {
								l.values = fp8Value
							}
							cfg := Config{Experts: l.experts, K: l.k, Hidden: l.hidden, DType: l.dtype, CapacityFactor: capacity,
								Wire: w.wire, KeepFP8: w.keep, Hierarchy: HierarchyOff, Logger: discard}
							if hier {
								cfg.Hierarchy = HierarchyOn
							}
							if decode {
								cfg.MaxTokens = l.tokens + 4
							}
							if hier && (decode || p.ranks == 3) {
								refused(t, comms, cfg)
								return
							}
							hostOf := func(int) int { return 0 } // the flat path sums once
							if hier {
								hostOf = p.hostOf
							}
							comboRun(t, comms, cfg, dispatchCase{ranks: p.ranks, l: l}, w, hostOf)
						})
					}
				}
			}
		}
	}
}

// refused asserts that New fails with ErrInvalidArgument on every rank and
// that the Comm then still runs a collective.
func refused(t *testing.T, comms []*a2a.Comm, cfg Config) {
	mustAll(t, onAll(len(comms), func(r int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		d, err := New(ctx, comms[r], cfg)
		if !errors.Is(err, a2a.ErrInvalidArgument) {
			if d != nil {
				d.Close()
			}
			return fmt.Errorf("New: %v, want ErrInvalidArgument", err)
		}
		return comms[r].Barrier(ctx)
	}))
}

// comboRun runs two verified steps per mode on one set of dispatchers.
func comboRun(t *testing.T, comms []*a2a.Comm, cfg Config, c dispatchCase, w comboWire, hostOf func(int) int) {
	ds := newDispatchers(t, comms, cfg)
	pl := c.placement(t)
	if got := ds[0].Hierarchical(); got != (cfg.Hierarchy == HierarchyOn) {
		t.Fatalf("Hierarchical() = %v with %v", got, cfg.Hierarchy)
	}
	if got := ds[0].DecodeMode(); got != (cfg.MaxTokens > 0) {
		t.Fatalf("DecodeMode() = %v with MaxTokens %d", got, cfg.MaxTokens)
	}
	dropped := make([]int, c.ranks)
	mustAll(t, onAll(c.ranks, func(r int) error {
		for mi, mode := range comboModes {
			for i := range 2 {
				step := 2*mi + i
				n, err := comboStep(ds[r], c, pl, r, step, w, mode, hostOf)
				if err != nil {
					return fmt.Errorf("%s step %d: %w", mode, step, err)
				}
				dropped[r] += n
			}
		}
		return nil
	}))
	total := 0
	for _, n := range dropped {
		total += n
	}
	if c.l.capacity > 0 && total == 0 {
		t.Errorf("capacity %v dropped no assignment", c.l.capacity)
	}
	if c.l.capacity == 0 && total != 0 {
		t.Errorf("unlimited capacity dropped %d assignments", total)
	}
}

// comboStep is one verified step of rank r in mode; it returns the
// assignments dropped over capacity.
func comboStep(d *Dispatcher, c dispatchCase, pl *routing.Placement, r, step int, w comboWire, mode string, hostOf func(int) int) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := c.l
	tokens := l.tokenRows(r, step)
	dispatch, combine := d.Dispatch, d.Combine
	switch mode {
	case "async":
		dispatch, combine = d.DispatchAsync, d.CombineAsync
	case "split":
		dispatch, combine = d.DispatchSend, d.CombineSend
	}
	h, err := dispatch(ctx, tokens, l.decision(r, step))
	if err != nil {
		return 0, err
	}
	defer h.Release()
	if err := h.Wait(); err != nil {
		return 0, err
	}
	switch {
	case w.keep && d.DecodeMode():
		// Recv holds the decode mode's blocks with room between them.
		err = checkDecodeFP8(l, r, step, c.ranks, pl, h, true)
	case w.wire == WireFP8:
		err = checkFP8Received(l, r, step, c.ranks, pl, h, w.keep)
	default:
		err = checkReceived(l, r, step, c.ranks, pl, h)
	}
	if err != nil {
		return 0, fmt.Errorf("received rows: %w", err)
	}
	if err := comboExperts(h, l, w.keep); err != nil {
		return 0, err
	}
	if err := combine(ctx, h, h.Output(), tokens); err != nil {
		return 0, err
	}
	if err := h.Wait(); err != nil {
		return 0, err
	}
	if err := checkHierCombined(l, r, step, tokens, w.wire, pl, hostOf); err != nil {
		return 0, fmt.Errorf("combined output: %w", err)
	}
	return h.Stats().Dropped, nil
}

// comboExperts runs the experts into Output, segment by segment (the
// decode mode's Recv has room between blocks): on the rows in DType, or with
// keep on the FP8 rows dequantized and rounded to DType, as an FP8 expert
// would read them.
func comboExperts(h *Handle, l layer, keep bool) error {
	H, dt := l.hidden, l.dtype
	S := reduce.E4M3Scales(H)
	out, f := h.Output(), make([]float32, H)
	for li := range h.LocalExperts() {
		e := h.Expert(li)
		for _, seg := range h.Segments(li) {
			for n := range seg.Rows {
				row := seg.Offset/(H*dt.Size()) + n
				if keep {
					if err := reduce.DequantizeE4M3(f, h.Recv()[row*H:(row+1)*H], h.Scales()[row*S:(row+1)*S]); err != nil {
						return err
					}
				} else {
					for j := range H {
						f[j] = getElem(dt, h.Recv(), row*H+j)
					}
				}
				for j := range H {
					putElem(dt, out, row*H+j, expertFn(e, roundTo(dt, f[j])))
				}
			}
		}
	}
	return nil
}
