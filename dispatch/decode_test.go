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

// decodeCase is one decode-mode layer run for a few steps.
type decodeCase struct {
	name    string
	l       layer
	owner   []int
	outputs outputsAt
	fp8     bool
	keep    bool
	split   bool // DispatchSend/CombineSend and Wait instead of Dispatch/Combine
}

// TestDecodeMode runs the decode mode through the verified dispatch tests:
// every received row and every combined element checked against the
// reference, over shared memory on one host, over AllToAllV's transport
// (RowsAllToAllV: point-to-point messages), and both at once on two fake
// hosts; with capacity and drops, FP8 wire (dequantized and kept), uneven
// placements, the three places outputs are written, and the split form.
// Five steps each, so that both buffer sets are reused.
func TestDecodeMode(t *testing.T) {
	transports := []struct {
		name  string
		ranks int
		mod   func(*a2a.Config)
		rows  RowPath
	}{
		{name: "shm", ranks: 3},
		{name: "p2p", ranks: 3, rows: RowsAllToAllV},
		{name: "hosts2", ranks: 4, mod: func(c *a2a.Config) { c.Host = fmt.Sprintf("host%d", c.Rank%2) }},
	}
	cases := []decodeCase{
		{name: "bf16/capacity/skew", l: layer{experts: 8, k: 2, hidden: 12, tokens: 20, dtype: reduce.BFloat16, capacity: 1, skew: 1.2}},
		{name: "f32/k3/drops/split", split: true,
			l: layer{experts: 7, k: 3, hidden: 9, tokens: 30, dtype: reduce.Float32, capacity: 0.8, skew: 0.8, preDrop: true}},
		{name: "f16/uneven/in-place", outputs: inRecv, owner: []int{0, 0, 0, 2, 2, 1, 0},
			l: layer{experts: 7, k: 2, hidden: 6, tokens: 16, dtype: reduce.Float16, skew: 1.5}},
		{name: "f32/own-buffer/empty", outputs: inOwnBuffer, l: layer{experts: 4, k: 2, hidden: 3, tokens: 0, dtype: reduce.Float32}},
		{name: "bf16/fp8/capacity/split", fp8: true, split: true,
			l: layer{experts: 7, k: 2, hidden: 300, tokens: 24, dtype: reduce.BFloat16, capacity: 1.1, skew: 1.5}},
		{name: "f32/fp8/keep", fp8: true, keep: true,
			l: layer{experts: 5, k: 2, hidden: 260, tokens: 20, dtype: reduce.Float32, capacity: 1.25, skew: 1}},
	}
	url := startNATS(t)
	for ti, tr := range transports {
		comms := group(t, url, tr.ranks, tr.mod)
		for ci, c := range cases {
			if c.owner != nil && tr.ranks != 3 {
				continue
			}
			t.Run(tr.name+"/"+c.name, func(t *testing.T) {
				c.l.seed = uint64(500 + 10*ti + ci)
				if c.fp8 {
					c.l.values = fp8Value
				}
				dc := dispatchCase{ranks: tr.ranks, l: c.l, owner: c.owner, outputs: c.outputs, rows: tr.rows}
				pl := dc.placement(t)
				cfg := Config{Experts: c.l.experts, K: c.l.k, Hidden: c.l.hidden, DType: c.l.dtype,
					CapacityFactor: c.l.capacity, Placement: pl, Rows: tr.rows, MaxTokens: c.l.tokens + 4, Logger: discard}
				if c.fp8 {
					cfg.Wire, cfg.KeepFP8 = WireFP8, c.keep
				}
				ds := newDispatchers(t, comms, cfg)
				mustAll(t, onAll(tr.ranks, func(r int) error {
					if !ds[r].DecodeMode() {
						return errors.New("DecodeMode() false with MaxTokens set")
					}
					// Each transport exercises the path it names: flags in
					// shared memory, point-to-point blocks, or both.
					if shm, p2p := ds[r].SharedMemory(), ds[r].UsesAllToAllV(); shm != (tr.name != "p2p") || p2p != (tr.name != "shm") {
						return fmt.Errorf("shared memory %v, point to point %v on %s", shm, p2p, tr.name)
					}
					for step := range 5 {
						if err := decodeStep(ds[r], dc, c, pl, r, step); err != nil {
							return fmt.Errorf("step %d: %w", step, err)
						}
					}
					return nil
				}))
			})
		}
	}
}

