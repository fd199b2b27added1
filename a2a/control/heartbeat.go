package control

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// heartbeat publishes heartbeats and watches peers and the connection. It
// stops when the member aborts all its operations (so peers that missed the
// abort message see it go silent) or leaves. An abort of later operations
// only (a peer's AbortAt past this rank's running operation) does not stop
// it: the operations before the abort must still complete or fail, and a
// peer lost meanwhile is what fails them.
func (m *Member) heartbeat() {
	defer m.live.wg.Done()
	t := time.NewTicker(m.cfg.HeartbeatInterval)
	defer t.Stop()
	p, _ := msgpack.Marshal(&hbMsg{Epoch: m.epoch, Rank: m.rank})
	hb := sealed(p) // sealed anew (sequence number, MAC) for every beat
	_ = m.publish(m.subj.hb, "", m.epoch, hb)
	var downSince time.Time
	lastTick := time.Now()
	aborted := m.exit.done
	for {
		select {
		case <-m.live.stop:
			return
		case <-aborted:
			if m.abortedAll() {
				return
			}
			aborted = nil // scoped: keep watching until it covers everything
		case <-m.subs.statusCh:
			if m.abortIfClosed() {
				return
			}
		case <-m.subs.connCh:
			if m.nc.Status() == nats.CONNECTED {
				downSince = time.Time{}
				m.onReconnect(hb)
			}
		case <-t.C:
			// The time of receipt, not the tick's: a starved loop receives
			// a tick sent on time long after.
			tick := time.Now()
			gap := tick.Sub(lastTick)
			lastTick = tick
			if m.abortIfClosed() || m.abortedAll() {
				return
			}
			if m.nc.Status() != nats.CONNECTED {
				if downSince.IsZero() {
					downSince = time.Now()
				} else if time.Since(downSince) > m.cfg.PeerTimeout {
					m.abort(fault.Wrap(fault.ErrAborted, m.rank, nats.ErrDisconnected,
						"control plane lost: disconnected from NATS for %v", time.Since(downSince).Round(time.Millisecond)), false)
					return
				}
				continue
			}
			downSince = time.Time{}
			_ = m.publish(m.subj.hb, "", m.epoch, hb)
			if stalled(gap, m.cfg.HeartbeatInterval, m.cfg.PeerTimeout) {
				m.log.Debug("heartbeat loop stalled: peers' silence restarts", "gap", gap)
				m.restartSilence()
				continue
			}
			if m.abortIfPeerLost() {
				return
			}
		}
	}
}

// abortedAll reports whether an abort covers every operation of this member
// (an abort from operation 0: a lost peer or control plane, a local abort
// before the first operation), so nothing is left for the heartbeat to keep
// alive.
func (m *Member) abortedAll() bool {
	s := m.exit.scope.Load()
	return s != nil && s.from == 0
}

// onHeartbeat notes the time of an opened heartbeat from a peer.
func (m *Member) onHeartbeat(env envelope, p []byte, subject string) {
	var hb hbMsg
	if unmarshal(p, &hb) != nil || hb.Rank < 0 || hb.Rank >= m.size {
		m.reject(RejectMalformed, subject)
		return
	}
	if m.fromRank(env, hb.Epoch, hb.Rank, subject) {
		m.live.lastSeen[hb.Rank].Store(int64(time.Since(m.live.start)))
	}
}

// abortIfClosed aborts the member when its NATS connection is closed, and
// reports whether it did. The abort is not published: it could not be.
func (m *Member) abortIfClosed() bool {
	if !m.nc.IsClosed() {
		return false
	}
	m.abort(fault.Wrap(fault.ErrAborted, m.rank, nats.ErrConnectionClosed, "control plane lost"), false)
	return true
}

// abortIfPeerLost aborts the member, and tells the group, when a peer that
// has not left has been silent for longer than PeerTimeout, and reports
// whether it did.
func (m *Member) abortIfPeerLost() bool {
	timeout := int64(m.cfg.PeerTimeout)
	now := int64(time.Since(m.live.start))
	for r := range m.live.lastSeen {
		if r == m.rank || m.live.left[r].Load() {
			continue
		}
		if silent := now - m.live.lastSeen[r].Load(); silent > timeout {
			lost := fault.New(fault.ErrPeerLost, r, "no heartbeat for %v", time.Duration(silent).Round(time.Millisecond))
			m.abort(&fault.Error{Kind: fault.ErrAborted, Rank: r, Detail: fmt.Sprintf("rank %d lost", r), Err: lost}, true)
			return true
		}
	}
	return false
}

// reconnects returns a channel closed at the next reconnect of the NATS
// connection.
func (m *Member) reconnects() <-chan struct{} {
	m.live.rmu.Lock()
	defer m.live.rmu.Unlock()
	return m.live.reconnected
}

// onReconnect runs when the connection is back after a disconnect (the
// server it was on died, say, and nats.go moved to another server of the
// cluster; the subscriptions are already re-sent). While it was away this
// member heard no heartbeats, so every peer's silence restarts now instead
// of counting the reconnect window against healthy peers; a heartbeat goes
// out at once so peers do the same for us; and waiting counts exchanges
// re-send their rows (messages in flight through the dead server are lost:
// core NATS is at-most-once).
func (m *Member) onReconnect(hb []byte) {
	m.log.Info("control plane reconnected", "server", m.nc.ConnectedUrlRedacted())
	m.restartSilence()
	_ = m.publish(m.subj.hb, "", m.epoch, hb)
	m.live.rmu.Lock()
	close(m.live.reconnected)
	m.live.reconnected = make(chan struct{})
	m.live.rmu.Unlock()
}

// restartSilence counts every peer's silence from now: after a reconnect,
// or a stall of this member's own heartbeat loop, when peers' heartbeats
// may not have reached it for reasons of its own.
func (m *Member) restartSilence() {
	now := int64(time.Since(m.live.start))
	for r := range m.live.lastSeen {
		for {
			old := m.live.lastSeen[r].Load()
			if old >= now || m.live.lastSeen[r].CompareAndSwap(old, now) {
				break
			}
		}
	}
}

// stalled says whether a heartbeat tick that came gap after the previous
// one shows this process starved (descheduled, a long GC pause, a machine
// with more runnable threads than cores): more than half a peer timeout
// late. Peers' heartbeats may then sit unread in this process's buffers,
// and their silence is not theirs.
func stalled(gap, interval, peerTimeout time.Duration) bool {
	return gap > interval+peerTimeout/2
}
