package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// copyChunk bounds the local copying done between two passes over the
// network operations, so that copying never delays reading a socket for long.
const copyChunk = 256 << 10

// spinPolls is how many passes over the operations a spinning engine makes
// between two clock reads: a pass that finds nothing takes tens of ns, so
// the spin still ends within a few us of the spin time.
const spinPolls = 32

// idleClock is how progress tracks its idle time. A clock read costs about
// as much as a pass over the operations, so a spinning engine reads it only
// every spinPolls idle passes.
type idleClock struct {
	start time.Time // when the operations stopped moving; zero while they move
	// waited: the engine has waited in this call, so arrivals need a clock
	// read for the wait attribution.
	waited bool
	// free is how many idle passes go without a clock read after the start
	// and after each progress; quiet is how many are left.
	free, quiet int
}

// progress drives the posted operations of the round to completion.
func (e *Engine) progress(ctx context.Context) error {
	// Idle passes before the first clock read, after the start and after
	// each progress. A rank that spins polls a while: small messages are
	// often a poll or two away, and a clock read between those polls
	// delays seeing them. Arrivals meanwhile add no waiting time to the
	// attribution. A crowded rank (no spin) reads the clock and yields
	// at once: yielding first, without the checks, doubled a 4-rank 8 B
	// AllToAll on 2 cores (5.5 -> 10.5 us).
	var clk idleClock
	if e.wait.Spin > 0 {
		clk.free = spinPolls
	}
	clk.quiet = clk.free
	for {
		moved, err := e.pollLL(clk.waited)
		if err != nil {
			return err
		}
		pending := e.ll.left
		if len(e.round.active) > 0 { // a round of LL messages only has none
			framesMoved, framesPending, err := e.pollFrames(clk.waited)
			if err != nil {
				return err
			}
			moved, pending = moved || framesMoved, pending+framesPending
		}
		if pending == 0 {
			return e.copyRest()
		}
		did, err := e.copySome()
		if err != nil {
			return err
		}
		if moved || did {
			clk.start, clk.quiet = time.Time{}, clk.free
			continue
		}
		if clk.quiet > 0 {
			// Poll again without reading the clock, which costs as much as
			// a pass over the operations and delays the pass that sees the
			// data arrive.
			clk.quiet--
			continue
		}
		if err := e.idle(ctx, &clk); err != nil {
			return err
		}
	}
}

// pollFrames tries every frame of the round still in flight once. It
// reports whether any moved and how many are still pending.
func (e *Engine) pollFrames(waited bool) (moved bool, pending int, err error) {
	for i := range e.round.active {
		a := &e.round.active[i]
		if a.done {
			continue
		}
		done, progressed, err := e.tryFrame(a)
		if err != nil {
			return moved, pending, fault.ForPeer(a.peer, err)
		}
		if done {
			a.done, moved = true, true
			if err := e.landed(a, waited); err != nil {
				return moved, pending, err
			}
			continue
		}
		moved = moved || progressed
		if a.watchLL && e.frameNotBegun(a) && e.ll.watchOf[a.peer].Stored(a.peer, e.ll.epoch) {
			return moved, pending, fault.New(fault.ErrMismatch, a.peer, "rank %d sent its block as a small message (LL: blocks up to the LL cutoff, A2A_LL_BYTES), this rank expects a larger one: recvCounts must equal what the sender passes in sendCounts, and every rank must use the same LL cutoff", a.peer)
		}
		pending++
	}
	return moved, pending, nil
}

// tryFrame moves a frame once: done when it completed, progressed when some
// of it moved.
func (e *Engine) tryFrame(a *activeOp) (done, progressed bool, err error) {
	if a.send {
		op := &e.round.sendOps[a.idx]
		before := op.Progress
		done, err = a.conn.TrySend(op)
		return done, op.Progress != before, err
	}
	op := &e.round.recvOps[a.idx]
	before := op.Progress
	done, err = a.conn.TryRecv(op)
	return done, op.Progress != before, err
}

// frameNotBegun reports whether nothing of a's frame has moved yet.
func (e *Engine) frameNotBegun(a *activeOp) bool {
	if a.send {
		return e.round.sendOps[a.idx].Progress == 0
	}
	return e.round.recvOps[a.idx].Progress == 0
}

// landed finishes a frame that completed: checks an LL length announcement,
// scatters a staged receive, reduces a RecvReduce frame, and attributes the
// wait.
func (e *Engine) landed(a *activeOp, waited bool) error {
	if a.send {
		return nil
	}
	if a.announce {
		if err := checkCount(a.peer, a.dst, a.count); err != nil {
			return err
		}
	}
	if a.scatter != nil {
		var c transport.VecCursor
		c.Scatter(a.scatter, e.round.recvOps[a.idx].Dst)
	}
	switch op := &e.round.recvOps[a.idx]; {
	case a.into != nil && op.Combined:
		e.inPlace++
	case a.into != nil:
		// Reduce at once: the next round may forward this result, and the
		// landed frame is still in cache.
		if err := e.reduceLanded(a, op.Dst); err != nil {
			return err
		}
	}
	e.op.arrived(a.peer, waited)
	return nil
}

// reduceLanded reduces a landed RecvReduce frame into its destination.
func (e *Engine) reduceLanded(a *activeOp, landed []byte) error {
	return e.reduceAt(a, 0, landed)
}

// Combine reduces the bytes of active op id's frame from off, read in place
// by the transport (transport.RecvOp.Combine), into their destination.
func (e *Engine) Combine(id, off int, src []byte) error {
	return e.reduceAt(&e.round.active[id], off, src)
}

