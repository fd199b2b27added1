package a2a

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/engine"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// progressQueue lets point-to-point calls of many goroutines and the
// collectives of one progress together in the one engine. Exactly one
// goroutine at a time drives the transport (holds the driving role): a
// goroutine waiting for a request drives every posted request, not only its
// own, so a Send waiting for its peer never keeps a Recv of another
// goroutine from moving. Waiters that do not drive sleep until the driver
// completes a request or gives the role up. A collective takes the role
// for its whole run: it first finishes the point-to-point requests posted
// before it began (they precede it on every stream) and leaves those posted
// after it for later, so a pair's frames follow the order of the calls.
type progressQueue struct {
	eng *engine.Engine

	mu sync.Mutex
	// seq is the op sequence of the last collective begun (even; see Comm):
	// taken under mu with the tickets, so every stream carries the calls in
	// the order they were made. The running collective reads it unlocked.
	seq uint64
	// sendSeq and recvSeq number the point-to-point messages by peer.
	sendSeq, recvSeq []uint64
	inbox            []*Request    // posted, not yet taken by a driver
	inboxLen         atomic.Int32  // len(inbox), for the driver's look without the lock
	driving          bool          // a goroutine holds the driving role
	tickets          uint64        // requests posted so far; a request's ticket is its index + 1
	wake             chan struct{} // closed when the role is released or a request completes
	collWant         atomic.Int32  // collectives waiting for the role: the driver hands it over
	sleepers         atomic.Int32  // goroutines waiting on wake
	// cur is the op sequence of the collective running (or last run): what
	// the engine's stop check covers. Not seq, which started collectives
	// (icoll.go) move ahead while one runs. A plain word: only the goroutine
	// that holds the collective's turn writes it (begin, the direct turn)
	// and reads it (the engine's Stopped), and the turn's hand-over orders
	// one holder after the last; an atomic store cost a locked instruction
	// per collective.
	cur uint64
	// fence is 1 + the last ticket posted before the oldest collective
	// started ahead of its run (icoll.go), 0 when none waits: requests
	// after it must not move before it runs, or they would pass it on the
	// streams.
	fence atomic.Uint64
	colls collQueue
	// lease is a persistent collective's hold on the turn between its uses
	// (lease.go); life is the Comm's, whose collBusy and call lock the
	// lease holds.
	lease leaseQueue
	life  *lifecycle

	// Owned by the driver.
	reqs []*Request // posted requests not yet completed, in ticket order
	mark []uint32   // by peer and direction: the pass in which a request claimed it
	pass uint32
}

func newProgressQueue(e *engine.Engine, size int, life *lifecycle) *progressQueue {
	return &progressQueue{eng: e, life: life, wake: make(chan struct{}), mark: make([]uint32, 2*size),
		sendSeq: make([]uint64, size), recvSeq: make([]uint64, size)}
}

// Request is a point-to-point call in flight (Isend, Irecv, a Group's
// calls) or a nonblocking collective (IAllToAllV, ...). Wait or Test it for
// the result; until it is done its buffers belong to the Comm. A
// collective's Wait and Test report 0 bytes.
type Request struct {
	c      *Comm
	ctx    context.Context
	send   bool
	peer   int
	tag    int
	order  uint64 // the Comm's op sequence this call is ordered at (see Comm.begin)
	ticket uint64
	start  time.Time
	// deadline: the request's context's, else Config.Timeout after the
	// driver first waited with it pending.
	deadline    time.Time
	ownDeadline bool // deadline is Config.Timeout's, not the context's
	waited      bool

	sop transport.SendOp
	rop transport.RecvOp

	// over: the driver finished the request (err and n are set); done: it
	// also left the driver's list, so its owner may reuse it.
	over    bool
	done    atomic.Bool
	err     error
	n       int
	claimed bool // its Conn direction is ours: a failure leaves the stream mid-frame
	pooled  bool // made by Send/Recv: back to the pool after its Wait
	// persistent: made by SendInit or RecvInit, posted again by each Start.
	persistent bool
	posted     bool
	coll       *collOp // a nonblocking collective's (icoll.go); nil for point to point
}

var requestPool = sync.Pool{New: func() any { return new(Request) }}

