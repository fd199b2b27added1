package dispatch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/internal/nap"
	"github.com/a2a-moe/a2a/routing"
)

// combineDecode is Combine (sync) or CombineSend in the decode mode: the
// outputs go into this rank's out region (unless the experts wrote them
// there, through Output), the ready word tells the shared-memory peers, and
// the outputs for point-to-point peers are posted.
func (d *Dispatcher) combineDecode(ctx context.Context, h *Handle, expertOutputs, out []byte, sync bool) error {
	if err := d.prepareCombine(ctx, h, expertOutputs, out); err != nil {
		return err
	}
	if h.ll == nil {
		h.state = stateDispatched
		return invalidf("decode mode: handle of another mode")
	}
	ll, set, rb := d.ll, h.ll, d.rowBytes
	set.start = time.Now()
	// Outputs computed in place in Recv (its rows region, without FP8)
	// are read there; the ready word's low bit says so.
	outs, inRows := set.out, !d.fp8 && len(expertOutputs) > 0 && &expertOutputs[0] == &set.rows[0]
	if inRows {
		outs = set.rows
	} else if len(expertOutputs) > 0 && &expertOutputs[0] != &set.out[0] {
		for i, n := range set.total {
			off := i*ll.block + ll.recvHdr
			copy(set.out[off:off+n*rb], expertOutputs[off:off+n*rb])
		}
	}
	atomic.StoreUint64(readyOf(set.ctl), set.seq<<1|uint64(boolBits(inRows)))
	for j := range d.size {
		set.recvReq[j], set.sendReq[j] = nil, nil
		if j == d.rank || d.sharedWith[j] {
			continue
		}
		back := ll.recvHdr + h.plan.RankRows[j]*rb
		off := j*ll.block + ll.recvHdr
		set.recvReq[j], set.sendReq[j] = set.combRecv[j], set.combSend[j]
		if err := startPair(ctx, set.recvReq[j], set.back[j][ll.recvHdr:back], set.sendReq[j], outs[off:off+set.total[j]*rb]); err != nil {
			return h.failDecode(err)
		}
	}
	h.pending = true
	if sync {
		return h.Wait()
	}
	return nil
}

// waitDecode completes the operation in flight on a decode handle.
func (h *Handle) waitDecode() error {
	if !h.pending {
		return h.err
	}
	h.pending = false
	if h.d.isClosed() {
		// Close unmapped the sets: nothing of the step may be read.
		h.state, h.err = stateFailed, fmt.Errorf("%w: dispatch: dispatcher closed with the step in flight", a2a.ErrClosed)
		return h.err
	}
	var err error
	switch h.state {
	case stateDispatching:
		if err = h.finishDispatch(); err == nil {
			h.state = stateDispatched
		}
	case stateCombining:
		if err = h.finishCombine(); err == nil {
			h.state = stateCombined
		}
	}
	if err != nil {
		return h.failDecode(err)
	}
	h.ctx, h.tokens, h.expertOut, h.out = nil, nil, nil, nil
	return nil
}

// releaseDecode gives a decode handle's set back for the step after next.
// A step released without its combine still tells the peers that this rank
// is done with its rows (the ready word), so that they may write the next
// step's into the set; the outputs it never combined are not read by
// anyone, as long as every rank skipped that combine alike.
func (h *Handle) releaseDecode() {
	if h.state == stateIdle {
		return
	}
	h.Wait()
	if h.state == stateDispatched && !h.d.isClosed() {
		atomic.StoreUint64(readyOf(h.ll.ctl), h.ll.seq<<1)
	}
	h.state, h.err = stateIdle, nil
	h.ctx, h.tokens, h.expertOut, h.out = nil, nil, nil, nil
}