// decodeStep is one verified step of rank r in the decode mode.
func decodeStep(d *Dispatcher, dc dispatchCase, c decodeCase, pl *routing.Placement, r, step int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := dc.l
	tokens := l.tokenRows(r, step)
	dispatch, combine := d.Dispatch, d.Combine
	if c.split {
		dispatch, combine = d.DispatchSend, d.CombineSend
	}
	h, err := dispatch(ctx, tokens, l.decision(r, step))
	if err != nil {
		return err
	}
	defer h.Release()
	if err := h.Wait(); err != nil {
		return err
	}
	if c.fp8 {
		if err := checkDecodeFP8(l, r, step, dc.ranks, pl, h, c.keep); err != nil {
			return fmt.Errorf("received rows: %w", err)
		}
		return combineFP8(ctx, d, combine, h, l, r, step, tokens, c.keep)
	}
	if err := checkReceived(l, r, step, dc.ranks, pl, h); err != nil {
		return fmt.Errorf("received rows: %w", err)
	}
	if err := checkStats(l, r, step, h); err != nil {
		return err
	}
	var outputs []byte
	switch dc.outputs {
	case inOutput:
		outputs = h.Output()
	case inRecv:
		outputs = h.Recv()
	case inOwnBuffer:
		outputs = make([]byte, len(h.Recv()))
	}
	runExperts(h, l.dtype, l.hidden, outputs)
	if err := combine(ctx, h, outputs, tokens); err != nil {
		return err
	}
	if err := h.Wait(); err != nil {
		return err
	}
	if err := checkCombined(l, r, step, tokens); err != nil {
		return fmt.Errorf("combined output: %w", err)
	}
	if h.Stats().CombineTime <= 0 {
		return fmt.Errorf("combine time %v", h.Stats().CombineTime)
	}
	return nil
}

// checkDecodeFP8 checks the received rows of an FP8 step: as TestFP8Wire
// does, but row by row through the segments, since the decode mode's Recv
// holds its blocks at fixed places with room between them.
func checkDecodeFP8(l layer, r, step, size int, pl *routing.Placement, h *Handle, keep bool) error {
	H, dt := l.hidden, l.dtype
	S := reduce.E4M3Scales(H)
	rows := len(h.Output()) / (H * dt.Size())
	if keep && (len(h.Recv()) != rows*H || len(h.Scales()) != rows*S) {
		return fmt.Errorf("KeepFP8: Recv %d bytes, Scales %d, want %d and %d", len(h.Recv()), len(h.Scales()), rows*H, rows*S)
	}
	return walkReceived(l, r, step, size, pl, h, func(src, t int, seg Segment, n int) error {
		ref, err := fp8Row(l, src, step, t)
		if err != nil {
			return err
		}
		row := seg.Offset/(H*dt.Size()) + n
		if keep {
			return checkKeptFP8Row(h, row, t, ref)
		}
		for j, x := range ref.deq {
			if got := getElem(dt, h.Recv(), row*H+j); got != roundTo(dt, x) {
				return fmt.Errorf("token %d element %d: got %v, want %v", t, j, got, roundTo(dt, x))
			}
		}
		return nil
	})
}

