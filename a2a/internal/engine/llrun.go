package engine

import (
	"context"
	"encoding/binary"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// LLPlan is a one-round schedule of one-sided stores, loads and local
// copies resolved once against fixed buffers, for a collective that runs
// it many times (a persistent collective, or a loop of blocking calls over
// the same buffers): RunLL does what Run's post does for such a round (the
// step switch, the peer and span checks, the load records) with a copy of
// records made at PlanLL, then the same progress. A message may carry the
// collective's signature and be reduced on arrival (a 2-rank AllReduce);
// count announcements do not qualify, and every peer the round stores to
// or loads from needs a slot.
type LLPlan struct {
	tag     uint32 // the op kind
	aux     uint64 // the collective's signature, after every message's data (0: none)
	reducer reduction
	stores  []llStoreRec
	loads   []llLoad // the load records, copied into llState.loads per run
	copies  []localCopy
	// traffic is one run's bytes by direction and host, counted at PlanLL:
	// a run adds it whole rather than message by message.
	traffic Traffic
}

// llStoreRec is a store of an LLPlan: the message and its peer's slots.
// With a signature the message is stored from signed, the data followed by
// the signature, which PlanLL wrote there once: each run copies data in
// front of it.
type llStoreRec struct {
	peer   int
	slots  transport.Slots
	data   []byte
	signed []byte
}

// PlanLL resolves s over bufs for RunLL; aux is the signature Run would be
// given. It returns nil when s does not qualify (more than one round, a
// step other than a plain or reducing load, a store or a copy, a count
// announcement, scratch used other than as a reducing load's landing, a
// peer without a slot or with too small a one, a crowded host, whose
// stores Run leaves for the end of the round), and Run must run it. A
// reducing load lands in a buffer of the plan's own, not in scratch, so
// the plan holds no span of the engine's scratch, which later operations
// may grow.
func (e *Engine) PlanLL(kind transport.OpKind, aux uint64, s *algo.Schedule, bufs *Buffers) *LLPlan {
	if e.ll.window == nil || s.NumRounds() != 1 || e.wait.Crowded {
		return nil
	}
	scratch := bufs[algo.BufScratch]
	bufs[algo.BufScratch] = nil // a step addressing scratch fails to resolve
	defer func() { bufs[algo.BufScratch] = scratch }()
	p := &LLPlan{tag: uint32(kind), aux: aux, reducer: reductionOf(s)}
	sig := 0
	if aux != 0 {
		sig = 8
	}
	for _, st := range s.Round(0) {
		if st.CountOnly {
			return nil
		}
		switch st.Kind {
		case algo.StepStore, algo.StepLoad:
			if st.Peer < 0 || st.Peer >= e.size || st.Peer == e.rank || e.ll.room[st.Peer] == 0 {
				return nil
			}
			if st.Kind == algo.StepStore {
				if st.With.Len > 0 {
					return nil
				}
				data, err := bufs.span(st.Src)
				if err != nil || len(data)+sig > e.ll.room[st.Peer] {
					return nil
				}
				rec := llStoreRec{peer: st.Peer, slots: e.ll.slotOf[st.Peer], data: data}
				if sig > 0 {
					rec.signed = binary.LittleEndian.AppendUint64(make([]byte, len(data), len(data)+sig), aux)
				}
				p.stores = append(p.stores, rec)
				p.traffic.Add(true, e.op.sameHost[st.Peer], len(data))
				continue
			}
			l, ok := p.planLoad(&st, bufs, sig)
			if !ok {
				return nil
			}
			l.peer, l.slots = st.Peer, e.ll.slotOf[st.Peer]
			p.loads = append(p.loads, l)
			p.traffic.Add(false, e.op.sameHost[st.Peer], st.Dst.Len)
		case algo.StepCopy:
			src, dst, err := bufs.srcDst(&st)
			if err != nil {
				return nil
			}
			if len(dst) > 0 && &dst[0] != &src[0] {
				p.copies = append(p.copies, localCopy{dst: dst, src: src})
			}
		default:
			return nil
		}
	}
	return p
}

// planLoad resolves a load step of an LLPlan: where the message lands and,
// with a signature (sig bytes after the data), where its data goes once the
// signature checked out; a reducing load also gets what it reduces into and
// with. A reducing or signed message lands in a buffer of the plan's own.
func (p *LLPlan) planLoad(st *algo.Step, bufs *Buffers, sig int) (llLoad, bool) {
	l := llLoad{count: st.Dst.Len}
	n := st.Dst.Len
	if st.With.Len > 0 {
		n = st.Src.Len // the landing; Dst receives the reduction
		var err error
		if l.into, l.with, err = reduceSpans(bufs, st, n); err != nil {
			return l, false
		}
		l.landedFirst = st.LandedFirst
		l.dst = make([]byte, n+sig)
		if sig > 0 {
			l.sigDst = l.dst[:n] // the data stays where it landed
		}
		return l, true
	}
	dst, err := bufs.span(st.Dst)
	if err != nil {
		return l, false
	}
	l.dst = dst
	if sig > 0 {
		l.dst, l.sigDst = make([]byte, n+sig), dst
	}
	return l, true
}

// RunLL runs p for the running operation, as Run runs the schedule p was
// planned from (StartOp first, and the caller moves the LL epoch after
// it, as after Run).
func (e *Engine) RunLL(ctx context.Context, p *LLPlan) error {
	e.aux, e.reducer = p.aux, p.reducer
	e.ll.tag = p.tag
	w := e.ll.window
	if !w.BeginBatch() {
		return fault.New(fault.ErrClosed, -1, "transport closed")
	}
	defer w.EndBatch()
	rd := &e.round
	rd.active, rd.nSend, rd.nRecv = rd.active[:0], 0, 0
	rd.copies, rd.copied = append(rd.copies[:0], p.copies...), 0
	e.op.traffic.merge(&p.traffic)
	for i := range p.stores {
		st := &p.stores[i]
		data := st.data
		if st.signed != nil {
			copy(st.signed, data)
			data = st.signed
		}
		if err := st.slots.Store(st.peer, e.ll.epoch, e.ll.tag, data); err != nil {
			return fault.ForPeer(st.peer, err)
		}
	}
	e.ll.loads = append(e.ll.loads[:0], p.loads...) // fresh load states: the records' are zero
	e.ll.left = len(e.ll.loads)
	return e.progress(ctx)
}
