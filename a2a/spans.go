package a2a

import (
	"cmp"
	"context"
	"errors"
	"slices"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/internal/engine"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// Span is Len bytes of a buffer from byte Off: one piece of what
// AllToAllVSpans sends to or receives from a rank.
type Span struct {
	Off, Len int
}

// ErrOverlap is what AllToAllVSpans fails with, besides ErrInvalidArgument,
// when two receive spans share a byte: the order in which the bytes of
// different ranks arrive is not defined, so neither would be.
var ErrOverlap = errors.New("receive spans overlap")

// spanState is the Comm's scratch for AllToAllVSpans, made at its first call
// and reused, so that a steady-state call allocates nothing.
type spanState struct {
	sendCounts, recvCounts []int
	send, recv             engine.GatherMap
	sorted                 []Span
}

// AllToAllVSpans is AllToAllV with gather and scatter lists instead of
// contiguous blocks: rank j receives the bytes of send under sendSpans[j],
// span after span, as one message, and the message from rank i lands in
// recv under recvSpans[i], span after span. No byte is packed or unpacked on
// the way: TCP sends and receives the spans with one sendmsg or readv per
// piece of up to 256 KiB, shared memory reads them from the sender's memory
// with process_vm_readv and iovec lists on both sides (or copies them
// straight between the spans and its ring), and transports without vectored
// I/O get them packed by the engine.
//
// Spans may be empty. Send spans may overlap (a row sent to two ranks);
// receive spans must not (ErrOverlap, which also matches
// ErrInvalidArgument). A span outside its buffer is ErrInvalidArgument. The
// bytes rank i sends this rank (the sum of its sendSpans[this rank]'s
// lengths) must equal the sum of recvSpans[i]'s lengths, or the receiver
// fails with ErrMismatch, as in AllToAllV. Both lists have one entry per
// rank; the lists themselves may be reused as soon as the call returns.
//
// The message of each pair travels like an AllToAllV block, by pairwise or
// fullmesh (the forced staged, skew and ll use fullmesh here: they stage or
// store blocks contiguously), so ranks of one host still exchange a message
// per pair.
func (c *Comm) AllToAllVSpans(ctx context.Context, send []byte, sendSpans [][]Span, recv []byte, recvSpans [][]Span) error {
	return c.exchange(ctx, "alltoallv", "AllToAllVSpans", func(seq uint64) (algo.Algo, []int, []int, error) {
		if c.scratch.spans == nil {
			c.scratch.spans = &spanState{sendCounts: make([]int, c.size), recvCounts: make([]int, c.size)}
		}
		st := c.scratch.spans
		if err := c.mapSpans(&st.send, st.sendCounts, "send", send, sendSpans); err != nil {
			return algo.AlgoAuto, nil, nil, err
		}
		if err := c.mapSpans(&st.recv, st.recvCounts, "recv", recv, recvSpans); err != nil {
			return algo.AlgoAuto, nil, nil, err
		}
		if err := st.checkOverlap(c.rank, recvSpans); err != nil {
			return algo.AlgoAuto, nil, nil, err
		}
		if st.sendCounts[c.rank] != st.recvCounts[c.rank] {
			return algo.AlgoAuto, nil, nil, fault.New(fault.ErrInvalidArgument, c.rank, "AllToAllVSpans: %d bytes to this rank, %d to receive from it", st.sendCounts[c.rank], st.recvCounts[c.rank])
		}
		a, err := c.spansRun(ctx, seq)
		return a, st.sendCounts, st.recvCounts, err
	})
}

// mapSpans checks one side's span lists against buf, fills counts with
// their totals by rank and lays them out in m.
func (c *Comm) mapSpans(m *engine.GatherMap, counts []int, what string, buf []byte, spans [][]Span) error {
	if len(spans) != c.size {
		return fault.New(fault.ErrInvalidArgument, c.rank, "AllToAllVSpans: %d %s span lists, want %d ranks", len(spans), what, c.size)
	}
	m.Reset(buf)
	for r, list := range spans {
		n := 0
		for i, s := range list {
			if s.Off < 0 || s.Len < 0 || s.Off > len(buf) || s.Len > len(buf)-s.Off {
				return fault.New(fault.ErrInvalidArgument, c.rank, "AllToAllVSpans: %s span %d of rank %d is [%d:+%d] of a %d-byte buffer", what, i, r, s.Off, s.Len, len(buf))
			}
			n += s.Len
			m.Add(s.Off, s.Len)
		}
		counts[r] = n
	}
	return nil
}

// checkOverlap fails when two non-empty receive spans share a byte. Spans
// given in ascending order (the usual case) are checked in one pass; others
// are sorted in the Comm's scratch first.
func (st *spanState) checkOverlap(rank int, spans [][]Span) error {
	st.sorted = st.sorted[:0]
	inOrder := true
	for _, list := range spans {
		for _, s := range list {
			if s.Len == 0 {
				continue
			}
			if n := len(st.sorted); n > 0 && st.sorted[n-1].Off > s.Off {
				inOrder = false
			}
			st.sorted = append(st.sorted, s)
		}
	}
	if !inOrder {
		slices.SortFunc(st.sorted, func(a, b Span) int { return cmp.Compare(a.Off, b.Off) })
	}
	for i := 1; i < len(st.sorted); i++ {
		if p, s := st.sorted[i-1], st.sorted[i]; p.Off+p.Len > s.Off {
			return fault.Wrap(fault.ErrInvalidArgument, rank, ErrOverlap, "AllToAllVSpans: receive spans [%d:+%d] and [%d:+%d] overlap", p.Off, p.Len, s.Off, s.Len)
		}
	}
	return nil
}

// spansRun plans the exchange of the mapped spans on their virtual buffers
// and runs it.
func (c *Comm) spansRun(ctx context.Context, seq uint64) (algo.Algo, error) {
	st := c.scratch.spans
	a := c.plan.algo
	if a != algo.AlgoPairwise {
		a = algo.AlgoFullmesh
	}
	sched, _, err := c.planFlat("alltoallvspans", a, st.sendCounts, st.recvCounts, false)
	if err != nil {
		return a, err
	}
	c.setLastAlgo(a)
	c.eng.SetVirtual(&st.send, &st.recv)
	err = c.eng.Run(ctx, transport.OpAllToAllV, seq, 0, sched, &c.scratch.bufs)
	c.eng.SetVirtual(nil, nil)
	st.send.Release() // do not keep the caller's buffers
	st.recv.Release()
	// Every pair exchanged a frame, as in alltoallv: the LL epoch advances.
	c.eng.NextLLEpoch()
	return a, err
}
