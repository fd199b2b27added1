package routing

import (
	"math"
)

// Dropped marks a (token, slot) assignment that goes to no expert: dropped by
// [Capacity.Apply] or left empty by the caller of [FromAssignments].
const Dropped int32 = -1

// maxSlots bounds tokens*k so that a (token, slot) pair fits the int32 encoding
// token*K+slot used by [Plan].
const maxSlots = math.MaxInt32

// Decision is one step's routing of Tokens tokens with K slots each. Slot s of
// token t is at index t*K+s of both slices.
//
// Weight holds the gate weights as routed: for [Gate.Route] the top-k softmax
// probabilities renormalised to sum to 1 over the K chosen experts. Dropping an
// assignment does not renormalise the survivors: a dropped slot has Expert ==
// [Dropped] and Weight 0, so it contributes nothing to the combine and a token
// that lost slots keeps weights summing to less than 1 (the usual MoE
// convention, the residual path carries the rest).
type Decision struct {
	Tokens int
	K      int
	// Expert[t*K+s] is the expert of token t's slot s, or Dropped.
	Expert []int32
	// Weight[t*K+s] is the gate weight of that assignment, 0 when dropped.
	Weight []float32
}

// Reset sizes d for tokens*k slots, reusing its storage when large enough, and
// marks every slot Dropped with weight 0. tokens and k must be non-negative.
func (d *Decision) Reset(tokens, k int) {
	d.resize(tokens, k)
	for i := range d.Expert {
		d.Expert[i] = Dropped
	}
	clear(d.Weight)
}

// resize sets the shape without initialising the slots; the callers overwrite them.
func (d *Decision) resize(tokens, k int) {
	n := tokens * k
	if cap(d.Expert) < n {
		d.Expert = make([]int32, n)
	}
	if cap(d.Weight) < n {
		d.Weight = make([]float32, n)
	}
	d.Expert, d.Weight = d.Expert[:n], d.Weight[:n]
	d.Tokens, d.K = tokens, k
}

// Kept returns the number of assignments that are not Dropped.
func (d *Decision) Kept() int {
	n := 0
	for _, e := range d.Expert {
		if e != Dropped {
			n++
		}
	}
	return n
}

// check reports whether d's slices match its shape and its expert ids are
// Dropped or in [0, experts).
func (d *Decision) check(experts int) error {
	if err := d.checkShape(); err != nil {
		return err
	}
	for i, e := range d.Expert {
		if e != Dropped && (e < 0 || int(e) >= experts) {
			return outOfRange(i/d.K, i%d.K, e, experts)
		}
	}
	return nil
}

// checkShape reports whether d's slices match its shape.
func (d *Decision) checkShape() error {
	if d == nil {
		return invalidf("nil decision")
	}
	if d.Tokens < 0 || d.K < 1 {
		return invalidf("decision shape %d tokens x %d slots, want tokens >= 0 and k >= 1", d.Tokens, d.K)
	}
	if d.Tokens > maxSlots/d.K {
		return invalidf("decision has %d tokens x %d slots, more than %d", d.Tokens, d.K, maxSlots)
	}
	n := d.Tokens * d.K
	if len(d.Expert) != n || len(d.Weight) != n {
		return invalidf("decision has %d expert ids and %d weights, want %d (tokens %d x k %d)",
			len(d.Expert), len(d.Weight), n, d.Tokens, d.K)
	}
	return nil
}

func outOfRange(t, s int, e int32, experts int) error {
	return invalidf("token %d slot %d: expert id %d out of range [0, %d)", t, s, e, experts)
}

// CheckExperts reports, for a decision of the right shape, the first expert
// id outside [0, experts) (Dropped aside) or named twice by one token, in
// token order: what a caller-made decision must satisfy before dispatch.
func (d *Decision) CheckExperts(experts int) error {
	if err := d.checkShape(); err != nil {
		return err
	}
	for t := range d.Tokens {
		ids := d.Expert[t*d.K : (t+1)*d.K]
		for s, e := range ids {
			if e == Dropped {
				continue
			}
			if e < 0 || int(e) >= experts {
				return outOfRange(t, s, e, experts)
			}
			for p := range s {
				if ids[p] == e {
					return invalidf("token %d: expert %d in both slot %d and slot %d", t, e, p, s)
				}
			}
		}
	}
	return nil
}

// Gate is a top-k softmax gate over Experts experts choosing K of them per
// token. The zero value is not usable: set both fields.
type Gate struct {
	Experts int
	K       int
}

func (g Gate) check() error {
	if g.Experts < 1 {
		return invalidf("gate with %d experts, want >= 1", g.Experts)
	}
	if g.K < 1 || g.K > g.Experts {
		return invalidf("gate k %d, want 1 <= k <= experts (%d)", g.K, g.Experts)
	}
	return nil
}

