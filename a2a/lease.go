package a2a

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// The lease: a goroutine that calls collectives one after the other with
// nothing else on its Comm (a decode loop's Start, Wait, Start, Wait, or a
// loop of blocking calls) keeps the turn from one call to the next instead
// of giving it back and taking it again. A use in a direct turn
// (persistent_direct.go) takes and gives back the collective queue's
// running flag, the driving role, collBusy and the call lock, and numbers
// itself under the queue's lock: about twenty locked instructions, a fifth
// of the use's CPU at 8 bytes; a blocking call's begin and end do the same.
// When such a call ends well with the queue empty, no request posted and
// nobody waiting, it keeps all four as a lease instead: one atomic word in
// the progress queue,
//
//	op sequence << leaseShift | leaseWant | state
//
// A Persistent's direct turn grants the lease with the Persistent as its
// holder, whose uses then move it idle -> started (Start numbers the next
// use in the word, one CAS) -> busy (Wait takes it, one CAS) -> idle (the
// use ended well, one CAS): three locked instructions of the queue's
// protocol instead of twenty. A blocking collective grants it with no
// holder; any blocking collective that finds it idle runs under it
// (beginLeased: idle -> call -> idle) and leaves the holder as it was, so
// a loop that puts a Barrier between a Persistent's uses keeps it.
//
// Every other call that touches the queue ends the lease first, under the
// queue's lock (revokeLocked), so it finds the queue as the direct turn
// would have left it:
//
//   - idle: nobody runs under the lease. The revoker gives back what the
//     lease holds, on the holder's behalf.
//   - started: Start numbered a use that Wait has not taken. The revoker
//     queues it, with the fence Start would have set, and gives the rest
//     back; the use then runs as any started collective (the holder's Wait
//     finds its CAS refused and takes the queued path).
//   - busy or call: a use or a blocking collective runs, holding exactly
//     what a direct turn holds, so the revoker proceeds as it would behind
//     a direct turn; it only sets leaseWant, and the turn goes back when
//     the run ends. A blocking collective waits for a busy use as for a
//     started collective, and is refused while another blocking call runs,
//     as collectives issued at once are.
//
// While the lease lives the queue's seq lags: the word carries the last
// number taken, and the revoker (or the run that gives the lease back
// itself) writes it back. Posts, started collectives and Close end the
// lease in their own locked sections; a blocking collective or SetAlgo,
// whose first step is the CAS of collBusy, ends it when that CAS fails
// (endLeaseFor). A grant happens under the queue's lock only when nobody
// sleeps on the queue and no collective waits for the role, and every
// predicate a goroutine sleeps on holds once a lease is granted, so no
// goroutine sleeps on a turn the lease keeps.

// The lease word's states and fields.
const (
	leaseNone    = 0
	leaseIdle    = 1 // between calls: nothing runs under the lease
	leaseStarted = 2 // Start numbered a use; Wait has not taken it
	leaseBusy    = 3 // Wait runs the use
	leaseEnding  = 4 // a revoker gives the turn back, under the queue's lock
	leaseCall    = 5 // a blocking collective runs under the lease (beginLeased)
	leaseState   = 7
	leaseWant    = 8 // busy, and another call waits: the use ends the lease
	leaseShift   = 4
)

func leaseWord(seq, state uint64) uint64 { return seq<<leaseShift | state }

// leaseEnd is what ending a lease found.
type leaseEnd int

const (
	leaseAbsent   leaseEnd = iota // no lease
	leaseReturned                 // the holder was outside its calls: the turn is back
	leaseRunning                  // the lease's use runs: it ends the lease when it ends
	leaseCallRuns                 // a blocking collective runs under it: likewise
)

// leaseQueue is the progress queue's part of the lease.
type leaseQueue struct {
	word atomic.Uint64
	// op is the holder's: the Persistent whose direct turn granted the
	// lease, and whose Start may number a use in it.
	op atomic.Pointer[collOp]
	// ends counts the leases ended: a blocking collective whose CAS of
	// collBusy failed retries when a lease ended meanwhile.
	ends atomic.Uint64
}

