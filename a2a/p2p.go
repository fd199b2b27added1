package a2a

import (
	"context"
)

// Send sends buf to peer with tag and returns when buf may be reused. The
// peer receives it with Recv(ctx, buf, thisRank, tag).
//
// Point-to-point calls may be made from any number of goroutines at once:
// all of a Comm's pending calls progress together, so a Send waiting for its
// peer never holds up a Recv of another goroutine. Messages between two
// ranks match in the order the calls were made (posted, for Isend and
// Irecv), and they share the ordered streams of the collectives: the two
// ranks must issue their point-to-point calls and their collectives in the
// same relative order (as NCCL orders operations on one communicator). A
// collective waits for the point-to-point calls made before it began; calls
// made while it runs start after it. A receive that meets another message or
// tag fails with ErrMismatch.
func (c *Comm) Send(ctx context.Context, buf []byte, peer, tag int) error {
	_, err := c.blocking(ctx, true, buf, peer, tag)
	return err
}

// Recv receives the next message from peer, which must carry tag and fit in
// buf, and returns its length.
func (c *Comm) Recv(ctx context.Context, buf []byte, peer, tag int) (int, error) {
	return c.blocking(ctx, false, buf, peer, tag)
}

func (c *Comm) blocking(ctx context.Context, send bool, buf []byte, peer, tag int) (int, error) {
	r := c.newRequest(ctx, send, buf, peer, tag, true)
	c.post(r)
	// The request carries ctx's deadline; the wait does not end before
	// the request does, so buf is never in flight after the call returns.
	n, err := r.Wait(context.Background())
	if r.done.Load() && (err == nil || !r.claimed) {
		// A failed request that claimed its Conn may still be the
		// direction's owner there: never reuse its memory.
		requestPool.Put(r)
	}
	return n, err
}

// Isend starts sending buf to peer with tag and returns at once; buf must
// not change until the request is done. ctx bounds the request's life: it
// fails with ErrTimeout at ctx's deadline (else Config.Timeout after it
// first waited). Errors, argument errors included, come from Wait or Test.
func (c *Comm) Isend(ctx context.Context, buf []byte, peer, tag int) *Request {
	r := c.newRequest(ctx, true, buf, peer, tag, false)
	c.post(r)
	return r
}

// Irecv starts receiving the next message from peer, which must carry tag
// and fit in buf; Wait returns its length.
func (c *Comm) Irecv(ctx context.Context, buf []byte, peer, tag int) *Request {
	r := c.newRequest(ctx, false, buf, peer, tag, false)
	c.post(r)
	return r
}

// SendRecv sends sendBuf to dest with sendTag and receives the next message
// from src with recvTag into recvBuf, both at once (MPI_Sendrecv), so a
// ring or a pairwise exchange cannot deadlock. It returns the received
// message's length.
func (c *Comm) SendRecv(ctx context.Context, sendBuf []byte, dest, sendTag int, recvBuf []byte, src, recvTag int) (int, error) {
	g := c.NewGroup()
	g.Send(sendBuf, dest, sendTag)
	rr := g.Recv(recvBuf, src, recvTag)
	if err := g.Wait(ctx); err != nil {
		return 0, err
	}
	return rr.n, nil
}

// Group gathers point-to-point calls and posts them as one step, as
// ncclGroupStart/ncclGroupEnd do: they are queued together, with no call of
// another goroutine in between, and progress together. A Group is used by
// one goroutine.
type Group struct {
	c      *Comm
	reqs   []*Request
	posted bool
}

// NewGroup starts an empty Group of c.
func (c *Comm) NewGroup() *Group { return &Group{c: c} }

// Send adds a send of buf to peer with tag. The returned Request is live
// once the Group is posted.
func (g *Group) Send(buf []byte, peer, tag int) *Request {
	r := g.c.newRequest(context.Background(), true, buf, peer, tag, false)
	g.reqs = append(g.reqs, r)
	return r
}

// Recv adds a receive from peer into buf with tag.
func (g *Group) Recv(buf []byte, peer, tag int) *Request {
	r := g.c.newRequest(context.Background(), false, buf, peer, tag, false)
	g.reqs = append(g.reqs, r)
	return r
}

// Post queues every call of the Group as one step and returns at once; ctx
// bounds the calls' life as Isend's does. An argument error in any call
// fails them all before any is queued. Posting twice does nothing.
func (g *Group) Post(ctx context.Context) {
	if g.posted {
		return
	}
	g.posted = true
	for _, r := range g.reqs {
		r.ctx = ctx
		if dl, ok := ctx.Deadline(); ok {
			r.deadline = dl
		}
	}
	g.c.post(g.reqs...)
}

// Wait posts the Group if it is not yet, waits for every call and returns
// the first error.
func (g *Group) Wait(ctx context.Context) error {
	g.Post(ctx)
	return WaitAll(ctx, g.reqs...)
}
