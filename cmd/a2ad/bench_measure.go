package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"slices"
	"time"
)

// agreeMin makes every rank use the smallest of the ranks' values.
func (b *bench) agreeMin(ctx context.Context, v int) (int, error) {
	n := b.c.Size()
	for j := range n {
		binary.LittleEndian.PutUint64(b.agreeS[8*j:], uint64(v))
	}
	if err := b.c.AllToAll(ctx, b.agreeS, b.agreeR); err != nil {
		return 0, err
	}
	for j := range n {
		v = min(v, int(binary.LittleEndian.Uint64(b.agreeR[8*j:])))
	}
	return v, nil
}

// measure times op: a verified first call with --check, warm-up, then timed
// iterations each after a barrier; rank 0 gathers every rank's times and
// reports the slowest rank of each iteration.
func (b *bench) measure(ctx context.Context, row benchRow, op collective) (benchRow, error) {
	wrong, err := b.firstCall(ctx, op)
	if err != nil {
		return row, err
	}
	iters, err := b.warmUp(ctx, op)
	if err != nil {
		return row, err
	}
	if err := b.timeCalls(ctx, op, iters); err != nil {
		return row, err
	}
	row.Algo = b.c.LastAlgo()
	if row.Algo == "" {
		row.Algo = "-" // keeps the columns of the text rows
	}
	if b.f.check && wrong == 0 {
		wrong = op.wrong() // the last timed call's result
	}
	if err := b.gatherStamps(ctx, iters, wrong); err != nil {
		return row, err
	}
	if b.c.Rank() != 0 {
		return row, nil
	}
	return b.summarize(row, op, iters), nil
}

// firstCall makes, with --check, an untimed first call into a receive
// buffer filled with garbage and counts the wrong elements of its result.
func (b *bench) firstCall(ctx context.Context, op collective) (wrong int, err error) {
	if !b.f.check {
		return 0, nil
	}
	for i := range b.recv {
		b.recv[i] = 0xEE
	}
	if err := op.call(ctx); err != nil {
		return 0, err
	}
	return op.wrong(), nil
}

// settleBatch is how many untimed calls settle makes between two checks of
// its clock: the check is a collective, so a batch keeps its cost small.
const settleBatch = 64

// settle makes untimed calls of op for --settle, once per launch: a fresh
// pair of ranks can run its first ~0.1-0.2 s slower (docs/PERFORMANCE.md,
// "Fast and slow periods of the 8 B shm cells"), which a count of warm-up
// calls at 8 B does not outlast. The ranks stop together, when every rank's
// clock has passed --settle.
func (b *bench) settle(ctx context.Context, op collective) error {
	if b.settled || b.f.settle <= 0 {
		return nil
	}
	b.settled = true
	t0 := time.Now()
	for calls := settleBatch; ; calls += settleBatch {
		for range settleBatch {
			if err := op.call(ctx); err != nil {
				return err
			}
		}
		// The minimum of "my clock has passed" is 1 only when every
		// rank's has: the ranks start their clocks at different moments.
		passed := 0
		if time.Since(t0) >= b.f.settle {
			passed = 1
		}
		allPassed, err := b.agreeMin(ctx, passed)
		if err != nil {
			return err
		}
		if allPassed == 1 {
			if b.c.Rank() == 0 {
				fmt.Fprintf(os.Stderr, "# settle: %d untimed calls of the first size in %v before it was measured\n",
					calls, time.Since(t0).Round(time.Millisecond))
			}
			return nil
		}
	}
}

// warmUp makes the warm-up calls and returns the timed iterations every
// rank agrees on: --iters, fewer (at least 20) when the warm-up calls say
// they would overrun --budget.
func (b *bench) warmUp(ctx context.Context, op collective) (iters int, err error) {
	if err := b.settle(ctx, op); err != nil {
		return 0, err
	}
	t0 := time.Now()
	for range b.f.warmup {
		if err := op.call(ctx); err != nil {
			return 0, err
		}
	}
	iters = b.f.iters
	if b.f.warmup > 0 {
		mean := time.Since(t0) / time.Duration(b.f.warmup)
		if mean > 0 {
			iters = max(20, min(iters, int(b.f.budget/mean)))
		}
	}
	return b.agreeMin(ctx, iters)
}

