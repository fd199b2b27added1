package main

import (
	"fmt"
	"io"
	"slices"
	"time"
)

// stepTimes collects the slowest rank's step time (dispatch, experts,
// combine) of every step, to compare the steps before the first
// re-placement with those after it: the busiest rank sets the pace.
type stepTimes struct {
	before, after []time.Duration
	replacedAt    int // step of the first re-placement; -1 before one
	seen          bool
}

// add records step's time. Step 0 (warm-up) and the step of the first
// re-placement (which includes moving the weights) are left out.
func (s *stepTimes) add(step int, took time.Duration, replaced bool) {
	switch {
	case replaced && !s.seen:
		s.seen, s.replacedAt = true, step
	case step == 0:
	case s.seen:
		s.after = append(s.after, took)
	default:
		s.before = append(s.before, took)
	}
}

// print writes the medians, once both sides have steps.
func (s *stepTimes) print(w io.Writer) {
	if len(s.before) == 0 || len(s.after) == 0 {
		return
	}
	fmt.Fprintf(w, "step time, slowest rank (dispatch, experts, combine): median %v over %d steps before the re-placement at step %d, %v over %d after\n",
		round(median(s.before)), len(s.before), s.replacedAt, round(median(s.after)), len(s.after))
}

func median(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// slowest is the longest step time among the ranks of the last gather.
func (a *aggregate) slowest() time.Duration {
	var t time.Duration
	for _, s := range a.all {
		t = max(t, s.took)
	}
	return t
}
