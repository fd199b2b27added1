package a2a

import (
	"context"
	"errors"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// localAbort is an abort of this rank from op sequence from on: err is the
// cause, as the call that failed returned it, and later what the calls after
// it return, ErrAborted wrapping err, so that every call of an aborted Comm
// matches ErrAborted whatever the cause's kind.
type localAbort struct {
	err, later error
	from       uint64
}

// abortedBy is what calls after this rank's abort from op sequence from
// return: the cause wrapped in ErrAborted (as it is already when it is an
// abort or a cancellation), with what to do.
func abortedBy(rank int, from uint64, cause error) error {
	if errors.Is(cause, fault.ErrAborted) {
		return cause
	}
	return fault.Wrap(fault.ErrAborted, rank, cause, "an earlier call (op #%d) failed on this rank; Close the Comm, and Join again to go on", from)
}

// watchControl wakes a parked operation when the control plane reports an
// abort or a departed peer, so it looks at once.
func (c *Comm) watchControl() {
	defer c.life.watchWG.Done()
	for {
		select {
		case <-c.member.Changed():
			c.tr.Wake()
		case <-c.life.closing:
			return
		}
	}
}

// stopped returns why the running collective must stop, or nil.
func (c *Comm) stopped() error { return c.stoppedAt(c.queue.cur) }

// stoppedAt returns why an operation numbered seq (see Comm) must stop:
// Close (ErrClosed, before any abort: a closed Comm answers every call
// alike), or its cause (causeAt); nil otherwise.
func (c *Comm) stoppedAt(seq uint64) error {
	if c.life.closed.Load() {
		return errClosedComm(c.rank)
	}
	return c.causeAt(seq)
}

// causeAt returns why an operation numbered seq must stop, Close aside: an
// abort of this rank or of a peer whose scope covers it (matching
// ErrAborted), or a peer that left before taking part in it (ErrPeerLost).
// It looks at the control plane itself rather than waiting for
// watchControl, so an operation started right after a remote abort fails
// instead of consuming frames an aborted peer left behind.
func (c *Comm) causeAt(seq uint64) error {
	if p := c.life.abort.Load(); p != nil && seq >= p.from {
		return p.later
	}
	if s := c.share; s != nil && s.scope != nil {
		return s.scope.FailedAt(seq)
	}
	if c.member != nil {
		return c.member.FailedAt(seq)
	}
	return nil
}

func errClosedComm(rank int) error {
	return fault.New(fault.ErrClosed, rank, "Close called on this Comm; Join for a new one")
}

// stoppedFor is stoppedAt for a point-to-point request, which also stops
// when its peer left.
func (c *Comm) stoppedFor(r *Request) error {
	if err := c.stoppedAt(r.order); err != nil {
		return err
	}
	if s := c.share; s != nil && s.scope != nil {
		return s.scope.Departed(r.peer)
	}
	if c.member != nil {
		return c.member.Departed(r.peer)
	}
	return nil
}

// failAt aborts the communicator from op sequence from on because of err
// (this rank's failure), tells the other ranks, and returns the error the
// caller should see: err, or, when the Comm had stopped already (an earlier
// abort covering from, Close), what every call after that sees.
func (c *Comm) failAt(from uint64, err error) error {
	if prev := c.stoppedAt(from); prev != nil {
		return prev // already stopped: the first cause is the story
	}
	if c.awaitPeerCause(from, err) {
		if prev := c.stoppedAt(from); errors.Is(prev, fault.ErrAborted) || errors.Is(prev, fault.ErrClosed) {
			return prev // the peer aborted before it left: its cause is the story
		}
	}
	var now *localAbort
	widened := false
	for {
		p := c.life.abort.Load()
		if p != nil && p.from <= from {
			return p.later
		}
		// An abort of later operations widens to this one but keeps its
		// cause: the first failure is what every call reports.
		now = &localAbort{err: err, from: from}
		if widened = p != nil; widened {
			now.err = p.err
		}
		now.later = abortedBy(c.rank, from, now.err)
		if c.life.abort.CompareAndSwap(p, now) {
			break
		}
	}
	c.log.Log(context.Background(), fault.LogLevel(now.err), "a2a: aborting communicator", "rank", c.rank, "from", from, "err", now.err)
	if s := c.share; s != nil && s.scope != nil {
		s.scope.AbortAt(from, now.err)
	} else if c.member != nil {
		c.member.AbortAt(from, now.err)
	}
	if c.tr != nil {
		c.tr.Wake()
	}
	if widened {
		return now.later
	}
	return err
}

// peerCauseGrace bounds how long a rank whose data plane lost a peer waits
// for the control plane's word on that peer (awaitPeerCause). A peer that
// closes gracefully sends its leave before it closes its transport, so the
// word comes within a NATS delivery; a peer that died sends none, and its
// loss is reported this much later than the data plane saw it.
const peerCauseGrace = 500 * time.Millisecond

// awaitPeerCause waits, when err is the data plane's report that a peer went
// away (ErrPeerLost naming it), until the control plane has word of that
// peer: an abort covering from, its leave, or its loss; at most
// peerCauseGrace (or the peer timeout, if shorter), or until Close. It
// reports whether it waited. A rank that fails a call and closes at once
// publishes its abort and then its leave on NATS, flushes them, and only
// then closes its transport, but the goodbye (a shared-memory flag, a TCP
// reset) may still reach a peer first; the leave comes after the abort on
// one subscription, so once the leave is heard the abort is too, and every
// peer reports the abort's cause instead of a bare "peer lost".
func (c *Comm) awaitPeerCause(from uint64, err error) bool {
	var fe *fault.Error
	if c.member == nil || !errors.As(err, &fe) || fe.Kind != fault.ErrPeerLost || fe.Rank < 0 || fe.Rank == c.rank {
		return false
	}
	grace := peerCauseGrace
	if t := c.cfg.PeerTimeout; t > 0 { // 0: the control plane's default, longer
		grace = min(grace, t)
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	for {
		changed := c.member.Changed() // before looking: a change after it closes it
		if c.causeAt(from) != nil || c.member.Departed(fe.Rank) != nil {
			return true
		}
		select {
		case <-changed:
		case <-timer.C:
			return true
		case <-c.life.closing:
			return true
		}
	}
}

// Abort aborts the communicator because of err, as a failing collective does:
// every rank's pending and future calls fail with ErrAborted wrapping err's
// kind, while the collectives this rank completed complete on every rank.
// Libraries built on a Comm (package dispatch) use it to release the other
// ranks when they reject a call locally. It returns the error callers of
// this rank will see: ErrAborted wrapping the first cause (err, unless the
// Comm had failed before), or ErrClosed after Close.
func (c *Comm) Abort(err error) error {
	if err == nil {
		err = fault.New(fault.ErrAborted, c.rank, "Abort called")
	}
	from := c.life.okSeq.Load() + 1
	c.failAt(from, err)
	return c.stoppedAt(from)
}

// Err returns the reason the communicator was aborted (matching
// ErrAborted, wrapping the first cause), or a peer left, even once it is
// closed; ErrClosed when it was closed healthy; nil otherwise.
func (c *Comm) Err() error {
	// Every operation from now on: the last sequence number but one, as
	// FailedAt compares seq+1 with a leaver's first missed operation.
	if err := c.causeAt(^uint64(0) - 1); err != nil {
		return err
	}
	if c.life.closed.Load() {
		return errClosedComm(c.rank)
	}
	return nil
}

// doneContext is a context that ends when done is closed (the Comm's
// closing, the member's end), so context.AfterFunc can cut a wait short.
type doneContext struct{ done <-chan struct{} }

func (doneContext) Deadline() (time.Time, bool) { return time.Time{}, false }

func (x doneContext) Done() <-chan struct{} { return x.done }

func (x doneContext) Err() error {
	select {
	case <-x.done:
		return context.Canceled
	default:
		return nil
	}
}

func (doneContext) Value(any) any { return nil }