// timeCalls makes the timed calls, each after a barrier, and records their
// start and end in b.stamps.
func (b *bench) timeCalls(ctx context.Context, op collective, iters int) error {
	b.stamps = b.stamps[:0]
	for range iters {
		if err := b.barrier(ctx); err != nil {
			return err
		}
		start := time.Now()
		if err := op.call(ctx); err != nil {
			return err
		}
		// time.Since reads only the monotonic clock; a time.Now here would
		// also read the wall clock inside the timed interval, ~20-30 ns of
		// harness in every 8-byte call. The per-call reads cannot be
		// batched: the barrier before each call would land in the batch.
		d := time.Since(start)
		// Wall-clock stamps, for --timing span across ranks; the duration
		// itself comes from the monotonic clock.
		b.stamps = append(b.stamps, start.UnixNano(), start.UnixNano()+d.Nanoseconds())
	}
	return nil
}

// gatherStamps gathers every rank's per-iteration start and end stamps (and
// its count of wrong elements) into rank 0's b.gatherRecv.
func (b *bench) gatherStamps(ctx context.Context, iters, wrong int) error {
	n, rank := b.c.Size(), b.c.Rank()
	per := stampBlock(iters)
	b.gatherSend = grow(b.gatherSend, per)
	for i, t := range b.stamps {
		binary.LittleEndian.PutUint64(b.gatherSend[8*i:], uint64(t))
	}
	binary.LittleEndian.PutUint64(b.gatherSend[16*iters:], uint64(wrong))
	for j := range n {
		b.one[j], b.gather[j] = 0, 0
		if rank == 0 {
			b.gather[j] = per
		}
	}
	b.one[0] = per
	b.gatherRecv = grow(b.gatherRecv, n*per)
	return b.c.AllToAllV(ctx, b.gatherSend, b.one, b.gatherRecv[:len(b.gatherRecv)], b.gather)
}

// stampBlock is the size of a rank's block in the gathered stamps: the
// start and end of each of its iters calls, then its wrong elements.
func stampBlock(iters int) int { return 16*iters + 8 }

// summarize fills in row's times, bandwidths and check from the gathered
// stamps, on rank 0.
func (b *bench) summarize(row benchRow, op collective, iters int) benchRow {
	slowest, wrong := b.iterationTimes(iters)
	slices.Sort(slowest)
	sum := 0.0
	for _, t := range slowest {
		sum += t
	}
	row.Avg = math.Round(sum/float64(max(iters, 1))*1e3) / 1e3 // ns, as the others
	row.P50 = percentile(slowest, 0.50)
	row.P99 = percentile(slowest, 0.99)
	if row.Avg > 0 {
		// Over the average time, as nccl-tests.
		row.AlgBW = float64(op.algBytes) / (row.Avg * 1e3) // bytes per ns = GB/s
		row.BusBW = row.AlgBW * busFactor(b.f.op, b.c.Size())
	}
	if b.f.check {
		row.Wrong, row.Check = &wrong, "ok"
		if wrong > 0 {
			row.Check = "fail"
		}
	}
	return row
}

// iterationTimes reads the gathered stamps: the time of each iteration in
// us, the slowest rank's call, or with --timing span the last start to the
// last end over all ranks; and the wrong elements over all ranks.
func (b *bench) iterationTimes(iters int) (times []float64, wrong int) {
	per := stampBlock(iters)
	span := b.f.timing == "span"
	slowest := make([]float64, iters)
	var lastStart, lastEnd []int64
	if span {
		lastStart, lastEnd = make([]int64, iters), make([]int64, iters)
	}
	for r := range b.c.Size() {
		block := b.gatherRecv[r*per:]
		for i := range iters {
			start := int64(binary.LittleEndian.Uint64(block[16*i:]))
			end := int64(binary.LittleEndian.Uint64(block[16*i+8:]))
			switch {
			case !span:
				slowest[i] = max(slowest[i], float64(end-start)/1e3)
			default:
				lastStart[i], lastEnd[i] = max(lastStart[i], start), max(lastEnd[i], end)
			}
		}
		wrong += int(binary.LittleEndian.Uint64(block[16*iters:]))
	}
	if span {
		for i := range iters {
			slowest[i] = float64(max(lastEnd[i]-lastStart[i], 0)) / 1e3
		}
	}
	return slowest, wrong
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