// combineFP8 runs the experts on the dequantized rows of an FP8 step,
// combines and checks every combined element.
func combineFP8(ctx context.Context, d *Dispatcher, combine func(context.Context, *Handle, []byte, []byte) error,
	h *Handle, l layer, r, step int, tokens []byte, keep bool) error {
	dt := l.dtype
	if err := comboExperts(h, l, keep); err != nil {
		return err
	}
	if err := combine(ctx, h, h.Output(), tokens); err != nil {
		return err
	}
	if err := h.Wait(); err != nil {
		return err
	}
	deq := map[int][]float32{}
	return checkCombinedOf(l, r, step, tokens, func(e, t, j int) float32 {
		if deq[t] == nil {
			ref, err := fp8Row(l, r, step, t)
			if err != nil {
				panic(err)
			}
			deq[t] = ref.deq
		}
		return roundTo(dt, expertFn(e, roundTo(dt, deq[t][j])))
	})
}

// TestDecodeMicroBatches overlaps two micro-batches on one goroutine with
// the split form: both dispatches are sent before either is waited for, and
// micro-batch 0's combine is sent before micro-batch 1's experts run. Every
// row and output verified, for shared memory and point-to-point.
func TestDecodeMicroBatches(t *testing.T) {
	const ranks = 3
	url := startNATS(t)
	comms := group(t, url, ranks, nil)
	for _, rows := range []RowPath{RowsAuto, RowsAllToAllV} {
		t.Run(rows.String(), func(t *testing.T) {
			c := dispatchCase{ranks: ranks, rows: rows,
				l: layer{experts: 6, k: 2, hidden: 8, tokens: 24, dtype: reduce.BFloat16, capacity: 1.2, skew: 1, seed: 9}}
			pl := c.placement(t)
			ds := newDispatchers(t, comms, Config{Experts: 6, K: 2, Hidden: 8, DType: reduce.BFloat16,
				CapacityFactor: 1.2, Rows: rows, MaxTokens: 28, Logger: discard})
			mustAll(t, onAll(ranks, func(r int) error { return decodePipeline(ds[r], c, pl, r) }))
		})
	}
}

// decodePipeline runs micro-batches 0..7 two at a time with the split form.
func decodePipeline(d *Dispatcher, c dispatchCase, pl *routing.Placement, r int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := c.l
	for step := 0; step < 8; step += 2 {
		var hs [2]*Handle
		var toks, outs [2][]byte
		for i := range hs {
			toks[i], outs[i] = l.tokenRows(r, step+i), make([]byte, len(l.tokenRows(r, step+i)))
			h, err := d.DispatchSend(ctx, toks[i], l.decision(r, step+i))
			if err != nil {
				return err
			}
			hs[i] = h
		}
		for i, h := range hs {
			if err := h.Wait(); err != nil {
				return err
			}
			if err := checkReceived(l, r, step+i, c.ranks, pl, h); err != nil {
				return fmt.Errorf("micro-batch %d: %w", step+i, err)
			}
			runExperts(h, l.dtype, l.hidden, h.Output())
			if err := d.CombineSend(ctx, h, h.Output(), outs[i]); err != nil {
				return err
			}
		}
		for i, h := range hs {
			if err := h.Wait(); err != nil {
				return err
			}
			if err := checkCombined(l, r, step+i, outs[i]); err != nil {
				return fmt.Errorf("micro-batch %d: %w", step+i, err)
			}
			h.Release()
		}
	}
	return nil
}

