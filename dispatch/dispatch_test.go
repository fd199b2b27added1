package dispatch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

// dispatchCase is one layer configuration run for a few steps on an
// in-process group.
type dispatchCase struct {
	name    string
	ranks   int
	l       layer
	owner   []int // placement table; nil: contiguous
	counts  CountsMode
	outputs outputsAt
	rows    RowPath
}

// outputsAt says where the test's experts write their outputs.
type outputsAt uint8

const (
	inOutput    outputsAt = iota // Handle.Output
	inRecv                       // Handle.Recv, computed in place
	inOwnBuffer                  // a buffer of the caller's
)

func (c dispatchCase) placement(t *testing.T) *routing.Placement {
	var pl *routing.Placement
	var err error
	if c.owner == nil {
		pl, err = routing.Contiguous(c.l.experts, c.ranks)
	} else {
		pl, err = routing.FromTable(c.l.experts, c.ranks, c.owner)
	}
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

// TestDispatchCombine runs dispatch, expert compute and combine on 1 to 5
// in-process ranks and checks every received row and every combined output
// against a reference recomputed from the deterministic inputs.
func TestDispatchCombine(t *testing.T) {
	cases := []dispatchCase{
		{name: "1rank/inband/f32", ranks: 1, l: layer{experts: 4, k: 2, hidden: 8, tokens: 20, dtype: reduce.Float32}},
		{name: "1rank/nats/bf16/drops", ranks: 1, counts: CountsNATS,
			l: layer{experts: 3, k: 2, hidden: 5, tokens: 17, dtype: reduce.BFloat16, capacity: 0.7, skew: 1}},
		{name: "2ranks/inband/bf16/drops", ranks: 2,
			l: layer{experts: 8, k: 2, hidden: 12, tokens: 40, dtype: reduce.BFloat16, capacity: 1, skew: 1.2}},
		{name: "2ranks/nats/f32/empty-rank", ranks: 2, counts: CountsNATS,
			l: layer{experts: 4, k: 2, hidden: 3, tokens: 0, dtype: reduce.Float32}},
		{name: "3ranks/nats/f32/k3/drops", ranks: 3, counts: CountsNATS,
			l: layer{experts: 7, k: 3, hidden: 9, tokens: 30, dtype: reduce.Float32, capacity: 0.8, skew: 0.8}},
		{name: "3ranks/inband/f32/k1/in-place/caller-drops", ranks: 3, outputs: inRecv,
			l: layer{experts: 3, k: 1, hidden: 16, tokens: 25, dtype: reduce.Float32, preDrop: true}},
		{name: "4ranks/nats/bf16/uneven-placement", ranks: 4, counts: CountsNATS, owner: []int{0, 0, 0, 2, 2, 3},
			l: layer{experts: 6, k: 2, hidden: 7, tokens: 33, dtype: reduce.BFloat16}},
		{name: "4ranks/inband/f32/uneven-placement/drops", ranks: 4, owner: []int{3, 0, 3, 3, 0},
			l: layer{experts: 5, k: 2, hidden: 4, tokens: 29, dtype: reduce.Float32, capacity: 1.1, skew: 2}},
		{name: "5ranks/inband/f16/zipf/drops", ranks: 5,
			l: layer{experts: 16, k: 2, hidden: 6, tokens: 50, dtype: reduce.Float16, capacity: 1.25, skew: 1.5, preDrop: true}},
		{name: "5ranks/nats/bf16/k4", ranks: 5, counts: CountsNATS, outputs: inRecv,
			l: layer{experts: 11, k: 4, hidden: 10, tokens: 21, dtype: reduce.BFloat16, skew: 0.5}},
		// Steps large enough (over streamBytes) for streaming stores and
		// prefetching, with rows that are not a multiple of 32 bytes and, in
		// NATS mode, 16-byte headers in front of the blocks.
		{name: "3ranks/inband/bf16/large/drops", ranks: 3,
			l: layer{experts: 6, k: 2, hidden: 1000, tokens: 600, dtype: reduce.BFloat16, capacity: 1.1, skew: 1}},
		{name: "2ranks/nats/f32/large", ranks: 2, counts: CountsNATS, outputs: inRecv,
			l: layer{experts: 4, k: 2, hidden: 300, tokens: 1000, dtype: reduce.Float32}},
		{name: "3ranks/inband/f32/own-buffer", ranks: 3, outputs: inOwnBuffer,
			l: layer{experts: 5, k: 2, hidden: 8, tokens: 31, dtype: reduce.Float32, skew: 1}},
	}
	url := startNATS(t)
	groups := map[int][]*a2a.Comm{}
	for _, c := range cases {
		if groups[c.ranks] == nil {
			groups[c.ranks] = group(t, url, c.ranks, nil)
		}
	}
	for i, c := range cases {
		c.l.seed = uint64(100 + i)
		for _, path := range []RowPath{RowsAuto, RowsAllToAllV} {
			c.rows = path
			t.Run(c.name+"/"+path.String(), func(t *testing.T) { testLayer(t, groups[c.ranks], c) })
		}
	}
}

// testLayer runs three verified steps of c on comms, whose ranks all share
// this host: RowsAuto must read the outputs in place there.
func testLayer(t *testing.T, comms []*a2a.Comm, c dispatchCase) {
	pl := c.placement(t)
	ds := newDispatchers(t, comms, Config{
		Experts: c.l.experts, K: c.l.k, Hidden: c.l.hidden, DType: c.l.dtype,
		CapacityFactor: c.l.capacity, Placement: pl, Counts: c.counts, Rows: c.rows, Logger: discard,
	})
	for r, d := range ds {
		if want := c.rows == RowsAuto && c.ranks > 1; d.SharedMemory() != want {
			t.Fatalf("rank %d: SharedMemory() = %v with rows %v on one host, want %v", r, d.SharedMemory(), c.rows, want)
		}
	}
	mustAll(t, onAll(c.ranks, func(r int) error {
		for step := range 3 {
			if err := runStep(ds[r], c, pl, r, step); err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
		}
		return nil
	}))
}

// runStep is one verified synchronous step of rank r.
func runStep(d *Dispatcher, c dispatchCase, pl *routing.Placement, r, step int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := c.l
	tokens := l.tokenRows(r, step)
	h, err := d.Dispatch(ctx, tokens, l.decision(r, step))
	if err != nil {
		return err
	}
	defer h.Release()
	if err := checkReceived(l, r, step, c.ranks, pl, h); err != nil {
		return fmt.Errorf("received rows: %w", err)
	}
	if err := checkStats(l, r, step, h); err != nil {
		return err
	}
	var outputs []byte
	switch c.outputs {
	case inOutput:
		outputs = h.Output()
	case inRecv:
		outputs = h.Recv()
	case inOwnBuffer:
		outputs = make([]byte, len(h.Recv()))
	}
	runExperts(h, l.dtype, l.hidden, outputs)
	// The combined output overwrites the token buffer, as a layer would.
	if err := d.Combine(ctx, h, outputs, tokens); err != nil {
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

// checkStats compares the handle's statistics with the reference routing.
func checkStats(l layer, r, step int, h *Handle) error {
	caller, after := l.decision(r, step), l.dispatched(r, step)
	st := h.Stats()
	dropped := after.Tokens*after.K - after.Kept() - (caller.Tokens*caller.K - caller.Kept())
	if st.Tokens != caller.Tokens || st.Kept != after.Kept() || st.Dropped != dropped {
		return fmt.Errorf("stats tokens %d kept %d dropped %d, want %d, %d, %d", st.Tokens, st.Kept, st.Dropped, caller.Tokens, after.Kept(), dropped)
	}
	load := 0
	for e, n := range h.ExpertLoad() {
		want := 0
		for _, x := range after.Expert {
			if int(x) == e {
				want++
			}
		}
		if n != want {
			return fmt.Errorf("load of expert %d: %d, want %d", e, n, want)
		}
		load += n
	}
	if load != st.Kept {
		return fmt.Errorf("load sums to %d, kept %d", load, st.Kept)
	}
	for i, e := range h.Decision().Expert {
		if e != after.Expert[i] {
			return fmt.Errorf("Decision slot %d: expert %d, want %d", i, e, after.Expert[i])
		}
	}
	if st.DispatchTime <= 0 || st.CombineTime != 0 {
		return fmt.Errorf("times before combine: dispatch %v combine %v", st.DispatchTime, st.CombineTime)
	}
	return nil
}

// TestAsyncPipeline overlaps micro-batches as a layer would: the exchange of
// micro-batch i+1 runs while micro-batch i's experts compute, and the combine
// of i while i+1 computes. Both counts modes, every output verified.
func TestAsyncPipeline(t *testing.T) {
	const ranks = 3
	url := startNATS(t)
	comms := group(t, url, ranks, nil)
	for _, counts := range []CountsMode{CountsInBand, CountsNATS} {
		t.Run(counts.String(), func(t *testing.T) {
			c := dispatchCase{ranks: ranks, counts: counts,
				l: layer{experts: 6, k: 2, hidden: 8, tokens: 24, dtype: reduce.BFloat16, capacity: 1.2, skew: 1, seed: 7}}
			pl := c.placement(t)
			ds := newDispatchers(t, comms, Config{Experts: 6, K: 2, Hidden: 8, DType: reduce.BFloat16,
				CapacityFactor: 1.2, Counts: counts, Logger: discard})
			mustAll(t, onAll(ranks, func(r int) error {
				return pipeline(ds[r], c, pl, r)
			}))
		})
	}
}

// pipeline runs micro-batches (steps) 0..5 two at a time.
func pipeline(d *Dispatcher, c dispatchCase, pl *routing.Placement, r int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := c.l
	compute := func(h *Handle, step int) error {
		if err := checkReceived(l, r, step, c.ranks, pl, h); err != nil {
			return fmt.Errorf("micro-batch %d: %w", step, err)
		}
		runExperts(h, l.dtype, l.hidden, h.Output())
		return nil
	}
	for step := 0; step < 6; step += 2 {
		tok0, tok1 := l.tokenRows(r, step), l.tokenRows(r, step+1)
		h0, err := d.Dispatch(ctx, tok0, l.decision(r, step))
		if err != nil {
			return err
		}
		h1, err := d.DispatchAsync(ctx, tok1, l.decision(r, step+1))
		if err != nil {
			return err
		}
		if err := compute(h0, step); err != nil {
			return err
		}
		if err := h1.Wait(); err != nil {
			return err
		}
		out0, out1 := make([]byte, len(tok0)), make([]byte, len(tok1))
		if err := d.CombineAsync(ctx, h0, h0.Output(), out0); err != nil {
			return err
		}
		if err := compute(h1, step+1); err != nil {
			return err
		}
		if err := h0.Wait(); err != nil {
			return err
		}
		if err := d.Combine(ctx, h1, h1.Output(), out1); err != nil {
			return err
		}
		for i, out := range [][]byte{out0, out1} {
			if err := checkCombined(l, r, step+i, out); err != nil {
				return fmt.Errorf("micro-batch %d: %w", step+i, err)
			}
		}
		h0.Release()
		h1.Release()
	}
	return nil
}