// finishDispatch waits for every source's block of the step, checks its
// header and indexes the segments.
func (h *Handle) finishDispatch() error {
	d, ll, set := h.d, h.d.ll, h.ll
	P, me := d.size, d.rank
	var w decodeWaiter
	for i := range P {
		if i == me || !d.sharedWith[i] {
			continue
		}
		for f := flagOf(set.ctl, i); atomic.LoadUint64(f) != set.seq; {
			if err := w.idle(h, "rows", i); err != nil {
				return err
			}
		}
	}
	if err := h.awaitRequests(&w, "rows"); err != nil {
		return err
	}
	for i := range P {
		blk := set.rows[i*ll.wireBlock : (i+1)*ll.wireBlock]
		cnt := blk[ll.wireHdr-ll.cntBytes : ll.wireHdr]
		total := getRowCounts(h.rowsFrom[i*d.nLocal:(i+1)*d.nLocal], cnt)
		for l := d.nLocal; l < d.maxLocal; l++ {
			if n := binary.LittleEndian.Uint32(cnt[4*l:]); n != 0 {
				return h.mismatch(i, "sends %d rows for local expert %d of %d", n, l, d.nLocal)
			}
		}
		if total > ll.rowCap {
			return h.mismatch(i, "sends %d rows, more than the %d a block holds", total, ll.rowCap)
		}
		if set.recvReq[i] != nil {
			if want := ll.cntBytes + total*d.wireRow; set.recvN[i] != want {
				return h.mismatch(i, "sent a %d-byte block announcing %d rows (%d bytes)", set.recvN[i], total, want)
			}
		}
		set.total[i] = total
	}
	if d.fp8 {
		h.unwireDecode()
	}
	h.indexDecode()
	h.dispatchTime, h.combineTime = time.Since(set.start), 0
	if o := d.cfg.Observer; o != nil {
		o.ObserveDispatch(h.dispatchTime, h.expertLoad, h.dropped, routing.Imbalance(h.plan.RankRows))
	}
	return nil
}

// indexDecode fills the segments, the rows per local expert and the step's
// byte counts from the received headers.
func (h *Handle) indexDecode() {
	d, ll, set := h.d, h.d.ll, h.ll
	P, rb, nLocal := d.size, d.rowBytes, d.nLocal
	clear(h.expertRows)
	h.sentBytes, h.recvBytes = 0, 0
	for i := range P {
		pos := i*ll.block + ll.recvHdr
		for l := range nLocal {
			n := h.rowsFrom[i*nLocal+l]
			h.segs[l*P+i] = Segment{Source: i, Offset: pos, Rows: n}
			h.expertRows[l] += n
			pos += n * rb
		}
		if i != d.rank {
			h.sentBytes += int64(h.plan.RankRows[i] * d.wireRow)
			h.recvBytes += int64(set.total[i] * d.wireRow)
		}
	}
}

// unwireDecode converts the received wire rows of every block into Recv's
// rows (or with KeepFP8 into its E4M3 bytes and scales), row n of a block
// to row n of the same block of Recv.
func (h *Handle) unwireDecode() {
	d, ll, set := h.d, h.d.ll, h.ll
	H, rb, wb, dt := d.cfg.Hidden, d.rowBytes, d.wireRow, d.cfg.DType
	S := reduce.E4M3Scales(H)
	h.rowF, h.rowS = growFloats(h.rowF, H), growFloats(h.rowS, S)
	for i, total := range set.total {
		for n := range total {
			w := set.rows[i*ll.wireBlock+ll.wireHdr+n*wb:][:wb]
			off := i*ll.block + ll.recvHdr + n*rb
			sc := h.rowS[:S]
			if d.cfg.KeepFP8 {
				row := off / rb
				copy(set.recv8[row*H:(row+1)*H], w[:H])
				sc = set.scales[row*S : (row+1)*S]
			}
			for k := range sc {
				sc[k] = math.Float32frombits(binary.LittleEndian.Uint32(w[H+4*k:]))
			}
			if !d.cfg.KeepFP8 {
				dequantizeRow(dt, set.recv[off:off+rb], w[:H], sc, h.rowF)
			}
		}
	}
}

// finishCombine waits for the outputs of every rank this rank sent rows to
// and sums them per token.
func (h *Handle) finishCombine() error {
	d, ll, set := h.d, h.d.ll, h.ll
	P, me, s := d.size, d.rank, set.seq&1
	var w decodeWaiter
	for j := range P {
		switch {
		case j == me:
			outs := set.out
			if atomic.LoadUint64(readyOf(set.ctl))&1 != 0 {
				outs = set.rows
			}
			h.rowSrc[j] = outs[me*ll.block : (me+1)*ll.block]
		case d.sharedWith[j]:
			peer := ll.peers[j][s]
			r := readyOf(peer.ctl)
			for h.plan.RankRows[j] > 0 && atomic.LoadUint64(r)>>1 < set.seq {
				if err := w.idle(h, "outputs", j); err != nil {
					return err
				}
			}
			outs := peer.out
			if atomic.LoadUint64(r)&1 != 0 {
				outs = peer.rows
			}
			h.rowSrc[j] = outs[me*ll.block : (me+1)*ll.block]
		default:
			h.rowSrc[j] = set.back[j]
		}
		h.rowDelta[j] = 0
	}
	if err := h.awaitRequests(&w, "outputs"); err != nil {
		return err
	}
	for j := range P {
		if set.recvReq[j] != nil && set.recvN[j] != h.plan.RankRows[j]*d.rowBytes {
			return h.mismatch(j, "sent %d bytes of outputs for this rank's %d rows", set.recvN[j], h.plan.RankRows[j])
		}
	}
	h.weightedSum()
	h.combineTime = time.Since(set.start)
	if o := d.cfg.Observer; o != nil {
		o.ObserveCombine(h.combineTime)
	}
	return nil
}

