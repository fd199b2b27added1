package a2a

import (
	"context"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// localAbort is an abort of this rank from op sequence from on.
type localAbort struct {
	err  error
	from uint64
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
func (c *Comm) stopped() error { return c.stoppedAt(c.queue.seq) }

// stoppedAt returns why an operation numbered seq (see Comm) must stop: an
// abort of this rank or of a peer whose scope covers it, a peer that left
// before taking part in it, or Close; nil otherwise. It looks at the control
// plane itself rather than waiting for watchControl, so an operation started
// right after a remote abort fails instead of consuming frames an aborted
// peer left behind.
func (c *Comm) stoppedAt(seq uint64) error {
	if p := c.life.abort.Load(); p != nil && seq >= p.from {
		return p.err
	}
	if c.member != nil {
		if err := c.member.FailedAt(seq); err != nil {
			return err
		}
	}
	if c.life.closed.Load() {
		return errClosedComm(c.rank)
	}
	return nil
}

func errClosedComm(rank int) error { return fault.New(fault.ErrClosed, rank, "Close called") }

// stoppedFor is stoppedAt for a point-to-point request, which also stops
// when its peer left.
func (c *Comm) stoppedFor(r *Request) error {
	if err := c.stoppedAt(r.order); err != nil {
		return err
	}
	if c.member != nil {
		return c.member.Departed(r.peer)
	}
	return nil
}

// fail aborts the running collective because of err (see failAt).
func (c *Comm) fail(err error) error { return c.failAt(c.queue.seq, err) }

// failAt aborts the communicator from op sequence from on because of err
// (this rank's failure), tells the other ranks, and returns the error the
// caller should see: err, or the earlier abort that already covers from.
func (c *Comm) failAt(from uint64, err error) error {
	if prev := c.stoppedAt(from); prev != nil {
		return prev // already stopped: the first cause is the story
	}
	for {
		p := c.life.abort.Load()
		if p != nil && p.from <= from {
			return p.err
		}
		if c.life.abort.CompareAndSwap(p, &localAbort{err: err, from: from}) {
			break
		}
	}
	c.log.Log(context.Background(), fault.LogLevel(err), "a2a: aborting communicator", "rank", c.rank, "from", from, "err", err)
	if c.member != nil {
		c.member.AbortAt(from, err)
	}
	if c.tr != nil {
		c.tr.Wake()
	}
	return err
}

// Abort aborts the communicator because of err, as a failing collective does:
// every rank's pending and future calls fail with ErrAborted wrapping err's
// kind, while the collectives this rank completed complete on every rank.
// Libraries built on a Comm (package dispatch) use it to release the other
// ranks when they reject a call locally. It returns the error callers of
// this rank will see.
func (c *Comm) Abort(err error) error {
	if err == nil {
		err = fault.New(fault.ErrAborted, c.rank, "Abort called")
	}
	return c.failAt(c.life.okSeq.Load()+1, err)
}

// Err returns the reason the communicator was aborted (or a peer left, or
// it was closed), or nil.
func (c *Comm) Err() error { return c.stoppedAt(^uint64(0)) }

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
