package control

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// waiter receives the column of one in-flight seq when another call's
// goroutine happened to read it from the shared counts channel. Its timer
// paces the re-sending of the row.
type waiter struct {
	ch    chan *nats.Msg
	retry *time.Timer
}

var waiterPool = sync.Pool{New: func() any {
	w := &waiter{ch: make(chan *nats.Msg, 1), retry: time.NewTimer(time.Hour)}
	w.retry.Stop()
	return w
}}

// Core NATS delivers at most once: a row or a column in flight through a
// cluster node that dies (or published while a subscriber's reconnect has
// not reached the other nodes yet) is lost, and nothing re-sends it. So a
// waiting rank re-sends its row, identical but signed anew, at once when its
// own connection comes back and otherwise after growing pauses (the
// heartbeat interval, doubling up to four of them) until its column
// arrives. The coordinator takes a row again idempotently (a pending seq
// keeps one row per rank) and answers a row of a seq it already completed
// with that rank's column again (it keeps the last completed ones), so a
// lost column is recovered too; a column that comes twice is dropped by
// the receiver, whose waiter is gone.
const retryBackoffMax = 4

// ExchangeCounts exchanges the counts of one AllToAllV: sendCounts[j] is the
// number of bytes this rank sends rank j; on return recvCounts[i] is the number
// rank i sends this rank, and, if matrix is not nil (len Size*Size),
// matrix[i*Size+j] is the number rank i sends rank j. Every rank passes the same
// seq for the same operation; calls with different seqs may run concurrently on
// one member. It returns the abort cause if the member aborts at or before
// seq (AbortAt), an error matching fault.ErrPeerLost naming a rank that left
// before taking part (LeaveAt), at once whether it left before or during the
// call, and an error matching fault.ErrTimeout (and ctx.Err()) if ctx ends
// first.
func (m *Member) ExchangeCounts(ctx context.Context, seq uint64, sendCounts, recvCounts, matrix []int) error {
	if err := m.checkCounts(sendCounts, recvCounts, matrix); err != nil {
		return err
	}
	changed := m.Changed()
	if err := m.FailedAt(seq); err != nil {
		return err
	}
	if m.size == 1 {
		recvCounts[0] = sendCounts[0]
		if matrix != nil {
			matrix[0] = sendCounts[0]
		}
		return nil
	}
	w, err := m.addWaiter(seq)
	if err != nil {
		return err
	}
	defer m.dropWaiter(seq, w)

	c := getCodec()
	defer putCodec(c)
	var flags uint8
	if matrix != nil {
		flags |= rowWantMatrix
	}
	row := c.encodeRow(m.epoch, seq, m.rank, flags, sendCounts)
	if err := m.publish(m.subj.counts, m.subs.countsInbox, m.epoch, row); err != nil {
		return fault.Wrap(fault.ErrAborted, m.rank, err, "control: sending counts row")
	}
	pause := m.cfg.HeartbeatInterval
	w.retry.Reset(pause)
	defer w.retry.Stop()
	reconnected := m.reconnects()
	for {
		select {
		case msg := <-m.subs.countsCh:
			if m.route(msg, seq) {
				return m.finish(payloadOf(msg.Data), seq, recvCounts, matrix)
			}
		case msg := <-w.ch:
			return m.finish(payloadOf(msg.Data), seq, recvCounts, matrix)
		case <-reconnected:
			reconnected = m.reconnects()
			pause = m.cfg.HeartbeatInterval
			m.resendRow(seq, row, pause, w)
		case <-w.retry.C:
			pause = min(2*pause, retryBackoffMax*m.cfg.HeartbeatInterval)
			m.resendRow(seq, row, pause, w)
		case <-changed:
			// An abort of later operations or a peer that left after its
			// part in this one lets the exchange go on.
			changed = m.Changed()
			if err := m.FailedAt(seq); err != nil {
				return err
			}
		case <-ctx.Done():
			// This rank cannot tell which ranks have not called: only the
			// coordinator holds the rows.
			return fault.Wrap(fault.ErrTimeout, -1, ctx.Err(), "ExchangeCounts (op #%d) did not complete: the coordinator still lacks some rank's counts: "+
				"check that every rank calls ExchangeCounts, in the same order; if some are only slow, give the call a longer deadline", seq)
		}
	}
}

