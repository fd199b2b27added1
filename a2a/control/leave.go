package control

import (
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// onLeave takes an opened leave of a peer.
func (m *Member) onLeave(env envelope, p []byte, subject string) {
	var l leaveMsg
	if unmarshal(p, &l) != nil || l.Rank < 0 || l.Rank >= m.size {
		m.reject(RejectMalformed, subject)
		return
	}
	if m.fromRank(env, l.Epoch, l.Rank, subject) {
		m.depart(l.Rank, l.From)
	}
}

// depart records that rank left the group, taking no part in operations
// from from on, and wakes the waits that may need it.
func (m *Member) depart(rank int, from uint64) {
	m.live.left[rank].Store(true)
	if !m.exit.departedFrom[rank].CompareAndSwap(0, from+1) {
		return
	}
	for {
		cur := m.exit.minDeparted.Load()
		if cur != 0 && cur <= from+1 {
			break
		}
		if m.exit.minDeparted.CompareAndSwap(cur, from+1) {
			break
		}
	}
	m.exit.changed.notify()
}

// Departed reports, as an error matching fault.ErrPeerLost, that rank left
// the group; nil while it is a member.
func (m *Member) Departed(rank int) error {
	if rank >= 0 && rank < len(m.exit.departedFrom) && m.exit.departedFrom[rank].Load() != 0 {
		return m.departedErr(rank)
	}
	return nil
}

func (m *Member) departedErr(rank int) error {
	return fault.New(fault.ErrPeerLost, rank, "rank %d left group %q", rank, m.group)
}

// Leave leaves the group gracefully (LeaveAt(0): this rank takes part in
// no operation any peer still waits for).
func (m *Member) Leave() error { return m.LeaveAt(0) }

// LeaveAt leaves the group gracefully: it publishes a leave (peers stop
// watching this rank, and their FailedAt reports it lost for operations
// numbered from or later, the first this rank did not finish), stops
// heartbeats, releases subscriptions and stops the coordinator this member
// hosts, if any. Done is closed afterwards and Err reports fault.ErrClosed
// unless the member had aborted. Leave is idempotent.
func (m *Member) LeaveAt(from uint64) error {
	m.exit.mu.Lock()
	if m.exit.leaving {
		m.exit.mu.Unlock()
		return m.exit.leaveErr
	}
	m.exit.leaving = true
	m.exit.mu.Unlock()
	var err error
	if !m.nc.IsClosed() {
		b, _ := msgpack.Marshal(&leaveMsg{Epoch: m.epoch, Rank: m.rank, From: from})
		if perr := m.publish(m.subj.leave, "", m.epoch, sealed(b)); perr != nil {
			err = fault.Wrap(fault.ErrClosed, m.rank, perr, "control: publishing leave")
		}
	}
	close(m.live.stop)
	m.live.wg.Wait()
	m.release()
	if m.svc != nil {
		// Before the flush: Close lets the coordinator finish the replies
		// it was sending (a roster it formed must reach every member).
		_ = m.svc.Close()
	}
	if !m.nc.IsClosed() {
		// Make sure the leave (and any replies or columns our coordinator
		// published) left this process before the caller closes the
		// connection.
		_ = m.nc.FlushTimeout(time.Second)
	}
	m.exit.mu.Lock()
	if m.exit.err == nil {
		m.exit.err = fault.New(fault.ErrClosed, m.rank, "left group %q", m.group)
		m.exit.scope.Store(&scopedErr{err: m.exit.err})
		close(m.exit.done)
	}
	m.exit.leaveErr = err
	m.exit.mu.Unlock()
	m.exit.changed.notify()
	m.log.Debug("left")
	return err
}
