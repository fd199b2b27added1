package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// Scope is the abort scope of a communicator made from a member's group
// without a rendezvous of its own (a2a's Comm.Split and Comm.Dup): some of
// the group's ranks, with operations numbered apart. Its aborts travel on
// the group's abort subject, signed as the group's, marked with the
// communicator's id, and concern only the members of the scope. What stops
// the whole group stops the scope too (a lost control plane, this member's
// Leave), but for the loss of a rank the scope does not hold; so does the
// departure of one of its ranks. An abort of the group's own operations
// (AbortAt with a scope of its own) does not.
type Scope struct {
	m      *Member
	comm   uint16
	ranks  []int // scope rank -> group rank
	abort  atomic.Pointer[scopedErr]
	closed atomic.Bool
}

// OpenScope opens the scope of communicator comm (not 0), whose rank i is
// the group's rank ranks[i]; this member must be one of them. Every member
// of the scope opens it with the same comm and ranks.
func (m *Member) OpenScope(comm uint16, ranks []int) (*Scope, error) {
	if comm == 0 || !slices.Contains(ranks, m.rank) {
		return nil, fault.New(fault.ErrInvalidArgument, m.rank, "control: scope %d of ranks %v without this rank", comm, ranks)
	}
	for _, r := range ranks {
		if r < 0 || r >= m.size {
			return nil, fault.New(fault.ErrInvalidArgument, m.rank, "control: scope %d names rank %d of a group of %d", comm, r, m.size)
		}
	}
	s := &Scope{m: m, comm: comm, ranks: ranks}
	if _, dup := m.scopes.LoadOrStore(comm, s); dup {
		return nil, fault.New(fault.ErrInvalidArgument, m.rank, "control: scope %d is open already", comm)
	}
	return s, nil
}

// AbortAt aborts the scope from operation from on (the scope's numbering),
// on this rank and on every rank of the scope, as Member.AbortAt does for
// the group.
func (s *Scope) AbortAt(from uint64, cause error) {
	var err error
	switch {
	case cause == nil:
		err = fault.New(fault.ErrAborted, s.m.rank, "aborted by the application")
	case errors.Is(cause, fault.ErrAborted):
		err = cause
	default:
		err = fault.Wrap(fault.ErrAborted, s.m.rank, cause, "aborted locally")
	}
	if s.abortAt(from, err, false) {
		s.publish(from, err)
	}
}

// abortAt records err from operation from on (the earliest scope wins) and
// reports whether it did; a peer's close of the scope (leave) is logged at
// Debug, as a leave of the group is.
func (s *Scope) abortAt(from uint64, err error, leave bool) bool {
	for {
		p := s.abort.Load()
		if p != nil && p.from <= from {
			return false
		}
		if s.abort.CompareAndSwap(p, &scopedErr{err: err, from: from}) {
			break
		}
	}
	s.m.exit.changed.notify()
	level := fault.LogLevel(err)
	if leave {
		level = slog.LevelDebug
	}
	if p := s.abort.Load(); p.err == err {
		s.m.log.Log(context.Background(), level, "communicator aborted", "comm", s.comm, "err", err, "from", from)
	}
	return true
}

func (s *Scope) publish(from uint64, err error) {
	m := s.m
	if m.nc.IsClosed() {
		return
	}
	kind, rank, detail := describe(err)
	b, _ := msgpack.Marshal(&abortMsg{Epoch: m.epoch, Origin: m.rank, Kind: kindCode(kind), Rank: rank, Detail: detail, From: from, Comm: s.comm})
	if perr := m.publish(m.subj.abort, "", m.epoch, sealed(b)); perr != nil {
		m.log.Warn("publishing abort", "comm", s.comm, "err", perr)
	}
}

// onScopeAbort takes a peer's abort of a scope (authentic, of this
// formation): the scope's, if this member has it open.
func (m *Member) onScopeAbort(a *abortMsg) {
	v, ok := m.scopes.Load(a.Comm)
	if !ok {
		return
	}
	s := v.(*Scope)
	if !slices.Contains(s.ranks, a.Origin) {
		return
	}
	// A leave (LeaveAt) names its sender as the rank lost.
	leave := kindOfCode(a.Kind) == fault.ErrPeerLost && a.Rank == a.Origin
	s.abortAt(a.From, &fault.Error{Kind: fault.ErrAborted, Rank: a.Origin, Detail: fmt.Sprintf("communicator %d aborted by rank %d", a.Comm, a.Origin),
		Err: &fault.Error{Kind: kindOfCode(a.Kind), Rank: a.Rank, Detail: a.Detail}}, leave)
}

// FailedAt reports why the scope's operation seq cannot complete: an abort
// of the scope covering it, the whole group stopped (the loss of one of
// the scope's ranks, the control plane lost, this member left), or one of
// the scope's ranks left the group (matching fault.ErrPeerLost). Ranks in
// errors are the group's.
func (s *Scope) FailedAt(seq uint64) error {
	if p := s.abort.Load(); p != nil && seq >= p.from {
		return p.err
	}
	m := s.m
	if p := m.exit.scope.Load(); p != nil && p.from == 0 && s.concerns(p.err) {
		return p.err
	}
	if m.exit.minDeparted.Load() != 0 {
		for _, r := range s.ranks {
			if m.exit.departedFrom[r].Load() != 0 {
				return m.departedErr(r)
			}
		}
	}
	return nil
}

// concerns reports whether the group's abort err stops the scope: all do
// but the loss of a rank the scope does not hold.
func (s *Scope) concerns(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if fe, ok := e.(*fault.Error); ok && fe.Kind == fault.ErrPeerLost && fe.Rank >= 0 {
			return slices.Contains(s.ranks, fe.Rank)
		}
	}
	return true
}

// Departed reports, matching fault.ErrPeerLost, that the scope's rank left
// the group.
func (s *Scope) Departed(rank int) error {
	if rank < 0 || rank >= len(s.ranks) {
		return nil
	}
	return s.m.Departed(s.ranks[rank])
}

// LeaveAt closes the scope on this rank: its peers' operations from from
// on (the first this rank did not finish) fail with fault.ErrPeerLost
// naming it, as a leave of the group does. Idempotent.
func (s *Scope) LeaveAt(from uint64) {
	if !s.closed.CompareAndSwap(false, true) {
		return
	}
	s.publish(from, fault.New(fault.ErrPeerLost, s.m.rank, "rank %d closed communicator %d", s.m.rank, s.comm))
	s.m.scopes.Delete(s.comm)
}
