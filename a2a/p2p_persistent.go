package a2a

import (
	"context"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// SendInit makes a persistent send to peer with tag (MPI_Send_init): a
// Request that Start posts again and again, allocating nothing, for a
// loop that sends to the same peer every step. It is not posted: Wait and
// Test fail with ErrInvalidArgument until the first Start.
func (c *Comm) SendInit(peer, tag int) *Request {
	return &Request{c: c, send: true, peer: peer, tag: tag, persistent: true}
}

// RecvInit makes a persistent receive from peer with tag (MPI_Recv_init);
// see SendInit.
func (c *Comm) RecvInit(peer, tag int) *Request {
	return &Request{c: c, peer: peer, tag: tag, persistent: true}
}

// Start posts a persistent request (SendInit, RecvInit) once more, with buf:
// the message to send, or the room to receive into. Unlike MPI's, the
// buffer is given at each Start, so a step may send another length from
// another place. ctx bounds this use as it bounds an Isend. The previous
// use must be done (its Wait or Test reported it): Start fails with
// ErrInvalidArgument otherwise, and for a request that is not persistent,
// and posts nothing then. Other errors, argument errors included, come from
// Wait or Test, as for Isend.
func (r *Request) Start(ctx context.Context, buf []byte) error {
	switch {
	case !r.persistent:
		return fault.New(fault.ErrInvalidArgument, r.c.rank, "%s: Start on a request that is not persistent (SendInit, RecvInit)", r.name())
	case r.posted && !r.done.Load():
		return fault.New(fault.ErrInvalidArgument, r.c.rank, "%s: Start while the previous use to rank %d is in flight", r.name(), r.peer)
	}
	// done: the driver has dropped the request from its list, so its
	// fields are this goroutine's again (as a pooled request's are).
	r.ctx, r.order, r.ticket, r.waited = ctx, 0, 0, false
	r.deadline, r.ownDeadline = time.Time{}, false
	if dl, ok := ctx.Deadline(); ok {
		r.deadline = dl
	}
	r.over, r.err, r.n, r.claimed, r.posted = false, nil, 0, false, false
	r.done.Store(false)
	if c := r.c; c.observer != nil || c.rep != nil {
		r.start = time.Now()
	}
	if r.send {
		r.sop.Data = buf
	} else {
		r.rop.Dst = buf
	}
	r.c.post(r)
	return nil
}