// checkCounts checks the arguments of ExchangeCounts.
func (m *Member) checkCounts(sendCounts, recvCounts, matrix []int) error {
	n := m.size
	switch {
	case len(sendCounts) != n || len(recvCounts) != n:
		return fault.New(fault.ErrInvalidArgument, m.rank, "control: counts of length %d/%d for %d ranks",
			len(sendCounts), len(recvCounts), n)
	case matrix != nil && len(matrix) != n*n:
		return fault.New(fault.ErrInvalidArgument, m.rank, "control: matrix of length %d for %d ranks", len(matrix), n)
	case matrix != nil && int64(n*n*8+128) > m.nc.MaxPayload():
		return fault.New(fault.ErrInvalidArgument, m.rank, "control: a %dx%d counts matrix exceeds the NATS max payload %d",
			n, n, m.nc.MaxPayload())
	}
	for j, c := range sendCounts {
		if c < 0 {
			return fault.New(fault.ErrInvalidArgument, m.rank, "control: negative count %d for rank %d", c, j)
		}
	}
	return nil
}

// addWaiter registers the call waiting for the column of seq, so that
// another call that reads it from the shared counts channel hands it over.
func (m *Member) addWaiter(seq uint64) (*waiter, error) {
	w := waiterPool.Get().(*waiter)
	m.counts.mu.Lock()
	if _, dup := m.counts.waiters[seq]; dup {
		m.counts.mu.Unlock()
		waiterPool.Put(w)
		return nil, fault.New(fault.ErrInvalidArgument, m.rank, "control: counts exchange seq %d already in flight", seq)
	}
	m.counts.waiters[seq] = w
	m.counts.mu.Unlock()
	return w, nil
}

// dropWaiter unregisters the call waiting for seq and recycles its waiter.
func (m *Member) dropWaiter(seq uint64, w *waiter) {
	m.counts.mu.Lock()
	delete(m.counts.waiters, seq)
	m.counts.mu.Unlock()
	select { // a column routed to us after we stopped waiting
	case <-w.ch:
	default:
	}
	waiterPool.Put(w)
}

// resendRow publishes row again (signed anew: a receiver takes a sequence
// number once) and arms the next retry after pause. A failure to publish is
// not the call's: a closed connection aborts the member, whose Done ends
// the wait.
func (m *Member) resendRow(seq uint64, row []byte, pause time.Duration, w *waiter) {
	if err := m.publish(m.subj.counts, m.subs.countsInbox, m.epoch, row); err != nil {
		m.log.Debug("re-sending counts row", "seq", seq, "err", err)
	}
	m.counts.resends.Add(1)
	w.retry.Reset(pause)
}

// CountsResends returns how many counts rows this member sent again because
// their column had not come (see the package documentation).
func (m *Member) CountsResends() uint64 { return m.counts.resends.Load() }

// route reports whether msg is the column for seq; otherwise it hands msg to
// the call waiting for its seq, or drops it (a stale reply of an abandoned
// call). Only authentic replies of this formation count: a column from the
// coordinator that formed it, or a refusal from any coordinator (one that
// does not know the formation, say after a restart); everything else is
// rejected and the caller keeps waiting for the real reply.
func (m *Member) route(msg *nats.Msg, seq uint64) bool {
	env, p, ok := m.open(msg)
	if !ok {
		return false
	}
	c := getCodec()
	s, kind, err := c.peekSeq(p)
	putCodec(c)
	switch {
	case err != nil:
		m.reject(RejectMalformed, msg.Subject)
		return false
	case env.epoch != m.epoch:
		m.reject(RejectEpoch, msg.Subject)
		return false
	case kind == 0 && env.sender != m.roster.coordinator:
		m.reject(RejectSender, msg.Subject)
		return false
	}
	if s == seq {
		return true
	}
	m.counts.mu.Lock()
	if w := m.counts.waiters[s]; w != nil {
		select {
		case w.ch <- msg:
		default:
		}
	}
	m.counts.mu.Unlock()
	return false
}

// payloadOf is the payload of an envelope route already opened.
func payloadOf(data []byte) []byte { return data[hdrLen : len(data)-macLen] }

func (m *Member) finish(payload []byte, seq uint64, recvCounts, matrix []int) error {
	c := getCodec()
	defer putCodec(c)
	r, err := c.decodeCol(payload)
	if err != nil {
		return fault.Wrap(fault.ErrMismatch, m.rank, err, "control: malformed counts reply for seq %d", seq)
	}
	if r.kind != 0 {
		return &fault.Error{Kind: kindOfCode(r.kind), Rank: r.rank,
			Detail: fmt.Sprintf("control: counts exchange seq %d refused by the coordinator: %s", seq, r.detail)}
	}
	n := m.size
	if len(r.col) != n*8 || (matrix != nil && len(r.mat) != n*n*8) {
		return fault.New(fault.ErrMismatch, m.rank, "control: counts reply for seq %d has %d/%d bytes for %d ranks",
			seq, len(r.col), len(r.mat), n)
	}
	getInts(recvCounts, r.col)
	if matrix != nil {
		getInts(matrix, r.mat)
	}
	return nil
}