// awaitRequests waits for the set's point-to-point requests, recording the
// received lengths in recvN.
func (h *Handle) awaitRequests(w *decodeWaiter, what string) error {
	set := h.ll
	for {
		left, moved := 0, false
		for j := range set.recvReq {
			for _, r := range [2]*a2a.Request{set.recvReq[j], set.sendReq[j]} {
				if r == nil {
					continue
				}
				done, n, err := r.Test()
				if err != nil {
					return err
				}
				if !done {
					left++
					continue
				}
				moved = true
				if r == set.recvReq[j] {
					set.recvN[j] = n
				}
			}
		}
		if left == 0 {
			return nil
		}
		if !moved {
			if err := w.idle(h, what, -1); err != nil {
				return err
			}
		}
	}
}

// decodeWaiter paces a wait on peers' control words and requests: it polls,
// then yields the core (the Comm's policy: no spin on a crowded host), then
// blocks its thread 20 us at a time (nap.For: ~40 us on the 2-core VM), and
// ends the wait with the Comm's failure, the context's, or after the Comm's
// timeout.
type decodeWaiter struct {
	n               int
	start, deadline time.Time
	since           time.Duration
}

// idle is called after a poll that found nothing; peer is the rank awaited
// (-1: some point-to-point peer), for the error.
func (w *decodeWaiter) idle(h *Handle, what string, peer int) error {
	ll := h.d.ll
	if w.n++; w.n&31 == 0 {
		now := time.Now()
		if w.start.IsZero() {
			w.start, w.deadline = now, now.Add(ll.timeout)
			if dl, ok := h.ctx.Deadline(); ok {
				w.deadline = dl
			}
		}
		w.since = now.Sub(w.start)
		if err := h.ctx.Err(); err != nil {
			kind := a2a.ErrAborted
			if errors.Is(err, context.DeadlineExceeded) {
				kind = a2a.ErrTimeout
			}
			return &a2a.Error{Kind: kind, Rank: peer, Err: err, Detail: fmt.Sprintf(
				"dispatch: decode step %d: the context ended waiting for the %s of rank %d", h.ll.seq, what, peer)}
		}
		if err := h.d.comm.Err(); err != nil {
			return err
		}
		if now.After(w.deadline) {
			return &a2a.Error{Kind: a2a.ErrTimeout, Rank: peer, Detail: fmt.Sprintf(
				"dispatch: decode step %d: waited %v for the %s of rank %d", h.ll.seq, w.since.Round(time.Millisecond), what, peer)}
		}
	}
	ll.drive()
	// Ranks may be goroutines of one process (in-process groups), with
	// fewer Ps than ranks: a poll that kept its P would hold up the rank
	// it waits for until the scheduler preempts it, 10 ms later.
	runtime.Gosched()
	switch {
	case w.since < ll.spin:
	case w.since < ll.spin+time.Millisecond:
		unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	default:
		// Not time.Sleep: in a process where every goroutine waits, its
		// wake-up comes from the runtime's poller in whole milliseconds.
		nap.For(20 * time.Microsecond)
	}
	return nil
}

// drive tests the point-to-point requests of both sets, which progresses
// them: a rank waiting for a shared-memory peer still moves the messages
// another peer waits for.
func (ll *decodeMode) drive() {
	for s := range ll.sets {
		set := &ll.sets[s]
		for j := range set.recvReq {
			if r := set.recvReq[j]; r != nil {
				r.Test()
			}
			if r := set.sendReq[j]; r != nil {
				r.Test()
			}
		}
	}
}

// awaitReady waits until every shared-memory peer's ready word of this
// handle's set says step want is done there: it no longer reads the rows
// this rank is about to write over.
func (h *Handle) awaitReady(want uint64) error {
	d, ll := h.d, h.d.ll
	if ll.peers == nil {
		return nil
	}
	var w decodeWaiter
	s := (want & 1)
	for j := range d.size {
		if j == d.rank || !d.sharedWith[j] {
			continue
		}
		for r := readyOf(ll.peers[j][s].ctl); atomic.LoadUint64(r)>>1 < want; {
			if err := w.idle(h, "release of step's rows", j); err != nil {
				return err
			}
		}
	}
	return nil
}

// isClosed reports whether Close ran.
func (d *Dispatcher) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}
