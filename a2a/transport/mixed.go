package transport

import (
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// Mixed routes every peer to the Transport that reaches it (shared memory
// for ranks of this host, verbs or TCP for the others) and shows the engine
// one Transport. It composes any number of parts.
//
// Parking rule: a part whose readiness a descriptor shows (Poller: TCP's
// epoll set, a verbs completion channel) can be waited on together with the
// others of its kind in one epoll set. A part that parks otherwise (shm's
// futex) cannot join such a set, so while there is one, the first of them
// parks for at most MixedPark and the rest are polled after it; without one,
// Wait sleeps on the epoll set of all parts for the whole timeout. The
// engine parks only after spinning and yielding, so the turns cost at most
// MixedPark of extra latency on an otherwise idle rank.
type Mixed struct {
	byPeer []Transport
	slots  []Slots // byPeer's one-sided window, nil where it has none
	parts  []Transport
	// windows are the parts with a one-sided window, once each.
	windows []Slots
	// plain are the parts that are not Pollers, polled the parts that are.
	plain, polled []Transport
	epfd          int // epoll set of the polled parts' descriptors; -1 when unused
	noPwait2      atomic.Bool
	guard         Guard // protects epfd
}

// MixedPark bounds each park on a part that cannot share an epoll set while
// another part may be the one that becomes ready.
const MixedPark = 100 * time.Microsecond

var (
	_ Transport = (*Mixed)(nil)
	_ Slots     = (*Mixed)(nil)
	_ PeerSlots = (*Mixed)(nil)
)

// NewMixed composes parts, which must be distinct and non-nil, into one
// Transport; byPeer[r] is the part that reaches rank r (nil for this rank).
// The first part that is not a Poller is the one that parks. NewMixed fails
// only when the epoll set for the polled parts cannot be made; it then
// closes nothing.
func NewMixed(parts []Transport, byPeer []Transport) (*Mixed, error) {
	m := &Mixed{byPeer: byPeer, parts: parts, slots: make([]Slots, len(byPeer)), epfd: -1}
	for r, tr := range byPeer {
		if tr != nil {
			m.slots[r], _ = tr.(Slots)
		}
	}
	for _, p := range parts {
		if w, ok := p.(Slots); ok {
			m.windows = append(m.windows, w)
		}
		if _, ok := p.(Poller); ok {
			m.polled = append(m.polled, p)
		} else {
			m.plain = append(m.plain, p)
		}
	}
	if len(parts) > 1 && len(m.plain) == 0 {
		epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			return nil, fault.Wrap(fault.ErrClosed, -1, err, "transport: epoll set of the composed transports")
		}
		for _, p := range m.polled {
			ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(p.(Poller).PollFD())}
			if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, int(ev.Fd), &ev); err != nil {
				unix.Close(epfd)
				return nil, fault.Wrap(fault.ErrClosed, -1, err, "transport: epoll set of the composed transports")
			}
		}
		m.epfd = epfd
	}
	return m, nil
}

// Name joins the parts' names with "+", in the order of the parts.
func (m *Mixed) Name() string {
	names := make([]string, len(m.parts))
	for i, p := range m.parts {
		names[i] = p.Name()
	}
	return strings.Join(names, "+")
}

// Streams is the parts' number of streams per peer pair (equal on all).
func (m *Mixed) Streams() int { return m.parts[0].Streams() }

// Conn is the stream-th stream to peer of the part that reaches it.
func (m *Mixed) Conn(peer, stream int) Conn { return m.byPeer[peer].Conn(peer, stream) }

// PeerTransport is the part that reaches peer (nil for this rank).
func (m *Mixed) PeerTransport(peer int) Transport { return m.byPeer[peer] }