// revokeLocked ends the lease, if any, before a call changes the queue;
// the queue's lock is held.
func (q *progressQueue) revokeLocked() leaseEnd {
	for {
		w := q.lease.word.Load()
		switch w & leaseState {
		case leaseNone:
			return leaseAbsent
		case leaseBusy, leaseCall:
			running := leaseRunning
			if w&leaseState == leaseCall {
				running = leaseCallRuns
			}
			if w&leaseWant != 0 {
				return running
			}
			if q.lease.word.CompareAndSwap(w, w|leaseWant) {
				q.seq = w >> leaseShift // the first to set want writes it; calls after it move it on
				return running
			}
			continue // it ended meanwhile
		}
		// Idle or started: the holder is outside its calls, or about to
		// find its CAS refused.
		if !q.lease.word.CompareAndSwap(w, leaseEnding) {
			continue
		}
		q.seq = w >> leaseShift
		if w&leaseState == leaseStarted {
			op := q.lease.op.Load() // the queue is empty under a lease: the oldest
			q.colls.pending = append(q.colls.pending, op)
			q.fence.Store(op.fence + 1)
			q.colls.n.Store(1)
		}
		q.giveBackLocked()
		return leaseReturned
	}
}

// giveBackLocked gives back the turn a lease holds (the running flag, the
// driving role, collBusy and the call lock) and ends the lease; the queue's
// lock is held, and q.seq is written.
func (q *progressQueue) giveBackLocked() {
	q.lease.op.Store(nil)
	q.driving = false
	q.colls.running.Store(false)
	q.life.collBusy.Store(false)
	q.life.calls.RUnlock()
	q.lease.ends.Add(1)
	q.lease.word.Store(leaseNone)
	q.broadcastLocked()
}

// quietLocked reports whether nothing but n started collectives waits on
// the queue (no request posted, nobody asleep, no collective wanting the
// role) and the last op numbered is seq: a turn ending now may be kept as a
// lease. The queue's lock is held; quiet is its look without the lock.
func (q *progressQueue) quietLocked(n int32, seq uint64) bool {
	return q.colls.n.Load() == n && len(q.inbox) == 0 && q.sleepers.Load() == 0 && q.collWant.Load() == 0 &&
		q.seq == seq && !q.life.closed.Load()
}

// quiet is quietLocked's first look, without the lock (the caller holds the
// driving role, so reqs is its to read): most turns that may not keep the
// turn show it here.
func (q *progressQueue) quiet(n int32) bool {
	return q.colls.n.Load() == n && q.inboxLen.Load() == 0 && len(q.reqs) == 0 && q.sleepers.Load() == 0 && q.collWant.Load() == 0
}

// revoke ends the lease, if any; see revokeLocked.
func (q *progressQueue) revoke() leaseEnd {
	q.mu.Lock()
	end := q.revokeLocked()
	q.mu.Unlock()
	return end
}

// revokeAfter ends the lease, if any, for a call whose CAS of collBusy
// failed when q.lease.ends was ends, and reports whether the CAS may be
// tried again: the lease held collBusy, or a lease ended meanwhile. False:
// a collective runs, a lease's use included (SetAlgo refuses then).
func (q *progressQueue) revokeAfter(ends uint64) bool {
	switch q.revoke() {
	case leaseReturned:
		return true
	case leaseRunning, leaseCallRuns:
		return false
	}
	return q.lease.ends.Load() != ends
}

// endLeaseFor is revokeAfter for a blocking collective, which waits for a
// lease's running use to end (bounded by ctx), as it waits for a started
// collective; a blocking collective running under the lease is another
// call's, which collectives issued one at a time exclude (begin refuses it).
func (q *progressQueue) endLeaseFor(ctx context.Context, ends uint64) (bool, error) {
	switch q.revoke() {
	case leaseReturned:
		return true, nil
	case leaseCallRuns:
		return false, nil
	case leaseRunning:
		if err := q.sleep(ctx, func() bool { return q.lease.word.Load() == leaseNone }); err != nil {
			return false, err
		}
		return true, nil
	}
	return q.lease.ends.Load() != ends, nil
}