// newRequest makes a request for a call of c; pooled requests are blocking
// calls whose Request nobody else sees.
func (c *Comm) newRequest(ctx context.Context, send bool, buf []byte, peer, tag int, pooled bool) *Request {
	var r *Request
	if pooled {
		r = requestPool.Get().(*Request)
		*r = Request{}
	} else {
		r = new(Request)
	}
	r.c, r.ctx, r.send, r.peer, r.tag, r.pooled = c, ctx, send, peer, tag, pooled
	if c.observer != nil || c.rep != nil {
		r.start = time.Now()
	}
	if dl, ok := ctx.Deadline(); ok {
		r.deadline = dl
	}
	if send {
		r.sop.Data = buf
	} else {
		r.rop.Dst = buf
	}
	return r
}

// check validates a request's arguments.
func (r *Request) check() error {
	c, name := r.c, r.name()
	switch {
	case r.peer < 0 || r.peer >= c.size || r.peer == c.rank:
		return fault.New(fault.ErrInvalidArgument, c.rank, "%s: peer %d (world %d, self %d)", name, r.peer, c.size, c.rank)
	case r.tag < 0 || r.tag > 1<<31-1:
		return fault.New(fault.ErrInvalidArgument, c.rank, "%s: tag %d outside [0, 2^31)", name, r.tag)
	}
	return nil
}

func (r *Request) name() string {
	if r.send {
		return "send"
	}
	return "recv"
}

// post validates and queues requests as one step: consecutive tickets, no
// call of another goroutine or collective in between. An argument error
// fails them all before any is queued, and fails the Comm (see Comm.fail).
func (c *Comm) post(reqs ...*Request) {
	var bad error
	for _, r := range reqs {
		if err := r.check(); err != nil && bad == nil {
			bad = err
		}
	}
	q := c.queue
	q.mu.Lock()
	q.revokeLocked()
	order := q.seq + 1
	var stop error
	if bad == nil {
		stop = c.stoppedAt(order)
	}
	if bad != nil || stop != nil {
		q.mu.Unlock()
		if bad != nil {
			stop = c.failAt(order, bad)
		}
		for _, r := range reqs {
			r.posted = true
			r.finish(0, stop)
			r.done.Store(true)
		}
		return
	}
	e := c.eng
	for _, r := range reqs {
		q.tickets++
		r.ticket, r.order, r.posted = q.tickets, order, true
		h := transport.Header{Kind: transport.OpSendRecv, Flags: transport.FlagLast, Epoch: e.Epoch(), Aux: uint64(uint32(r.tag))}
		if r.send {
			q.sendSeq[r.peer]++
			h.Src, h.Seq = uint32(c.rank), q.sendSeq[r.peer]
			r.sop.Reset(h, r.sop.Data)
		} else {
			q.recvSeq[r.peer]++
			h.Src, h.Seq = uint32(r.peer), q.recvSeq[r.peer]
			r.rop.Reset(h, r.rop.Dst, true)
		}
		q.inbox = append(q.inbox, r)
	}
	q.inboxLen.Store(int32(len(q.inbox)))
	driven := q.driving
	q.mu.Unlock()
	if driven {
		e.Transport().Wake() // a driver parked for other requests takes these in now
	}
}

// finish completes r with n bytes or err; the driver (or post) calls it
// once, and compact then publishes it as done.
func (r *Request) finish(n int, err error) {
	r.n, r.err, r.over = n, err, true
}

// Wait waits until the request is done and returns the bytes it moved (the
// received message's length for a receive). While it waits it drives every
// point-to-point request of the Comm, or sleeps while another goroutine
// does. If ctx ends first it returns ErrTimeout (or ErrAborted when ctx was
// canceled) naming the request and its peer, and the request stays in
// flight: Wait may be called again. The
// request fails on its own at the deadline of the context it was posted
// with (else Config.Timeout after it first waited), with the Comm's abort,
// or when its peer is lost or leaves.
func (r *Request) Wait(ctx context.Context) (int, error) {
	if !r.posted {
		return 0, fault.New(fault.ErrInvalidArgument, r.c.rank, "%s: Wait on a request not posted (a Group's before Post, a persistent one before Start)", r.name())
	}
	c := r.c
	if r.coll != nil {
		return 0, c.waitColl(ctx, r.coll)
	}
	for {
		c.life.calls.RLock()
		err := c.queue.waitFor(ctx, r)
		c.life.calls.RUnlock()
		if err == errFenced {
			// Run the collectives started before r, outside the call lock:
			// they take it themselves.
			err = c.runColls(ctx, nil)
			if err == nil {
				continue
			}
		}
		if err != nil {
			return 0, r.waitEnded(err)
		}
		return r.result()
	}
}

// waitEnded names the request in the error of a Wait whose own context
// ended first (the request stays in flight); other errors pass as they are.
func (r *Request) waitEnded(err error) error {
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		return err
	}
	call, want := r.describe()
	return fault.Wrap(fault.KindOf(err), r.peer, errors.Unwrap(err), "Wait for %s: its context ended first, and the request is still in flight: Wait again, or %s", call, want)
}

