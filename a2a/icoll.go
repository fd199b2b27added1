package a2a

import (
	"context"
	"sync/atomic"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// Nonblocking collectives (IAllToAllV, ...) and persistent ones
// (persistent.go) are collectives started ahead of their run. Starting one
// numbers it at once, as a blocking call is numbered when it begins: its op
// sequence, and the last point-to-point ticket posted before it (its
// fence). The started collectives then run one at a time, in the order they
// were started, on whichever goroutine needs them first: a nonblocking
// call's own goroutine (started with it, so the exchange overlaps the
// caller's compute), a persistent request's Wait, a blocking collective
// called after them, or a point-to-point wait for a request posted after
// them. Point-to-point
// requests posted after a started collective do not move before it has run
// (progressQueue.fence), so every stream carries the calls in the order they
// were made, on every rank.

// collOp is one started collective.
type collOp struct {
	// run runs the collective in its turn; its ctx is turnCtx, which
	// begin recognises.
	run  func(ctx context.Context) error
	tctx turnCtx
	seq  uint64 // op sequence, taken when started
	// fence is the last point-to-point ticket posted before it was started:
	// those requests precede it on the streams.
	fence uint64
	err   error // the result, set before doneAt
	// doneAt is the op sequence of the last run that ended and left the
	// queue: the collective is done when it is seq. A number, not a flag,
	// so that a persistent collective's next Start has nothing to clear
	// (an atomic store is a locked instruction, on the path of every use).
	doneAt atomic.Uint64
}

// done reports whether the collective was run and removed from the queue.
func (op *collOp) done() bool { return op.doneAt.Load() == op.seq }

// test reports a collective's state without blocking, as Request.Test.
func (op *collOp) test() (bool, int, error) {
	if !op.done() {
		return false, 0, nil
	}
	return true, 0, op.err
}

// turnKey is the context key under which a collOp's run finds its turn.
type turnKey struct{}

// turnCtx is the context a started collective runs with: the caller's, plus
// the turn. A type of its own (not context.WithValue) so that a persistent
// request reuses it from Start to Start without allocating.
type turnCtx struct {
	context.Context
	op *collOp
}

// Value returns the turn for turnKey and defers to the caller's context
// otherwise.
func (t *turnCtx) Value(key any) any {
	if _, ok := key.(turnKey); ok {
		return t.op
	}
	return t.Context.Value(key)
}

// collQueue is the started collectives not yet run, in the order started.
// It lives in progressQueue, whose lock guards pending.
type collQueue struct {
	pending []*collOp
	n       atomic.Int32 // len(pending), read without the lock
	// running is held by the goroutine running pending collectives: one
	// at a time, in order. An atomic, not a channel: a persistent
	// Start-Wait of 8 bytes costs ~0.5 us, and every operation shows.
	running atomic.Bool
}

// startColl numbers op as the next collective and queues it to run.
func (q *progressQueue) startColl(op *collOp) {
	q.mu.Lock()
	q.revokeLocked() // a lease's started use goes first
	q.seq += 2
	op.seq, op.fence, op.err = q.seq, q.tickets, nil // done() is false from here: doneAt < seq
	q.colls.pending = append(q.colls.pending, op)
	if len(q.colls.pending) == 1 {
		q.fence.Store(op.fence + 1)
	}
	q.colls.n.Store(int32(len(q.colls.pending)))
	q.mu.Unlock()
}

// finishColl records op's result and takes it off the queue; the fence
// moves to the next started collective, and the point-to-point drivers that
// waited on it look again.
func (q *progressQueue) finishColl(op *collOp, err error) {
	q.mu.Lock()
	parked := q.finishCollLocked(op, err)
	q.mu.Unlock()
	if parked {
		q.eng.Transport().Wake() // costs a syscall: only when someone drives
	}
}

// finishCollLocked is finishColl under the queue's lock; it reports
// whether a point-to-point driver may be parked behind the fence, to wake
// once the lock is given up.
func (q *progressQueue) finishCollLocked(op *collOp, err error) bool {
	op.err = err
	p := q.colls.pending
	copy(p, p[1:]) // shift, not reslice: Start allocates nothing
	p[len(p)-1] = nil
	q.colls.pending = p[:len(p)-1]
	if len(q.colls.pending) > 0 {
		q.fence.Store(q.colls.pending[0].fence + 1)
	} else {
		q.fence.Store(0)
	}
	q.colls.n.Store(int32(len(q.colls.pending)))
	op.doneAt.Store(op.seq)
	q.colls.running.Store(false)
	q.broadcastLocked() // under the lock: a sleeper checks running under it
	return q.driving    // a point-to-point driver, maybe parked behind the fence
}

// errFenced tells a point-to-point waiter that its request waits for a
// started collective to run first.
var errFenced = fault.New(fault.ErrAborted, -1, "behind a started collective")

// runColls runs the started collectives in order until op is done (every
// collective started so far, for nil). ctx bounds only the wait for the
// goroutine running them; each runs with the context it was started with.
func (c *Comm) runColls(ctx context.Context, op *collOp) error {
	q := c.queue
	for {
		if op != nil && op.done() || op == nil && q.colls.n.Load() == 0 {
			return nil
		}
		if !q.colls.running.CompareAndSwap(false, true) {
			// For nil, n == 0 too: a direct turn that ends as a lease
			// (lease.go) keeps running.
			if err := q.sleep(ctx, func() bool {
				return !q.colls.running.Load() || op != nil && op.done() || op == nil && q.colls.n.Load() == 0
			}); err != nil {
				return err
			}
			continue
		}
		// The oldest, under the lock: no atomic copy of it is kept, which
		// would cost two stores per use on a persistent collective's direct
		// turn (persistent_direct.go) to save this lock round here.
		q.mu.Lock()
		if len(q.colls.pending) == 0 {
			q.colls.running.Store(false)
			q.broadcastLocked()
			q.mu.Unlock()
			continue
		}
		next := q.colls.pending[0]
		q.mu.Unlock()
		q.finishColl(next, next.run(&next.tctx)) // and gives running up
	}
}

// waitColl waits for a nonblocking collective and returns its result. It
// leaves the running to the goroutine the call started: run here, the
// collective would hold this Wait past ctx, since it runs under the
// context it was started with.
func (c *Comm) waitColl(ctx context.Context, op *collOp) error {
	if err := c.queue.sleepUntil(ctx, op.done); err != nil {
		return err
	}
	return op.err
}

// sleepUntil sleeps until done reports true (checked under the lock, and
// at every broadcast) or ctx ends.
func (q *progressQueue) sleepUntil(ctx context.Context, done func() bool) error {
	for !done() {
		if err := q.sleep(ctx, done); err != nil {
			return err
		}
	}
	return nil
}

// takeTurn is begin's first step. A started collective's run (ctx carries
// its turn) returns the turn, once no collective runs any more: the one
// running was called before it was started. Any other call first runs the
// collectives started before it.
func (c *Comm) takeTurn(ctx context.Context) (*collOp, error) {
	if c.queue.colls.n.Load() == 0 {
		return nil, nil // no collective waits: the blocking path as it was
	}
	turn, _ := ctx.Value(turnKey{}).(*collOp)
	if turn == nil {
		if err := c.runColls(ctx, nil); err != nil {
			return nil, err
		}
		return nil, nil
	}
	// A blocking call of another goroutine holds collBusy: sleep until it
	// ends (end wakes the queue's sleepers). Not a time.Sleep backoff: its
	// steps grow to where the call's end is seen up to a millisecond late,
	// more in a process whose goroutines all wait (the runtime's poller
	// wakes timers in whole milliseconds).
	for !c.life.collBusy.CompareAndSwap(false, true) {
		if err := c.queue.sleepWhile(ctx, &c.life.collBusy); err != nil {
			return nil, c.failAt(turn.seq, err)
		}
	}
	return turn, nil
}

// startColl starts a nonblocking collective that run runs, and a goroutine
// that runs it (and those started before it) while the caller goes on.
func (c *Comm) startColl(ctx context.Context, run func(ctx context.Context) error) *Request {
	op := &collOp{run: run}
	op.tctx = turnCtx{Context: ctx, op: op}
	c.queue.startColl(op)
	go c.runColls(context.Background(), op)
	return &Request{c: c, ctx: ctx, coll: op, posted: true}
}

// IAllToAllV starts AllToAllV(ctx, send, sendCounts, recv, recvCounts) and
// returns at once; its buffers and counts belong to the Comm until the
// request is done. Nonblocking collectives are ordered as MPI's: every rank
// starts its collectives, blocking and nonblocking, in the same order, and
// they run in that order. The exchange progresses on a goroutine of its
// own, so it overlaps the caller's work with no Test calls. Errors,
// argument errors included, come from Wait or Test. Point-to-point calls
// made after it start after it on the streams; a blocking collective
// called after it first waits for it.
func (c *Comm) IAllToAllV(ctx context.Context, send []byte, sendCounts []int, recv []byte, recvCounts []int) *Request {
	return c.startColl(ctx, func(ctx context.Context) error { return c.AllToAllV(ctx, send, sendCounts, recv, recvCounts) })
}

// IAllToAll starts AllToAll(ctx, send, recv); see IAllToAllV.
func (c *Comm) IAllToAll(ctx context.Context, send, recv []byte) *Request {
	return c.startColl(ctx, func(ctx context.Context) error { return c.AllToAll(ctx, send, recv) })
}

// IAllReduce starts AllReduce(ctx, send, recv, dt, op); see IAllToAllV.
func (c *Comm) IAllReduce(ctx context.Context, send, recv []byte, dt DType, op Op) *Request {
	return c.startColl(ctx, func(ctx context.Context) error { return c.AllReduce(ctx, send, recv, dt, op) })
}

// IAllGather starts AllGather(ctx, send, recv); see IAllToAllV.
func (c *Comm) IAllGather(ctx context.Context, send, recv []byte) *Request {
	return c.startColl(ctx, func(ctx context.Context) error { return c.AllGather(ctx, send, recv) })
}

// IBarrier starts Barrier(ctx); its Wait returns once every rank has
// started it. See IAllToAllV.
func (c *Comm) IBarrier(ctx context.Context) *Request {
	return c.startColl(ctx, func(ctx context.Context) error { return c.Barrier(ctx) })
}