// grantLease ends p's use in a direct turn (numbered seq, done well) by
// keeping the turn as p's lease, when the queue holds nothing else and
// nobody waits on it; false leaves the turn to be given back as usual.
func (p *Persistent) grantLease(seq uint64) bool {
	q := p.c.queue
	if p.closed || !q.quiet(1) {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.quietLocked(1, seq) {
		return false
	}
	// Off the queue as finishCollLocked takes it, keeping running and the
	// driving role.
	q.colls.pending[0] = nil
	q.colls.pending = q.colls.pending[:0]
	q.fence.Store(0)
	q.colls.n.Store(0)
	p.op.err = nil
	p.op.doneAt.Store(seq)
	p.leaseFence = q.tickets // no ticket is taken while the lease lives
	q.lease.op.Store(&p.op)
	q.lease.word.Store(leaseWord(seq, leaseIdle))
	return true
}

// startLeased numbers the next use under p's lease; false when p holds no
// lease (any more), and Start queues the use instead.
func (p *Persistent) startLeased(ctx context.Context) bool {
	lease := &p.c.queue.lease
	if lease.op.Load() != &p.op {
		return false
	}
	// Idle has no want bit. A word of an earlier lease of p's cannot come
	// back: every grant follows a use, numbered past it.
	w := lease.word.Load()
	if w&leaseState != leaseIdle {
		return false
	}
	// Read by a revoker only after the CAS below succeeded; a refused CAS
	// leaves them to Start's queued path, which writes them again.
	seq := w>>leaseShift + 2
	p.op.tctx.Context, p.op.seq, p.op.fence, p.op.err = ctx, seq, p.leaseFence, nil
	return lease.word.CompareAndSwap(w, leaseWord(seq, leaseStarted))
}

// waitLeased runs the use Start numbered under p's lease and reports
// whether it did; false when a revoker queued the use meanwhile.
func (p *Persistent) waitLeased() bool {
	c, q := p.c, p.c.queue
	seq := p.op.seq
	if !q.lease.word.CompareAndSwap(leaseWord(seq, leaseStarted), leaseWord(seq, leaseBusy)) {
		return false
	}
	p.leased++
	err := p.runTurn(seq)
	p.op.err = err
	if err == nil && q.lease.word.CompareAndSwap(leaseWord(seq, leaseBusy), leaseWord(seq, leaseIdle)) {
		return true
	}
	c.endLease(seq)
	return true
}

// endLease gives the lease back from the use or collective numbered seq
// that runs under it (busy): a call waits (leaseWant), or it failed.
func (c *Comm) endLease(seq uint64) {
	q := c.queue
	q.mu.Lock()
	if q.lease.word.Load()&leaseWant == 0 {
		q.seq = seq // else the call that set want wrote it, and may have moved it on
	}
	q.giveBackLocked()
	q.mu.Unlock()
}

// beginLeased is begin's turn for a blocking collective that finds a lease
// idle: it numbers the collective in the word and runs under the turn the
// lease holds (no request is posted and no collective queued while a lease
// lives), and end gives it back to the lease. ok is false when no lease is
// idle, and begin takes the turn as usual.
func (c *Comm) beginLeased(ctx context.Context, title string, start time.Time) (seq uint64, ok bool, err error) {
	q := c.queue
	w := q.lease.word.Load()
	if w&leaseState != leaseIdle {
		return 0, false, nil
	}
	seq = w>>leaseShift + 2
	if !q.lease.word.CompareAndSwap(w, leaseWord(seq, leaseCall)) {
		return 0, false, nil
	}
	q.cur = seq
	err = c.stoppedAt(seq)
	if err == nil && ctx.Err() != nil {
		err = c.failAt(seq, fault.FromContext(ctx.Err()))
	}
	if err != nil {
		c.endLease(seq)
		return 0, true, err
	}
	c.startOp(ctx, title, seq, start)
	return seq, true, nil
}

// grantLease ends the blocking collective numbered seq, which holds the
// driving role, by keeping the turn as a lease (with no holder: a blocking
// collective or a Persistent's direct turn takes it next), when the queue
// holds nothing and nobody waits on it; false leaves end to give it back.
func (c *Comm) grantLease(seq uint64) bool {
	q := c.queue
	if !q.quiet(0) {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.quietLocked(0, seq) || !q.colls.running.CompareAndSwap(false, true) {
		return false
	}
	q.lease.word.Store(leaseWord(seq, leaseIdle))
	return true
}

// endLeased is end's step for a collective that ran under a lease: the turn
// goes back to the lease, or to the queue when a call wants it or the
// collective failed. False: seq did not run under a lease.
func (c *Comm) endLeased(seq uint64, err error) bool {
	w := c.queue.lease.word.Load()
	if w>>leaseShift != seq || w&leaseState != leaseCall {
		return false
	}
	if err == nil && c.queue.lease.word.CompareAndSwap(leaseWord(seq, leaseCall), leaseWord(seq, leaseIdle)) {
		return true
	}
	c.endLease(seq)
	return true
}