// Route fills d with the top-K experts of each token. logits is row-major,
// tokens rows of g.Experts router logits.
//
// Experts are ranked by logit, which is the same as ranking by softmax
// probability because softmax is monotone; equal logits go to the lower expert
// id. Slots are ordered by that ranking: slot 0 holds the highest-weight
// expert. The weights are the softmax probabilities of the chosen experts
// renormalised to sum to 1 (softmax restricted to the chosen logits, computed
// in float64).
//
// A logit of -Inf masks an expert: it is chosen only when fewer than K experts
// are finite, and then with weight 0. NaN and +Inf logits, and rows whose
// logits are all -Inf, are rejected. Route does not allocate when d already
// has room for tokens*K slots; on error d's contents are unspecified.
func (g Gate) Route(logits []float32, tokens int, d *Decision) error {
	if err := g.check(); err != nil {
		return err
	}
	if d == nil {
		return invalidf("nil decision")
	}
	if tokens < 0 || tokens > maxSlots/g.K {
		return invalidf("tokens %d, want 0 <= tokens <= %d for k %d", tokens, maxSlots/g.K, g.K)
	}
	E, K := g.Experts, g.K
	if tokens > math.MaxInt/E || len(logits) != tokens*E {
		return invalidf("logits length %d, want tokens %d x experts %d", len(logits), tokens, E)
	}
	d.resize(tokens, K)
	if K == 2 {
		return route2(logits, tokens, E, d)
	}
	return routeK(logits, tokens, E, K, d)
}

// routeK is Route for any k, on a decision already sized.
func routeK(logits []float32, tokens, E, K int, d *Decision) error {
	for t := range tokens {
		row := logits[t*E : (t+1)*E]
		sel := d.Expert[t*K : (t+1)*K]
		n := 0 // experts selected so far, sel[:n] sorted by (logit desc, id asc)
		for e, v := range row {
			if !(v <= math.MaxFloat32) { // NaN or +Inf
				return badLogit(t, e, v)
			}
			i := n
			if n == K {
				// Full: v must beat the weakest strictly, since every earlier
				// expert has a lower id and wins ties.
				if !(v > row[sel[K-1]]) {
					continue
				}
				i = K - 1
			} else {
				n++
			}
			for i > 0 && v > row[sel[i-1]] {
				sel[i] = sel[i-1]
				i--
			}
			sel[i] = int32(e)
		}
		top := float64(row[sel[0]])
		if math.IsInf(top, -1) {
			return invalidf("token %d: every logit is -Inf", t)
		}
		w := d.Weight[t*K : (t+1)*K]
		sum := 0.0
		for s, e := range sel {
			x := 1.0 // exp(0): slot 0 holds the top logit
			if s > 0 {
				x = math.Exp(float64(row[e]) - top)
			}
			w[s] = float32(x)
			sum += x
		}
		for s := range w {
			w[s] = float32(float64(w[s]) / sum)
		}
	}
	return nil
}

// route2 is routeK for k = 2, the common top-2 gate: the same selection and
// arithmetic, bit for bit, with the two leaders kept in registers.
func route2(logits []float32, tokens, E int, d *Decision) error {
	for t := range tokens {
		row := logits[t*E : (t+1)*E]
		// The first two experts fill the slots in (logit desc, id asc) order;
		// a later one must beat a leader strictly, since every earlier expert
		// has a lower id and wins ties.
		i0, i1, v0, v1 := 0, 1, row[0], row[1] // k <= experts: row has two logits
		if !(v0 <= math.MaxFloat32) {          // NaN or +Inf
			return badLogit(t, 0, v0)
		}
		if !(v1 <= math.MaxFloat32) {
			return badLogit(t, 1, v1)
		}
		if v1 > v0 {
			i0, i1, v0, v1 = 1, 0, v1, v0
		}
		for e := 2; e < len(row); e++ {
			v := row[e]
			if !(v <= math.MaxFloat32) {
				return badLogit(t, e, v)
			}
			if v > v1 {
				if v > v0 {
					i1, v1 = i0, v0
					i0, v0 = e, v
				} else {
					i1, v1 = e, v
				}
			}
		}
		top := float64(v0)
		if math.IsInf(top, -1) {
			return invalidf("token %d: every logit is -Inf", t)
		}
		x := math.Exp(float64(v1) - top)
		sum := 1 + x
		d.Expert[2*t], d.Expert[2*t+1] = int32(i0), int32(i1)
		d.Weight[2*t] = float32(1 / sum)
		d.Weight[2*t+1] = float32(float64(float32(x)) / sum)
	}
	return nil
}

func badLogit(t, e int, v float32) error {
	return invalidf("token %d expert %d: logit %v, want a number below +Inf", t, e, v)
}

// FromAssignments fills d with caller-chosen experts and weights, both of
// length tokens*k in (token, slot) order. An expert id may be Dropped (its
// weight is then ignored and stored as 0); otherwise it must be in
// [0, experts) and appear at most once per token. Weights must be finite and
// non-negative; they are stored as given, not renormalised. FromAssignments
// does not allocate when d already has room; on error d's contents are
// unspecified.
func FromAssignments(expert []int32, weight []float32, tokens, k, experts int, d *Decision) error {
	if err := (Gate{Experts: experts, K: k}).check(); err != nil {
		return err
	}
	if d == nil {
		return invalidf("nil decision")
	}
	if tokens < 0 || tokens > maxSlots/k {
		return invalidf("tokens %d, want 0 <= tokens <= %d for k %d", tokens, maxSlots/k, k)
	}
	n := tokens * k
	if len(expert) != n {
		return invalidf("expert ids length %d, want tokens %d x k %d", len(expert), tokens, k)
	}
	if len(weight) != n {
		return invalidf("weights length %d, want tokens %d x k %d", len(weight), tokens, k)
	}
	d.resize(tokens, k)
	copy(d.Expert, expert)
	if err := d.CheckExperts(experts); err != nil {
		return err
	}
	for i, e := range d.Expert {
		w := weight[i]
		switch {
		case e == Dropped:
			w = 0
		case !(w >= 0) || w > math.MaxFloat32:
			return invalidf("token %d slot %d: weight %v, want finite and >= 0", i/k, i%k, w)
		}
		d.Weight[i] = w
	}
	return nil
}
