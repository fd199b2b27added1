package routing

import (
	"math"
	"math/rand/v2"
)

// Load is the per-expert and per-rank load of one step, in rows (kept
// assignments: a token sent to two experts on the same rank counts twice,
// matching what travels). Reuse a Load across steps to avoid allocation.
type Load struct {
	// PerExpert[e] is the number of kept assignments to expert e.
	PerExpert []int
	// PerRank[r] is the number of kept assignments to experts hosted on rank r.
	PerRank []int
	// Kept and Dropped count the assignments of the step.
	Kept, Dropped int
}

// Measure computes the load of d under placement pl.
func (l *Load) Measure(d *Decision, pl *Placement) error {
	if err := pl.Validate(); err != nil {
		return err
	}
	if err := d.check(pl.Experts); err != nil {
		return err
	}
	l.PerExpert = resizeInts(l.PerExpert, pl.Experts)
	l.PerRank = resizeInts(l.PerRank, pl.Ranks)
	clear(l.PerExpert)
	clear(l.PerRank)
	l.Kept, l.Dropped = 0, 0
	for _, e := range d.Expert {
		if e == Dropped {
			l.Dropped++
			continue
		}
		l.Kept++
		l.PerExpert[e]++
		l.PerRank[pl.Owner[e]]++
	}
	return nil
}

// Imbalance returns max/mean of the per-rank load (see [Imbalance]).
func (l *Load) Imbalance() float64 { return Imbalance(l.PerRank) }

// Imbalance returns max(counts)/mean(counts): 1 for a perfectly even load, up to
// len(counts) when one entry carries everything. It returns 0 for an empty or
// all-zero slice, where the ratio is undefined. counts are rows ([Plan]'s
// RankRows) or estimated loads ([Placement.RankLoad]); they must be >= 0.
func Imbalance[N int | float64](counts []N) float64 {
	var total, top N
	for _, c := range counts {
		total += c
		top = max(top, c)
	}
	if total == 0 {
		return 0
	}
	return float64(top) * float64(len(counts)) / float64(total)
}

// SkewedLogits fills dst (tokens*experts, row-major) with router logits whose
// top-1 choice follows a Zipf law: expert e is picked first with probability
// proportional to 1/(e+1)^s, so expert 0 is the hottest. s = 0 is uniform,
// s = 1 classic Zipf, larger s more skewed. Each logit is -s*ln(e+1) plus
// independent standard Gumbel noise (the Gumbel-max trick makes the argmax an
// exact sample of the Zipf law; top-k then samples k distinct experts without
// replacement in proportion to it). The output depends only on r's state.
func SkewedLogits(r *rand.Rand, tokens, experts int, s float64, dst []float32) error {
	if r == nil {
		return invalidf("nil random source")
	}
	if tokens < 0 || experts < 1 {
		return invalidf("shape %d tokens x %d experts, want tokens >= 0 and experts >= 1", tokens, experts)
	}
	if !(s >= 0) || math.IsInf(s, 1) {
		return invalidf("skew %v, want finite and >= 0", s)
	}
	if tokens > math.MaxInt/experts || len(dst) != tokens*experts {
		return invalidf("logits length %d, want tokens %d x experts %d", len(dst), tokens, experts)
	}
	for t := range tokens {
		row := dst[t*experts : (t+1)*experts]
		for e := range row {
			u := r.Float64()
			for u == 0 { // -ln(-ln 0) is -Inf; redraw the measure-zero case
				u = r.Float64()
			}
			row[e] = float32(-s*math.Log(float64(e+1)) - math.Log(-math.Log(u)))
		}
	}
	return nil
}
