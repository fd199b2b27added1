package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/routing"
)

// aggregate collects every rank's stepResult on every rank (a small
// AllToAll), so that all ranks know whether the step verified and rank 0 can
// print the totals.
type aggregate struct {
	o          options
	size       int
	send, recv []byte
	all        []stepResult
}

func newAggregate(o options, size int) *aggregate {
	a := &aggregate{o: o, size: size, all: make([]stepResult, size)}
	a.send, a.recv = make([]byte, size*a.recordBytes()), make([]byte, size*a.recordBytes())
	for i := range a.all {
		a.all[i].load = make([]int, o.experts)
	}
	return a
}

const recordFields = 12 // ok, mismatches, routed, kept, dropped, received, dispatch, combine, moved, took, sent, cpu

func (a *aggregate) recordBytes() int { return 8 * (recordFields + a.o.experts) }

func (a *aggregate) gather(ctx context.Context, c *a2a.Comm, res *stepResult) error {
	le := binary.LittleEndian
	rec := a.send[:a.recordBytes()]
	ok := uint64(0)
	if res.ok {
		ok = 1
	}
	for i, v := range []uint64{ok, uint64(res.mismatches), uint64(res.routed), uint64(res.kept), uint64(res.dropped),
		uint64(res.received), uint64(res.dispatch), uint64(res.combine), uint64(res.moved), uint64(res.took), uint64(res.sent), uint64(res.cpu)} {
		le.PutUint64(rec[8*i:], v)
	}
	for e, n := range res.load {
		le.PutUint64(rec[8*(recordFields+e):], uint64(n))
	}
	for j := 1; j < a.size; j++ {
		copy(a.send[j*len(rec):], rec)
	}
	if err := c.AllToAll(ctx, a.send, a.recv); err != nil {
		return err
	}
	for r := range a.size {
		b := a.recv[r*len(rec):]
		f := func(i int) uint64 { return le.Uint64(b[8*i:]) }
		s := &a.all[r]
		s.ok, s.mismatches = f(0) == 1, int(f(1))
		s.routed, s.kept, s.dropped, s.received = int(f(2)), int(f(3)), int(f(4)), int(f(5))
		s.dispatch, s.combine, s.moved, s.took = time.Duration(f(6)), time.Duration(f(7)), int64(f(8)), time.Duration(f(9))
		s.sent, s.cpu = int64(f(10)), time.Duration(f(11))
		for e := range s.load {
			s.load[e] = int(f(recordFields + e))
		}
	}
	return nil
}

// failed lists the ranks whose outputs differed.
func (a *aggregate) failed() []int {
	var bad []int
	for r, s := range a.all {
		if !s.ok {
			bad = append(bad, r)
		}
	}
	return bad
}

// print writes the step's line: totals over ranks, the slowest rank's
// dispatch and combine time, and the imbalance of rows processed per rank.
func (a *aggregate) print(w io.Writer, step int) {
	var routed, kept, dropped int
	var moved int64
	var disp, comb time.Duration
	load := make([]int, a.o.experts)
	perRank := make([]int, a.size)
	for r, s := range a.all {
		routed += s.routed
		kept += s.kept
		dropped += s.dropped
		moved += s.moved
		disp, comb = max(disp, s.dispatch), max(comb, s.combine)
		perRank[r] = s.received
		for e, n := range s.load {
			load[e] += n
		}
	}
	result := "verified"
	if bad := a.failed(); len(bad) > 0 {
		result = fmt.Sprintf("FAILED on ranks %v", bad)
	}
	loads := make([]string, len(load))
	for e, n := range load {
		loads[e] = strconv.Itoa(n)
	}
	fmt.Fprintf(w, "%4d %13s %8d %9.2f %9s %9s %9s  %-8s  [%s]\n",
		step, fmt.Sprintf("%d/%d", kept, routed), dropped, routing.Imbalance(perRank),
		round(disp), round(comb), bytesString(moved), result, strings.Join(loads, " "))
}

func round(d time.Duration) string {
	switch {
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}

func bytesString(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}
