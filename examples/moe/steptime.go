package main

import (
	"fmt"
	"io"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// stepTimes collects, for every step, the slowest rank's step time
// (dispatch, experts, combine), the busiest rank's CPU time in it and the
// CPU time of all ranks, to compare the steps before the first
// re-placement with those after it.
//
// The wall time is what this machine gives, and where the ranks outnumber
// the cores it measures the cores as much as the busiest rank: once the
// work is even the step takes the ranks' CPU over the cores they get,
// which other jobs on the machine take from them. A rank's CPU time does
// not depend on how many ranks share a core, so the busiest rank's is what
// the step would take with a core (or a device) per rank, the slowest rank
// setting the pace; the ranks' CPU over the wall time says how many cores
// the step got.
type stepTimes struct {
	before, after []stepSample
	replacedAt    int // step of the first re-placement; -1 before one
	seen          bool
}

// stepSample is one step's figures over the ranks.
type stepSample struct {
	took   time.Duration // slowest rank's wall time
	cpuMax time.Duration // busiest rank's CPU time
	cpuAll time.Duration // every rank's CPU time, summed
}

// add records step's figures from the ranks' results. Step 0 (warm-up) and
// the step of the first re-placement (which includes moving the weights)
// are left out.
func (s *stepTimes) add(step int, a *aggregate, replaced bool) {
	var x stepSample
	for _, r := range a.all {
		x.took, x.cpuMax = max(x.took, r.took), max(x.cpuMax, r.cpu)
		x.cpuAll += r.cpu
	}
	switch {
	case replaced && !s.seen:
		s.seen, s.replacedAt = true, step
	case step == 0:
	case s.seen:
		s.after = append(s.after, x)
	default:
		s.before = append(s.before, x)
	}
}

// print writes the medians, once both sides have steps.
func (s *stepTimes) print(w io.Writer) {
	if len(s.before) == 0 || len(s.after) == 0 {
		return
	}
	b, a := summarize(s.before), summarize(s.after)
	fmt.Fprintf(w, "step time, slowest rank (dispatch, experts, combine): median %v over %d steps before the re-placement at step %d, %v over %d after (%+.0f%%)\n",
		round(b.took), len(s.before), s.replacedAt, round(a.took), len(s.after), change(b.took, a.took))
	fmt.Fprintf(w, "CPU time in the step: busiest rank (the step with a core per rank) median %v before, %v after (%+.0f%%); all ranks %v before, %v after; cores the ranks used %.2f before, %.2f after\n",
		round(b.cpuMax), round(a.cpuMax), change(b.cpuMax, a.cpuMax), round(b.cpuAll), round(a.cpuAll), b.cores, a.cores)
}

// stepSummary is the medians of one side's steps.
type stepSummary struct {
	took, cpuMax, cpuAll time.Duration
	cores                float64 // every rank's CPU time over the slowest rank's wall time
}

func summarize(xs []stepSample) stepSummary {
	var took, cpuMax, cpuAll []time.Duration
	var cores []float64
	for _, x := range xs {
		took, cpuMax, cpuAll = append(took, x.took), append(cpuMax, x.cpuMax), append(cpuAll, x.cpuAll)
		if x.took > 0 {
			cores = append(cores, float64(x.cpuAll)/float64(x.took))
		}
	}
	slices.Sort(cores)
	s := stepSummary{took: median(took), cpuMax: median(cpuMax), cpuAll: median(cpuAll)}
	if len(cores) > 0 {
		s.cores = cores[len(cores)/2]
	}
	return s
}

// change is the relative change from b to a, in percent.
func change(b, a time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return 100 * (float64(a) - float64(b)) / float64(b)
}

func median(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// threadCPU is the CPU time the calling thread has used. The step runs on
// one goroutine locked to its thread (dispatch, experts and combine; with
// --microbatches above 1 the dispatcher's worker also runs the
// asynchronous exchanges, which this leaves out), so the difference over
// the step is the rank's CPU time in it, in a process of its own or not.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// slowest is the longest step time among the ranks of the last gather.
func (a *aggregate) slowest() time.Duration {
	var t time.Duration
	for _, s := range a.all {
		t = max(t, s.took)
	}
	return t
}
