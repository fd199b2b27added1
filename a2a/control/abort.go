package control

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// Abort aborts the member locally and tells the group (AbortAt(0, cause):
// every operation). Peers see an error matching fault.ErrAborted that wraps
// cause's kind.
func (m *Member) Abort(cause error) { m.AbortAt(0, cause) }

// AbortAt aborts the member from operation from on, locally and on every
// peer: FailedAt reports the abort for operations numbered from or later,
// while earlier ones, which the aborting rank had finished or left behind,
// go on. Operation numbers are the caller's (the Comm's op sequence); 0
// concerns all. Done closes at the first abort, and Err keeps its cause; a
// later abort with an earlier from narrows the scope and is told again.
func (m *Member) AbortAt(from uint64, cause error) {
	var err error
	switch {
	case cause == nil:
		err = fault.New(fault.ErrAborted, m.rank, "aborted by the application")
	case errors.Is(cause, fault.ErrAborted):
		err = cause
	default:
		err = fault.Wrap(fault.ErrAborted, m.rank, cause, "aborted locally")
	}
	m.abortAt(from, err, true)
}

// scopedErr is an abort and the first operation it concerns.
type scopedErr struct {
	err  error
	from uint64
}

// abort records err as the cause of an abort of every operation.
func (m *Member) abort(err error, publish bool) { m.abortAt(0, err, publish) }

// abortAt records err as the cause from operation from on (the earliest
// scope wins) and optionally publishes it.
func (m *Member) abortAt(from uint64, err error, publish bool) {
	m.exit.mu.Lock()
	if s := m.exit.scope.Load(); s != nil && s.from <= from {
		m.exit.mu.Unlock()
		return
	}
	m.exit.scope.Store(&scopedErr{err: err, from: from})
	first := m.exit.err == nil
	if first {
		m.exit.err = err
		close(m.exit.done)
	}
	m.exit.mu.Unlock()
	m.exit.changed.notify()
	if first {
		m.log.Log(context.Background(), fault.LogLevel(err), "member aborted", "err", err, "from", from)
	}
	if publish && !m.nc.IsClosed() {
		kind, rank, detail := describe(err)
		b, _ := msgpack.Marshal(&abortMsg{Epoch: m.epoch, Origin: m.rank, Kind: kindCode(kind), Rank: rank, Detail: detail, From: from})
		if perr := m.publish(m.subj.abort, "", m.epoch, sealed(b)); perr != nil {
			m.log.Warn("publishing abort", "err", perr)
		}
	}
}

// stashedAbort is an authentic abort heard before the formed reply; whether
// its sender is a member is checked once the roster is known.
type stashedAbort struct {
	env     envelope
	a       abortMsg
	subject string
}

// onAbort takes an opened abort: at once once this member is formed, else
// stashed (up to 16) until formFrom knows the roster to check it against.
func (m *Member) onAbort(env envelope, p []byte, subject string) {
	var a abortMsg
	if unmarshal(p, &a) != nil {
		m.reject(RejectMalformed, subject)
		return
	}
	m.roster.mu.Lock()
	if !m.roster.formed.Load() {
		if len(m.roster.early) < 16 {
			m.roster.early = append(m.roster.early, stashedAbort{env, a, subject})
		}
		m.roster.mu.Unlock()
		return
	}
	m.roster.mu.Unlock()
	m.onAbortMsg(env, &a, subject)
}

// onAbortMsg aborts this member for an authentic abort of its formation from
// the rank it names, or from the coordinator (which aborts for a rank that
// gave up joining).
func (m *Member) onAbortMsg(env envelope, a *abortMsg, subject string) {
	if a.Epoch != m.epoch || env.epoch != m.epoch {
		m.reject(RejectEpoch, subject)
		return
	}
	if env.sender == m.sid {
		return // our own
	}
	if r, member := m.roster.senders[env.sender]; (!member || r != a.Origin) && env.sender != m.roster.coordinator {
		m.reject(RejectSender, subject)
		return
	}
	if a.Origin == m.rank {
		return
	}
	if a.Comm != 0 {
		m.onScopeAbort(a)
		return
	}
	m.abortAt(a.From, &fault.Error{Kind: fault.ErrAborted, Rank: a.Origin, Detail: fmt.Sprintf("aborted by rank %d", a.Origin),
		Err: &fault.Error{Kind: kindOfCode(a.Kind), Rank: a.Rank, Detail: a.Detail}}, false)
}

// FailedAt reports why operation seq (the caller's numbering, as given to
// AbortAt and LeaveAt) cannot complete: an abort whose scope covers it, this
// member having left, or a rank that left the group before taking part in
// it (an error matching fault.ErrPeerLost naming that rank). It returns nil
// otherwise, even after an abort of later operations.
func (m *Member) FailedAt(seq uint64) error {
	if s := m.exit.scope.Load(); s != nil && seq >= s.from {
		return s.err
	}
	if d := m.exit.minDeparted.Load(); d != 0 && seq+1 >= d {
		for r := range m.exit.departedFrom {
			if f := m.exit.departedFrom[r].Load(); f != 0 && seq+1 >= f {
				return m.departedErr(r)
			}
		}
	}
	return nil
}

// Changed returns a channel closed at the next change of what FailedAt or
// Departed report: take it before looking, then wait on it.
func (m *Member) Changed() <-chan struct{} { return m.exit.changed.wait() }

// notifier wakes every goroutine waiting for the next event.
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

func (n *notifier) wait() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

func (n *notifier) notify() {
	n.mu.Lock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
	n.mu.Unlock()
}