// describe names the request for errors (the call, its peer, tag and op
// number) and says what its peer should be doing.
func (r *Request) describe() (call, want string) {
	if r.send {
		return fmt.Sprintf("Send to rank %d (tag %d, op #%d)", r.peer, r.tag, r.order),
			fmt.Sprintf("check that rank %d calls Recv from this rank with tag %d", r.peer, r.tag)
	}
	return fmt.Sprintf("Recv from rank %d (tag %d, op #%d)", r.peer, r.tag, r.order),
		fmt.Sprintf("check that rank %d calls Send to this rank with tag %d", r.peer, r.tag)
}

// result reports a done request to the Observer and the traffic reports,
// once, and returns its outcome.
func (r *Request) result() (int, error) {
	if !r.waited {
		r.waited = true
		c := r.c
		if o := c.observer; o != nil {
			ev := OpEvent{Op: r.name(), Algo: "direct", Rank: c.rank, Size: c.size, Duration: time.Since(r.start), Err: r.err,
				LastPeer: r.peer}
			ev.LastWait = ev.Duration
			if r.send {
				ev.BytesSent = int64(r.n)
				if c.eng.SameHost(r.peer) {
					ev.BytesSentLocal = ev.BytesSent
				}
			} else {
				ev.BytesReceived = int64(r.n)
				if c.eng.SameHost(r.peer) {
					ev.BytesReceivedLocal = ev.BytesReceived
				}
			}
			o.OpDone(ev)
		}
		c.tallyP2P(r)
	}
	return r.n, r.err
}

// Test reports whether the request is done, driving the engine once if no
// other goroutine is, and never blocks. When done it returns what Wait would.
func (r *Request) Test() (bool, int, error) {
	if !r.posted {
		return false, 0, fault.New(fault.ErrInvalidArgument, r.c.rank, "%s: Test on a request not posted (a Group's before Post, a persistent one before Start)", r.name())
	}
	if r.coll != nil {
		return r.coll.test()
	}
	if !r.done.Load() {
		c := r.c
		c.life.calls.RLock()
		q := c.queue
		if q.take(false) {
			q.drivePass()
			q.release()
		}
		c.life.calls.RUnlock()
	}
	if !r.done.Load() {
		return false, 0, nil
	}
	n, err := r.result()
	return true, n, err
}