// reduceAt reduces src, the bytes of a's frame from off, into a's
// destination (with a's second operand, if any).
func (e *Engine) reduceAt(a *activeOp, off int, src []byte) error {
	var with []byte
	if a.with != nil {
		with = a.with[off : off+len(src)]
	}
	return e.reduceInto(a.into[off:off+len(src)], with, src, a.landedFirst)
}

// reduceInto reduces landed into into: into = into op landed, or with a
// second operand into = with op landed (landed op with when landedFirst).
func (e *Engine) reduceInto(into, with, landed []byte, landedFirst bool) error {
	var err error
	switch {
	case with == nil:
		err = reduce.Reduce(e.reducer.dtype, e.reducer.op, into, landed)
	case landedFirst:
		err = reduce.ReduceTo(e.reducer.dtype, e.reducer.op, into, landed, with)
	default:
		err = reduce.ReduceTo(e.reducer.dtype, e.reducer.op, into, with, landed)
	}
	if err != nil {
		return fault.Wrap(fault.ErrInvalidArgument, -1, err, "reduction")
	}
	return nil
}

// idle is an idle pass of progress that reads the clock: it spins until the
// spin time, then checks the stops and pauses.
func (e *Engine) idle(ctx context.Context, clk *idleClock) error {
	now := time.Now()
	clk.waited = true
	if clk.start.IsZero() {
		clk.start = now
	}
	if e.op.start.IsZero() {
		// Nobody timed the start (no Observer): the wait attribution
		// counts from the first wait, which read the clock anyway.
		e.op.start = now
	}
	idle := now.Sub(clk.start)
	if idle < e.wait.Spin {
		clk.quiet = spinPolls
		if e.wait.SharedProcess {
			// Other ranks are goroutines of this process (tests, in-process
			// groups): let them run instead of spinning a whole time slice.
			// A rank alone in its process does not: Gosched hands the
			// goroutine to another thread when GOMAXPROCS > 1, a futex wake
			// and sleep per poll.
			runtime.Gosched()
		}
		return nil
	}
	if err := e.checkStop(ctx, now); err != nil {
		return err
	}
	return e.Pause(idle, now, e.op.deadline)
}

// copyRest does the round's remaining local copies: the network part of the
// round is done.
func (e *Engine) copyRest() error {
	for {
		did, err := e.copySome()
		if err != nil || !did {
			return err
		}
	}
}

// copySome does up to copyChunk bytes of the round's local copies and
// reports whether there was anything to copy. The engine calls it when the
// network has nothing for it, so local copies fill the gaps of the transfers.
func (e *Engine) copySome() (bool, error) {
	rd := &e.round
	if rd.copied == len(rd.copies) {
		return false, nil
	}
	c := &rd.copies[rd.copied]
	if c.sv != nil {
		if copyVecSome(c) {
			rd.copied++
		}
		return true, nil
	}
	n := min(len(c.dst), copyChunk) // copyChunk is a multiple of every element size
	switch {
	case c.with != nil:
		if err := reduce.ReduceTo(e.reducer.dtype, e.reducer.op, c.dst[:n], c.with[:n], c.src[:n]); err != nil {
			return false, fault.Wrap(fault.ErrInvalidArgument, -1, err, "reduction")
		}
		c.with = c.with[n:]
	case c.reduce:
		if err := reduce.Reduce(e.reducer.dtype, e.reducer.op, c.dst[:n], c.src[:n]); err != nil {
			return false, fault.Wrap(fault.ErrInvalidArgument, -1, err, "reduction")
		}
	default:
		copy(c.dst[:n], c.src)
	}
	c.dst, c.src = c.dst[n:], c.src[n:]
	if len(c.dst) == 0 {
		rd.copied++
	}
	return true, nil
}

// checkStop reports why the operation must stop waiting: abort, cancellation
// or deadline. The first call of an operation without a deadline sets it.
func (e *Engine) checkStop(ctx context.Context, now time.Time) error {
	if e.op.deadline.IsZero() {
		e.op.deadline, e.op.ownDeadline = now.Add(e.timeout), true
	}
	if err := e.stopped(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return e.timeoutErr()
		}
		return fault.FromContext(err)
	}
	if !now.Before(e.op.deadline) {
		return e.timeoutErr()
	}
	return nil
}

// timeoutErr is the error of the running operation at its deadline: it
// names the operation, its op sequence number and the ranks this rank was
// still waiting for in the round it had reached (Rank is the first of them,
// Ranks all), and says what to check.
func (e *Engine) timeoutErr() error {
	waited := e.pendingPeers()
	err := &fault.Error{Kind: fault.ErrTimeout, Rank: -1, Err: context.DeadlineExceeded}
	within := "by its context's deadline"
	if e.op.ownDeadline {
		within = fmt.Sprintf("within %v (Config.Timeout)", e.timeout)
	}
	err.Detail = fmt.Sprintf("%s (op #%d) did not complete %s", e.op.name, e.op.seq, within)
	if len(waited) > 0 {
		err.Rank = waited[0]
		if len(waited) > 1 {
			err.Ranks = waited
		}
		err.Detail += fmt.Sprintf(", waiting for %s: check that every rank calls %s, in the same order; if some are only slow, give the call a longer deadline",
			fault.RanksText(waited), e.op.name)
	}
	return err
}

// pendingPeers lists, in order, the peers whose part of the running round
// has not completed: a message not yet arrived from them, or not yet taken
// by them.
func (e *Engine) pendingPeers() []int {
	var peers []int
	for i := range e.ll.left {
		peers = append(peers, e.ll.loads[i].peer)
	}
	for i := range e.round.active {
		if a := &e.round.active[i]; !a.done {
			peers = append(peers, a.peer)
		}
	}
	slices.Sort(peers)
	return slices.Compact(peers)
}
