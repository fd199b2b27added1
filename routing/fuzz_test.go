package routing

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// floats decodes b as little-endian float32s (NaN, ±Inf, subnormals and all).
func floats(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// FuzzRoute routes arbitrary gate logits (NaN, ±Inf, any shape) through
// Gate.Route, then drops by capacity and builds the dispatch permutation over
// a placement. Nothing may panic; every refusal wraps ErrInvalid; a routed
// decision names each token's experts in range and at most once, with finite
// weights in [0, 1], and survives Capacity.Apply and Plan.Build, whose rows
// account for every kept assignment.
func FuzzRoute(f *testing.F) {
	le := func(v ...float32) []byte {
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
		return b
	}
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	f.Add(le(1, 2, 3, 4, 4, 3, 2, 1), uint8(4), uint8(2), uint8(2), uint8(2), 1.25)
	f.Add(le(-inf, -inf, 0, -inf, 1, 2), uint8(3), uint8(2), uint8(2), uint8(1), 0.0)
	f.Add(le(nan, 1, 2, 3), uint8(4), uint8(1), uint8(1), uint8(3), 1.0)
	f.Add(le(inf, 1, 2, 3), uint8(2), uint8(3), uint8(2), uint8(2), math.Inf(1))
	f.Add(le(1e38, -1e38, 3.4028235e38, -3.4028235e38), uint8(4), uint8(4), uint8(1), uint8(5), 0.5)
	f.Fuzz(func(t *testing.T, raw []byte, experts, k, tokens, ranks uint8, factor float64) {
		logits := floats(raw)
		g := Gate{Experts: int(experts), K: int(k)}
		var d Decision
		err := g.Route(logits, int(tokens), &d)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Route: %v, want ErrInvalid", err)
			}
			return
		}
		if err := d.CheckExperts(g.Experts); err != nil {
			t.Fatalf("Route(%v) made a decision that fails its check: %v", logits, err)
		}
		for i, w := range d.Weight {
			if !(w >= 0 && w <= 1) {
				t.Fatalf("Route(%v): weight %v at %d", logits, w, i)
			}
		}
		dropped, err := Capacity{Factor: factor}.Apply(&d, g.Experts, nil)
		if err != nil || dropped < 0 || d.Kept()+dropped != d.Tokens*d.K {
			t.Fatalf("Capacity{%v}.Apply: dropped %d, kept %d of %d: %v", factor, dropped, d.Kept(), d.Tokens*d.K, err)
		}
		pl, err := Contiguous(g.Experts, 1+int(ranks)%8)
		if err != nil {
			t.Fatalf("Contiguous(%d, %d): %v", g.Experts, 1+int(ranks)%8, err)
		}
		var p Plan
		if err := p.Build(&d, pl); err != nil {
			t.Fatalf("Build: %v", err)
		}
		if p.Rows != d.Kept() {
			t.Fatalf("plan of %d rows for %d kept assignments", p.Rows, d.Kept())
		}
	})
}

// FuzzFromAssignments hands FromAssignments caller-made expert ids (out of
// range, repeated, Dropped) and weights (NaN, ±Inf, negative). It refuses
// with ErrInvalid or stores a decision that passes CheckExperts with finite,
// non-negative weights.
func FuzzFromAssignments(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 0, 0, 0}, []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0x3f}, uint8(1), uint8(2), uint8(4))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 9, 0, 0, 0}, []byte{0, 0, 0xc0, 0x7f, 0, 0, 0x80, 0xff}, uint8(2), uint8(1), uint8(4))
	f.Fuzz(func(t *testing.T, rawExperts, rawWeights []byte, tokens, k, experts uint8) {
		ids := make([]int32, len(rawExperts)/4)
		for i := range ids {
			ids[i] = int32(binary.LittleEndian.Uint32(rawExperts[4*i:]))
		}
		var d Decision
		err := FromAssignments(ids, floats(rawWeights), int(tokens), int(k), int(experts), &d)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("FromAssignments: %v, want ErrInvalid", err)
			}
			return
		}
		if err := d.CheckExperts(int(experts)); err != nil {
			t.Fatalf("FromAssignments stored a decision that fails its check: %v", err)
		}
		for i, w := range d.Weight {
			if !(w >= 0) || math.IsInf(float64(w), 0) || (d.Expert[i] == Dropped && w != 0) {
				t.Fatalf("weight %v for expert %d at %d", w, d.Expert[i], i)
			}
		}
	})
}
