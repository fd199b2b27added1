package routing

import (
	"math"
	"slices"
)

// Capacity limits how many assignments one expert accepts per step.
type Capacity struct {
	// Factor scales the even share tokens*k/experts. Factor <= 0 (or NaN)
	// means no limit: nothing is ever dropped.
	Factor float64
}

// Unlimited reports whether c never drops (Factor <= 0 or NaN).
func (c Capacity) Unlimited() bool { return !(c.Factor > 0) }

// PerExpert returns the per-expert capacity ceil(tokens*k/experts * Factor).
// Values within a relative 1e-9 of an integer count as that integer, so that
// float rounding (100*1.1 = 110.00000000000001) does not add a row. The result
// is capped at tokens, the most any expert can receive since a token picks an
// expert at most once; an unlimited capacity also returns tokens.
func (c Capacity) PerExpert(tokens, k, experts int) int {
	if tokens <= 0 {
		return 0
	}
	if c.Unlimited() || k < 1 || experts < 1 {
		return tokens
	}
	x := float64(tokens) * float64(k) / float64(experts) * c.Factor
	if !(x < float64(tokens)) { // also catches +Inf
		return tokens
	}
	n := math.Round(x)
	if math.Abs(x-n) > 1e-9*math.Max(1, x) {
		n = math.Ceil(x)
	}
	return int(n)
}

// CapacityScratch is reusable working memory for [Capacity.Apply]. The zero
// value is ready to use; it is not safe for concurrent use.
type CapacityScratch struct {
	count []int    // assignments per expert
	start []int    // first index in idx of each expert's bucket
	keys  []uint64 // drop keys of kept assignments, bucketed by expert
}

// Apply drops the assignments of every expert that exceeds
// c.PerExpert(d.Tokens, d.K, experts) and returns how many it dropped. Within
// an overloaded expert the lowest gate weights go first; among equal weights
// the higher token index goes first (then the higher slot, which only matters
// for hand-built decisions naming an expert twice). The result depends only
// on d, so it is deterministic. Dropped slots become Expert = Dropped,
// Weight = 0; surviving weights are not renormalised (see [Decision]).
//
// Apply does not allocate once scratch has grown to the problem size; a nil
// scratch allocates a temporary one.
func (c Capacity) Apply(d *Decision, experts int, scratch *CapacityScratch) (dropped int, err error) {
	if experts < 1 {
		return 0, invalidf("experts %d, want >= 1", experts)
	}
	if err := d.check(experts); err != nil {
		return 0, err
	}
	if c.Unlimited() {
		return 0, nil
	}
	limit := c.PerExpert(d.Tokens, d.K, experts)
	s := scratch
	if s == nil {
		s = new(CapacityScratch)
	}
	s.count = resizeInts(s.count, experts)
	clear(s.count)
	kept := 0
	for _, e := range d.Expert {
		if e != Dropped {
			s.count[e]++
			kept++
		}
	}
	over := false
	for _, n := range s.count {
		if n > limit {
			over = true
			break
		}
	}
	if !over {
		return 0, nil
	}
	// Bucket the assignments by expert (counting sort, stable in token order).
	// Each entry is a drop-order key, see dropKey.
	s.start = resizeInts(s.start, experts)
	off := 0
	for e, n := range s.count {
		s.start[e] = off
		off += n
	}
	if cap(s.keys) < kept {
		s.keys = make([]uint64, kept)
	}
	s.keys = s.keys[:kept]
	for i, e := range d.Expert {
		if e != Dropped {
			s.keys[s.start[e]] = dropKey(d.Weight[i], i)
			s.start[e]++
		}
	}
	// s.start[e] now marks the end of bucket e; its start is end - count.
	for e, n := range s.count {
		if n <= limit {
			continue
		}
		bucket := s.keys[s.start[e]-n : s.start[e]]
		slices.Sort(bucket)
		for _, key := range bucket[:n-limit] {
			i := int(^uint32(key))
			d.Expert[i], d.Weight[i] = Dropped, 0
		}
		dropped += n - limit
	}
	return dropped, nil
}

// dropKey orders assignments for dropping as plain integers: the high half is
// the weight mapped to an order-preserving uint32 (so smaller weights sort
// first, negative ones included, -0 treated as +0), the low half the
// complemented index, so that among equal weights the higher index (token,
// then slot) sorts, and is dropped, first. Sorting integers is several times
// faster than sorting with a comparison closure.
func dropKey(w float32, i int) uint64 {
	if w == 0 {
		w = 0 // canonicalise -0
	}
	b := math.Float32bits(w)
	if b&(1<<31) != 0 {
		b = ^b
	} else {
		b |= 1 << 31
	}
	return uint64(b)<<32 | uint64(^uint32(i))
}

func resizeInts(s []int, n int) []int {
	if cap(s) < n {
		return make([]int, n)
	}
	return s[:n]
}