// WaitAll waits for every request and returns the first error.
func WaitAll(ctx context.Context, reqs ...*Request) error {
	var first error
	for _, r := range reqs {
		if _, err := r.Wait(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// waitFor waits until r is done, driving while no one else does.
func (q *progressQueue) waitFor(ctx context.Context, r *Request) error {
	for !r.done.Load() {
		if f := q.fence.Load(); f != 0 && r.ticket >= f {
			return errFenced
		}
		if q.take(false) {
			err := q.drive(ctx, 0, func() bool { return r.done.Load() })
			q.release()
			if err != nil && err != errHandOver {
				return err
			}
			if err == errHandOver {
				runtime.Gosched() // let the collective take the role
			}
			continue
		}
		if err := q.sleep(ctx, func() bool { return r.done.Load() || (!q.driving && q.collWant.Load() == 0) }); err != nil {
			return err
		}
	}
	return nil
}

// take tries to take the driving role; a collective (coll) may take it
// while others wait, a point-to-point waiter only when no collective wants it.
func (q *progressQueue) take(coll bool) bool {
	q.mu.Lock()
	ok := !q.driving && (coll || q.collWant.Load() == 0)
	q.driving = ok || q.driving
	q.mu.Unlock()
	return ok
}

// release gives the driving role up and wakes the sleepers.
func (q *progressQueue) release() {
	q.mu.Lock()
	q.driving = false
	q.broadcastLocked()
	q.mu.Unlock()
}

func (q *progressQueue) broadcastLocked() {
	if q.sleepers.Load() > 0 {
		close(q.wake)
		q.wake = make(chan struct{})
	}
}

// turnRecheck bounds a sleep on collBusy (sleepWhile): every path that
// clears it wakes the sleepers, and this only keeps a path that forgot from
// hanging a started collective.
const turnRecheck = 10 * time.Millisecond

// sleepWhile waits for a broadcast while busy holds. busy is cleared without
// the queue's lock (collBusy, at a call's end): the sleeper counts itself
// before it looks, and whoever clears busy looks at the count after
// (wakeSleepers), so one of the two sees the other.
func (q *progressQueue) sleepWhile(ctx context.Context, busy *atomic.Bool) error {
	q.mu.Lock()
	q.sleepers.Add(1)
	ch := q.wake
	if !busy.Load() {
		q.sleepers.Add(-1)
		q.mu.Unlock()
		return nil
	}
	q.mu.Unlock()
	defer q.sleepers.Add(-1)
	recheck := time.NewTimer(turnRecheck)
	defer recheck.Stop()
	select {
	case <-ch:
	case <-recheck.C:
	case <-ctx.Done():
		return fault.FromContext(ctx.Err())
	}
	return nil
}

// wakeSleepers wakes the goroutines asleep on the queue, if any, after a
// change to what they sleep on made without the queue's lock (sleepWhile).
func (q *progressQueue) wakeSleepers() {
	if q.sleepers.Load() > 0 {
		q.mu.Lock()
		q.broadcastLocked()
		q.mu.Unlock()
	}
}

// sleep waits for a broadcast unless ready holds (checked under the lock).
func (q *progressQueue) sleep(ctx context.Context, ready func() bool) error {
	q.mu.Lock()
	if ready() {
		q.mu.Unlock()
		return nil
	}
	ch := q.wake
	q.sleepers.Add(1)
	q.mu.Unlock()
	defer q.sleepers.Add(-1)
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fault.FromContext(ctx.Err())
	}
}

// acquireForCollective takes the driving role for a collective, asking a
// point-to-point driver to hand it over, calls locked under the queue's lock
// and returns the last ticket posted before: those requests precede the
// collective.
func (q *progressQueue) acquireForCollective(ctx context.Context, locked func()) (uint64, error) {
	// Nobody drives (the common case): take the role without announcing
	// the wait, two atomic adds fewer per collective.
	q.mu.Lock()
	if !q.driving {
		q.driving = true
		t := q.tickets
		locked()
		q.mu.Unlock()
		return t, nil
	}
	q.mu.Unlock()
	q.collWant.Add(1)
	defer q.collWant.Add(-1)
	for {
		q.mu.Lock()
		if !q.driving {
			q.driving = true
			t := q.tickets
			locked() // the op sequence moves with the tickets
			q.mu.Unlock()
			return t, nil
		}
		ch := q.wake
		q.sleepers.Add(1)
		q.mu.Unlock()
		q.eng.Transport().Wake() // a parked driver looks at collWant
		select {
		case <-ch:
			q.sleepers.Add(-1)
		case <-ctx.Done():
			q.sleepers.Add(-1)
			return 0, fault.FromContext(ctx.Err())
		}
	}
}

// errHandOver stops a point-to-point driver that a collective waits for.
var errHandOver = fault.New(fault.ErrAborted, -1, "driving role handed over")

// drain drives the requests posted up to ticket last until all are done
// (a collective's start).
func (q *progressQueue) drain(ctx context.Context, last uint64) error {
	for {
		if q.inboxLen.Load() > 0 {
			q.pull()
		}
		if len(q.reqs) == 0 || q.reqs[0].ticket > last {
			return nil
		}
		if err := q.drive(ctx, last, func() bool { return len(q.reqs) == 0 || q.reqs[0].ticket > last }); err != nil {
			return err
		}
	}
}

// pull moves the posted requests into the driver's list.
func (q *progressQueue) pull() {
	q.mu.Lock()
	q.reqs = append(q.reqs, q.inbox...)
	clear(q.inbox)
	q.inbox = q.inbox[:0]
	q.inboxLen.Store(0)
	q.mu.Unlock()
}

// drive progresses the requests (up to ticket last, or all when last is 0)
// until done reports true, ctx ends, or (for a point-to-point driver) a
// collective wants the role. Requests fail on their own stops meanwhile.
func (q *progressQueue) drive(ctx context.Context, last uint64, done func() bool) error {
	e := q.eng
	var idleStart time.Time
	for {
		moved := q.drivePass1(last)
		if done() {
			return nil
		}
		if last == 0 && q.collWant.Load() > 0 {
			return errHandOver
		}
		if moved {
			idleStart = time.Time{}
			continue
		}
		now := time.Now()
		if idleStart.IsZero() {
			idleStart = now
		}
		idle := now.Sub(idleStart)
		if idle < e.Waiting().Spin {
			runtime.Gosched()
			continue
		}
		if err := ctx.Err(); err != nil {
			return fault.FromContext(err)
		}
		if q.checkRequests(now) {
			continue // some failed: done may hold now
		}
		if err := e.Pause(idle, now, now.Add(engine.MaxPark)); err != nil {
			return err
		}
	}
}

// drivePass takes in new requests and tries each once (Test).
func (q *progressQueue) drivePass() { q.drivePass1(0) }

// drivePass1 takes in new requests and tries every request that may move
// (up to ticket last, or all when last is 0) once. A request waits while an
// earlier one to the same peer and direction is pending: a Conn carries one
// message at a time per direction, in the order the calls were posted.
func (q *progressQueue) drivePass1(last uint64) bool {
	if q.inboxLen.Load() > 0 {
		q.pull()
	}
	if f := q.fence.Load(); last == 0 && f != 0 {
		if last = f - 1; last == 0 {
			return false // nothing was posted before the collective
		}
	}
	q.pass++
	moved, completed := false, false
	e := q.eng
	for _, r := range q.reqs {
		if last != 0 && r.ticket > last {
			break
		}
		if r.over {
			continue
		}
		key := 2 * r.peer
		if r.send {
			key++
		}
		if q.mark[key] == q.pass {
			continue
		}
		q.mark[key] = q.pass
		conn := e.Conn(r.peer, 0)
		var done bool
		var err error
		if r.send {
			before := r.sop.Progress
			done, err = conn.TrySend(&r.sop)
			moved = moved || r.sop.Progress != before
			r.claimed = r.claimed || r.sop.Started
		} else {
			before := r.rop.Progress
			done, err = conn.TryRecv(&r.rop)
			moved = moved || r.rop.Progress != before
			r.claimed = r.claimed || r.rop.Started
		}
		switch {
		case err != nil:
			r.finish(0, r.c.failAt(r.order, fault.ForPeer(r.peer, err)))
		case done && r.send:
			r.finish(len(r.sop.Data), nil)
		case done:
			r.finish(r.rop.N, nil)
		default:
			continue
		}
		moved, completed = true, true
	}
	if completed {
		q.compact()
	}
	return moved
}

// compact drops completed requests, publishes them as done and wakes their
// waiters.
func (q *progressQueue) compact() {
	k := 0
	for _, r := range q.reqs {
		if !r.over {
			q.reqs[k] = r
			k++
		} else {
			r.done.Store(true)
		}
	}
	clear(q.reqs[k:])
	q.reqs = q.reqs[:k]
	if q.sleepers.Load() > 0 {
		q.mu.Lock()
		q.broadcastLocked()
		q.mu.Unlock()
	}
}

// checkRequests fails the requests that must stop (abort, a lost or
// departed peer, their context or deadline) and reports whether any did.
func (q *progressQueue) checkRequests(now time.Time) bool {
	failed := false
	fence := q.fence.Load()
	for _, r := range q.reqs {
		if r.over {
			continue
		}
		// Behind a started collective, Config.Timeout starts after it; the
		// request's context bounds it all along.
		if r.deadline.IsZero() && (fence == 0 || r.ticket < fence) {
			r.deadline, r.ownDeadline = now.Add(q.eng.Timeout()), true
		}
		err := r.c.stoppedFor(r)
		if err == nil {
			if cerr := r.ctx.Err(); cerr != nil && !errors.Is(cerr, context.DeadlineExceeded) {
				err = fault.FromContext(cerr)
			} else if cerr != nil || (!r.deadline.IsZero() && !now.Before(r.deadline)) {
				err = r.timeoutErr(q.eng.Timeout())
			}
			if err != nil {
				// Its peer waits for this message or sent part of one: the
				// stream's order is lost, so the Comm stops.
				err = r.c.failAt(r.order, err)
			}
		}
		if err != nil {
			r.finish(0, err)
			failed = true
		}
	}
	if failed {
		q.compact()
	}
	return failed
}

// timeoutErr is the error of a request at its deadline (timeout: the
// engine's, Config.Timeout): it names the call, its peer and tag, and says
// what the peer should be doing.
func (r *Request) timeoutErr(timeout time.Duration) error {
	within := "by its context's deadline"
	if r.ownDeadline {
		within = fmt.Sprintf("within %v (Config.Timeout)", timeout)
	}
	call, want := r.describe()
	return fault.Wrap(fault.ErrTimeout, r.peer, context.DeadlineExceeded, "%s did not complete %s: %s; if it is only slow, give the call a longer deadline",
		call, within, want)
}

// failAll fails every request still queued (Close).
func (q *progressQueue) failAll(err error) {
	q.pull()
	for _, r := range q.reqs {
		if !r.over {
			r.finish(0, err)
		}
	}
	q.compact()
}