// TestDecodeArguments: a step over MaxTokens fails with ErrInvalidArgument
// on every rank before anything is sent, and the next step verifies; a
// third step while both sets are held is refused; configurations the mode
// cannot run are refused by New.
func TestDecodeArguments(t *testing.T) {
	const ranks = 2
	url := startNATS(t)
	comms := group(t, url, ranks, nil)
	c := dispatchCase{ranks: ranks, l: layer{experts: 4, k: 2, hidden: 8, tokens: 10, dtype: reduce.Float32, seed: 3}}
	pl := c.placement(t)
	ds := newDispatchers(t, comms, Config{Experts: 4, K: 2, Hidden: 8, MaxTokens: 14, Logger: discard})
	mustAll(t, onAll(ranks, func(r int) error {
		ctx := context.Background()
		big := layer{experts: 4, k: 2, hidden: 8, tokens: 15, dtype: reduce.Float32, seed: 3}
		if _, err := ds[r].Dispatch(ctx, big.tokenRows(r, 0), big.decision(r, 0)); !errors.Is(err, a2a.ErrInvalidArgument) {
			return fmt.Errorf("step over MaxTokens: %v, want ErrInvalidArgument", err)
		}
		if err := decodeStep(ds[r], c, decodeCase{}, pl, r, 0); err != nil {
			return fmt.Errorf("step after the refused one: %w", err)
		}
		h1, err := ds[r].DispatchSend(ctx, c.l.tokenRows(r, 1), c.l.decision(r, 1))
		if err != nil {
			return err
		}
		h2, err := ds[r].DispatchSend(ctx, c.l.tokenRows(r, 2), c.l.decision(r, 2))
		if err != nil {
			return err
		}
		if _, err := ds[r].DispatchSend(ctx, c.l.tokenRows(r, 3), c.l.decision(r, 3)); !errors.Is(err, a2a.ErrInvalidArgument) {
			return fmt.Errorf("third step in flight: %v, want ErrInvalidArgument", err)
		}
		if err := errors.Join(h1.Wait(), h2.Wait()); err != nil {
			return err
		}
		// Released without their combine: the sets are free again.
		h1.Release()
		h2.Release()
		return decodeStep(ds[r], c, decodeCase{split: true}, pl, r, 3)
	}))
	for _, bad := range []Config{
		{Experts: 4, K: 2, Hidden: 8, MaxTokens: -1},
		{Experts: 4, K: 2, Hidden: 8, MaxTokens: 8, Counts: CountsNATS},
		{Experts: 4, K: 2, Hidden: 8, MaxTokens: 8, Rebalance: Rebalance{Every: 4, Mover: nil}},
	} {
		if _, err := New(context.Background(), comms[0], bad); !errors.Is(err, a2a.ErrInvalidArgument) {
			t.Errorf("New(%+v): %v, want ErrInvalidArgument", bad, err)
		}
	}
}

// TestDecodeFailures: no rank waits past its deadline or for a rank that is
// gone. A rank that never dispatches leaves its peers' steps to fail with
// ErrTimeout at their context's deadline; a rank that closes its Comm
// instead of dispatching fails their waits with ErrPeerLost at once.
func TestDecodeFailures(t *testing.T) {
	url := startNATS(t)
	l := layer{experts: 6, k: 2, hidden: 8, tokens: 10, dtype: reduce.Float32, seed: 11}
	cfg := Config{Experts: 6, K: 2, Hidden: 8, MaxTokens: 16, Logger: discard}
	t.Run("deadline", func(t *testing.T) {
		comms := group(t, url, 3, nil)
		ds := newDispatchers(t, comms, cfg)
		mustAll(t, onAll(2, func(r int) error { // rank 2 never dispatches
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := ds[r].Dispatch(ctx, l.tokenRows(r, 0), l.decision(r, 0))
			if !errors.Is(err, a2a.ErrTimeout) {
				return fmt.Errorf("waiting for a rank that never dispatches: %v, want ErrTimeout", err)
			}
			if took := time.Since(start); took > 5*time.Second {
				return fmt.Errorf("failed after %v, the deadline was 300ms", took)
			}
			return nil
		}))
	})
	t.Run("peer-left", func(t *testing.T) {
		comms := group(t, url, 3, nil)
		ds := newDispatchers(t, comms, cfg)
		mustAll(t, onAll(3, func(r int) error {
			if r == 2 {
				time.Sleep(100 * time.Millisecond)
				return comms[2].Close()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			_, err := ds[r].Dispatch(ctx, l.tokenRows(r, 0), l.decision(r, 0))
			if !errors.Is(err, a2a.ErrPeerLost) {
				return fmt.Errorf("waiting for a rank that left: %v, want ErrPeerLost", err)
			}
			if took := time.Since(start); took > 5*time.Second {
				return fmt.Errorf("failed after %v", took)
			}
			return nil
		}))
	})
}
