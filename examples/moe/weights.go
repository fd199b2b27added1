package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"syscall"

	"github.com/a2a-moe/a2a/routing"
)

// weights are the experts this rank hosts: its own copies of their
// parameters, the only ones its expert compute reads. The layer's
// re-placement (--rebalance-every) moves them between ranks through
// dispatch.Replace, with weights as the dispatch.ExpertMover: an expert a
// rank did not start with runs on parameters that came over the data plane,
// and the verification against the seed's model checks that they arrived
// intact.
type weights struct {
	m      *model
	hosted map[int]*expert
	die    bool // --kill-in-replace: SIGKILL this rank in its first Import
}

// newWeights copies the model's experts that rank hosts under pl.
func newWeights(m *model, pl *routing.Placement, rank int) *weights {
	w := &weights{m: m, hosted: map[int]*expert{}}
	w.load(pl, rank)
	return w
}

// load copies from the model (a checkpoint, in a real job) the experts rank
// hosts under pl but does not hold: after a shrink, the lost rank's.
func (w *weights) load(pl *routing.Placement, rank int) {
	spr := pl.SlotsPerRank()
	for s := rank * spr; s < (rank+1)*spr; s++ {
		if e := pl.SlotExpert(s); e != routing.EmptySlot && w.hosted[e] == nil {
			x := w.m.experts[e].clone()
			w.hosted[e] = &x
		}
	}
}

// keep drops the experts rank no longer hosts under pl.
func (w *weights) keep(pl *routing.Placement, rank int) {
	spr := pl.SlotsPerRank()
	here := map[int]bool{}
	for s := rank * spr; s < (rank+1)*spr; s++ {
		here[pl.SlotExpert(s)] = true
	}
	for e := range w.hosted {
		if !here[e] {
			delete(w.hosted, e)
		}
	}
}

// get returns hosted expert e.
func (w *weights) get(e int) (*expert, error) {
	if x := w.hosted[e]; x != nil {
		return x, nil
	}
	return nil, fmt.Errorf("expert %d runs here without its weights", e)
}

// Export encodes hosted expert e: W1, b1, W2, b2 as little-endian float32.
func (w *weights) Export(e int) ([]byte, error) {
	x, err := w.get(e)
	if err != nil {
		return nil, err
	}
	var b []byte
	for _, part := range x.parts() {
		for _, v := range part {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
	}
	return b, nil
}

// Import decodes expert e's parameters, as Export encoded them.
func (w *weights) Import(e int, b []byte) error {
	if w.die {
		// As kill -9 from outside would, after the weights moved and
		// before this rank's vote: no rank may switch placement.
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	H, F := w.m.o.hidden, w.m.o.ffn
	x := expert{w1: make([]float32, F*H), b1: make([]float32, F), w2: make([]float32, H*F), b2: make([]float32, H)}
	if len(b) != 4*(2*F*H+F+H) {
		return fmt.Errorf("expert %d: %d bytes of parameters, want %d", e, len(b), 4*(2*F*H+F+H))
	}
	for _, part := range x.parts() {
		for i := range part {
			part[i] = math.Float32frombits(binary.LittleEndian.Uint32(b))
			b = b[4:]
		}
	}
	w.hosted[e] = &x
	return nil
}

func (x *expert) parts() [][]float32 { return [][]float32{x.w1, x.b1, x.w2, x.b2} }

func (x expert) clone() expert {
	return expert{w1: append([]float32(nil), x.w1...), b1: append([]float32(nil), x.b1...),
		w2: append([]float32(nil), x.w2...), b2: append([]float32(nil), x.b2...)}
}
