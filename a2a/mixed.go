package a2a

import (
	"errors"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// mixedTransport routes every peer to the transport of its link class: shared
// memory for ranks on this host, TCP for the others. The engine sees one
// transport.
type mixedTransport struct {
	byPeer []transport.Transport
	slots  []transport.Slots // byPeer's one-sided window, nil where it has none
	parts  []transport.Transport
	// windows are the parts with a one-sided window, once each.
	windows []transport.Slots
}

// mixedPark bounds each park on one part while the other may be the one that
// becomes ready: shm parks on a futex and TCP on epoll, which one thread
// cannot wait on together. The engine only parks after spinning and yielding,
// so this costs at most this much extra latency on an otherwise idle rank.
const mixedPark = 100 * time.Microsecond

func (m *mixedTransport) Name() string {
	name := ""
	for i, p := range m.parts {
		if i > 0 {
			name += "+"
		}
		name += p.Name()
	}
	return name
}

func (m *mixedTransport) Streams() int { return m.parts[0].Streams() }

func (m *mixedTransport) Conn(peer, stream int) transport.Conn {
	return m.byPeer[peer].Conn(peer, stream)
}

func (m *mixedTransport) Wait(timeout time.Duration) error {
	if len(m.parts) == 1 {
		return m.parts[0].Wait(timeout)
	}
	for i, p := range m.parts {
		d := time.Duration(0)
		if i == 0 {
			d = min(timeout, mixedPark)
		}
		if err := p.Wait(d); err != nil {
			return err
		}
	}
	return nil
}

func (m *mixedTransport) Wake() {
	for _, p := range m.parts {
		p.Wake()
	}
}

func (m *mixedTransport) Stats() transport.Stats {
	var s transport.Stats
	for _, p := range m.parts {
		ps := p.Stats()
		s.Rejected += ps.Rejected
		if s.BytesSent == nil {
			s.BytesSent = make([]uint64, len(ps.BytesSent))
			s.BytesReceived = make([]uint64, len(ps.BytesReceived))
		}
		for i := range min(len(s.BytesSent), len(ps.BytesSent)) {
			s.BytesSent[i] += ps.BytesSent[i]
		}
		for i := range min(len(s.BytesReceived), len(ps.BytesReceived)) {
			s.BytesReceived[i] += ps.BytesReceived[i]
		}
	}
	return s
}

func (m *mixedTransport) Close() error {
	var errs []error
	for _, p := range m.parts {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

var _ transport.Slots = (*mixedTransport)(nil)

// slotsOf is the one-sided window that reaches peer, or nil.
func (m *mixedTransport) slotsOf(peer int) transport.Slots {
	if peer < 0 || peer >= len(m.slots) {
		return nil
	}
	return m.slots[peer]
}

// SlotBytes is the LL slot capacity to peer: the shm part's for ranks on
// this host, 0 for the others (their LL messages travel as frames).
func (m *mixedTransport) SlotBytes(peer int) int {
	if s := m.slotsOf(peer); s != nil {
		return s.SlotBytes(peer)
	}
	return 0
}

func (m *mixedTransport) Store(peer int, epoch, tag uint32, data []byte) error {
	s := m.slotsOf(peer)
	if s == nil {
		return fault.New(fault.ErrInvalidArgument, peer, "no LL slot to rank %d", peer)
	}
	return s.Store(peer, epoch, tag, data)
}

func (m *mixedTransport) Load(peer int, epoch, tag uint32, dst []byte, anyLen bool, st *transport.SlotLoad) (bool, error) {
	s := m.slotsOf(peer)
	if s == nil {
		return false, fault.New(fault.ErrInvalidArgument, peer, "no LL slot from rank %d", peer)
	}
	return s.Load(peer, epoch, tag, dst, anyLen, st)
}

// Rebalance rebalances every part that can.
func (m *mixedTransport) Rebalance() {
	for _, p := range m.parts {
		if pl, ok := p.(transport.Placer); ok {
			pl.Rebalance()
		}
	}
}

// BeginBatch starts a batch on every part with a one-sided window.
func (m *mixedTransport) BeginBatch() bool {
	for i, w := range m.windows {
		if !w.BeginBatch() {
			for _, begun := range m.windows[:i] {
				begun.EndBatch()
			}
			return false
		}
	}
	return true
}

// EndBatch ends the batch on every part with a one-sided window.
func (m *mixedTransport) EndBatch() {
	for _, w := range m.windows {
		w.EndBatch()
	}
}