// Wait parks as the type's doc says.
func (m *Mixed) Wait(timeout time.Duration) error {
	if len(m.parts) == 1 {
		return m.parts[0].Wait(timeout)
	}
	if len(m.plain) == 0 {
		if err := m.sleep(timeout); err != nil {
			return err
		}
		return m.drain(m.polled)
	}
	if err := m.plain[0].Wait(min(timeout, MixedPark)); err != nil {
		return err
	}
	if err := m.drain(m.plain[1:]); err != nil {
		return err
	}
	return m.drain(m.polled)
}

// sleep waits on the polled parts' epoll set until one is ready or timeout
// passes.
func (m *Mixed) sleep(timeout time.Duration) error {
	if !m.guard.Acquire() {
		return fault.New(fault.ErrClosed, -1, "transport: closed")
	}
	defer m.guard.Release()
	var evs [8]unix.EpollEvent
	if _, err := EpollWait(m.epfd, evs[:], timeout, &m.noPwait2); err != nil && err != unix.EINTR {
		return fault.Wrap(fault.ErrClosed, -1, err, "transport: epoll_wait")
	}
	return nil
}

// drain lets each part take in what made it ready (a Wake, a doorbell)
// without sleeping.
func (m *Mixed) drain(parts []Transport) error {
	for _, p := range parts {
		if err := p.Wait(0); err != nil {
			return err
		}
	}
	return nil
}

// Wake wakes every part, so that whichever one a Wait sleeps on returns.
func (m *Mixed) Wake() {
	for _, p := range m.parts {
		p.Wake()
	}
}

// Stats adds up the parts' counters.
func (m *Mixed) Stats() Stats {
	var s Stats
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

// Close closes every part and the epoll set.
func (m *Mixed) Close() error {
	var errs []error
	// A Wait asleep on the epoll set wakes through its parts' descriptors,
	// so the set goes first, while the parts can still be woken.
	if m.epfd >= 0 && m.guard.Shut() {
		m.guard.Drain(m.Wake)
		errs = append(errs, unix.Close(m.epfd))
	}
	for _, p := range m.parts {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

// SlotsOf is the one-sided window that reaches peer, or nil.
func (m *Mixed) SlotsOf(peer int) Slots {
	if peer < 0 || peer >= len(m.slots) {
		return nil
	}
	return m.slots[peer]
}

// SlotBytes is the LL slot capacity to peer of the part that reaches it; 0
// where that part has no window (LL messages travel as frames).
func (m *Mixed) SlotBytes(peer int) int {
	if s := m.SlotsOf(peer); s != nil {
		return s.SlotBytes(peer)
	}
	return 0
}

// Store stores into peer's slot through the part that reaches it.
func (m *Mixed) Store(peer int, epoch, tag uint32, data []byte) error {
	s := m.SlotsOf(peer)
	if s == nil {
		return fault.New(fault.ErrInvalidArgument, peer, "no small-message mailbox (LL slot) to rank %d", peer)
	}
	return s.Store(peer, epoch, tag, data)
}

// Load loads peer's message through the part that reaches it.
func (m *Mixed) Load(peer int, epoch, tag uint32, dst []byte, anyLen bool, st *SlotLoad) (bool, error) {
	s := m.SlotsOf(peer)
	if s == nil {
		return false, fault.New(fault.ErrInvalidArgument, peer, "no small-message mailbox (LL slot) from rank %d", peer)
	}
	return s.Load(peer, epoch, tag, dst, anyLen, st)
}

// ShareConns tells every part that can (Sharer).
func (m *Mixed) ShareConns() {
	for _, p := range m.parts {
		if sh, ok := p.(Sharer); ok {
			sh.ShareConns()
		}
	}
}

// Rebalance rebalances every part that can.
func (m *Mixed) Rebalance() {
	for _, p := range m.parts {
		if pl, ok := p.(Placer); ok {
			pl.Rebalance()
		}
	}
}

// BeginBatch starts a batch on every part with a one-sided window.
func (m *Mixed) BeginBatch() bool {
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
func (m *Mixed) EndBatch() {
	for _, w := range m.windows {
		w.EndBatch()
	}
}
