package a2a

import (
	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// The direct turn: a persistent use that Wait finds alone in the collective
// queue, with no goroutine driving and no point-to-point request posted,
// runs without the generic turn-taking of runColls and begin. Start is
// unchanged (it numbers and queues the use under the queue's lock, so
// every other call sees it and orders itself after it exactly as before);
// only the way Wait's goroutine takes the turn is shorter:
//
//   - runColls's loop, begin's takeTurn (a context Value lookup and the
//     collBusy spin) and acquireForCollective's checks are one CAS of
//     running, one of collBusy and one locked check that nothing drives
//     and no request is posted;
//   - end's release of the driving role and finishColl's removal of the
//     use from the queue are one locked section instead of two.
//
// Anything else — another collective queued, a goroutine driving or
// point-to-point requests in flight, a blocking collective holding
// collBusy — makes the turn fall back to the queued path, run by the same
// goroutine with the same locks held, so the concurrency rules are
// today's. The exchange itself (engine.Run, with its abort, peer-loss and
// deadline checks and its wait policy) and the reports are the queued
// path's.

// runDirect runs p's started use in a direct turn when it may, and reports
// whether the use is done (run here, directly or by the queued path's
// steps). False leaves everything as it was: the caller waits as before.
func (p *Persistent) runDirect() bool {
	c, q, op := p.c, p.c.queue, &p.op
	// Started and not done, op is queued; alone in the queue, it is the
	// oldest, the one to run next.
	if q.colls.n.Load() != 1 || op.done() || !q.colls.running.CompareAndSwap(false, true) {
		return false
	}
	if op.done() {
		// Another goroutine ran the use between the look and the CAS.
		q.mu.Lock()
		q.colls.running.Store(false)
		q.broadcastLocked()
		q.mu.Unlock()
		return false
	}
	// running is ours and op is the oldest: from here on the use runs on
	// this goroutine, one way or the other.
	c.life.calls.RLock() // before the queue's look: Close's failAll touches reqs under the write lock
	if !c.life.collBusy.CompareAndSwap(false, true) {
		c.life.calls.RUnlock()
		q.finishColl(op, op.run(&op.tctx)) // the queued path's turn
		return true
	}
	q.mu.Lock()
	if q.driving || len(q.inbox) != 0 || len(q.reqs) != 0 {
		q.mu.Unlock()
		c.life.collBusy.Store(false)
		c.life.calls.RUnlock()
		q.finishColl(op, op.run(&op.tctx)) // requests to drain or hand over: the queued path
		return true
	}
	q.driving = true // reqs is stable: its drivers write it only while driving
	q.mu.Unlock()
	seq := op.seq
	err := p.runTurn(seq)
	if err == nil && p.grantLease(seq) {
		return true // the turn stays: p's next uses run under the lease
	}
	c.life.calls.RUnlock()
	// collBusy before the queue: a blocking collective of another goroutine
	// sees the use queued until the section below and waits for running.
	c.life.collBusy.Store(false)
	q.mu.Lock()
	q.driving = false
	q.finishCollLocked(op, err) // nobody else drove: no driver to wake
	q.mu.Unlock()
	return true
}

// runTurn runs the use numbered seq in a turn this goroutine holds, direct
// or leased: the queued path's checks, exchange and reports without its
// turn-taking. It counts the use as direct and records the success.
func (p *Persistent) runTurn(seq uint64) error {
	c, ctx := p.c, &p.op.tctx
	p.direct++
	c.queue.cur = seq
	start := c.clock()
	err := c.stoppedAt(seq)
	if err == nil && ctx.Err() != nil {
		err = c.failAt(seq, fault.FromContext(ctx.Err()))
	}
	if err == nil {
		c.startOp(ctx, p.title(), seq, start)
		err = p.exchange(ctx, seq, start)
	} else {
		c.observeRejected(p.name, start, err)
	}
	if err == nil {
		c.life.okSeq.Store(seq)
	}
	return err
}
