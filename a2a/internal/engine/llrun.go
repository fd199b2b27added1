package engine

import (
	"context"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// LLPlan is a one-round schedule of one-sided stores, loads and local
// copies resolved once against fixed buffers, for a persistent collective
// that runs it many times: RunLL does what Run's post does for such a round
// (the step switch, the peer and span checks, the load records) with a
// copy of records made at PlanLL, then the same progress. Only plain
// messages qualify: no signature (aux), count announcement or reduction on
// arrival, and a slot to every peer the round stores to or loads from.
type LLPlan struct {
	tag    uint32 // the op kind
	stores []llStoreRec
	loads  []llLoad // the load records, copied into llState.loads per run
	copies []localCopy
	// traffic is one run's bytes by direction and host, counted at PlanLL:
	// a run adds it whole rather than message by message.
	traffic Traffic
}

// llStoreRec is a store of an LLPlan: the message and its peer's slots.
type llStoreRec struct {
	peer  int
	slots transport.Slots
	data  []byte
}

// PlanLL resolves s over bufs for RunLL; nil when s does not qualify (more
// than one round, scratch, a step other than a plain store, load or copy,
// a peer without a slot or with too small a one, a crowded host, whose
// stores Run leaves for the end of the round), and Run must run it.
func (e *Engine) PlanLL(kind transport.OpKind, s *algo.Schedule, bufs *Buffers) *LLPlan {
	if e.ll.window == nil || s.NumRounds() != 1 || s.ScratchBytes != 0 || e.wait.Crowded {
		return nil
	}
	p := &LLPlan{tag: uint32(kind)}
	for _, st := range s.Round(0) {
		if st.CountOnly || st.With.Len > 0 {
			return nil
		}
		switch st.Kind {
		case algo.StepStore, algo.StepLoad:
			if st.Peer < 0 || st.Peer >= e.size || st.Peer == e.rank || e.ll.room[st.Peer] == 0 {
				return nil
			}
			if st.Kind == algo.StepStore {
				data, err := bufs.span(st.Src)
				if err != nil || len(data) > e.ll.room[st.Peer] {
					return nil
				}
				p.stores = append(p.stores, llStoreRec{peer: st.Peer, slots: e.ll.slotOf[st.Peer], data: data})
				p.traffic.Add(true, e.op.sameHost[st.Peer], len(data))
				continue
			}
			dst, err := bufs.span(st.Dst)
			if err != nil {
				return nil
			}
			p.loads = append(p.loads, llLoad{peer: st.Peer, slots: e.ll.slotOf[st.Peer], dst: dst, count: st.Dst.Len})
			p.traffic.Add(false, e.op.sameHost[st.Peer], len(dst))
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

// RunLL runs p for the running operation, as Run runs the schedule p was
// planned from (StartOp first, and the caller moves the LL epoch after
// it, as after Run).
func (e *Engine) RunLL(ctx context.Context, p *LLPlan) error {
	e.aux = 0
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
		if err := st.slots.Store(st.peer, e.ll.epoch, e.ll.tag, st.data); err != nil {
			return fault.ForPeer(st.peer, err)
		}
	}
	e.ll.loads = append(e.ll.loads[:0], p.loads...) // fresh load states: the records' are zero
	e.ll.left = len(e.ll.loads)
	return e.progress(ctx)
}
