package a2a

import (
	"context"
	"time"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// Send sends buf to peer with tag and returns when buf may be reused. The
// peer receives it with Recv(ctx, buf, thisRank, tag). Messages between two
// ranks arrive in order, and they share the ordered streams of the
// collectives: the two ranks must issue their point-to-point calls and their
// collectives in the same relative order (as NCCL orders operations on one
// communicator); a receive that meets another message or tag fails with
// ErrMismatch.
func (c *Comm) Send(ctx context.Context, buf []byte, peer, tag int) error {
	_, err := c.p2p(ctx, true, buf, peer, tag)
	return err
}

// Recv receives the next message from peer, which must carry tag and fit in
// buf, and returns its length.
func (c *Comm) Recv(ctx context.Context, buf []byte, peer, tag int) (int, error) {
	return c.p2p(ctx, false, buf, peer, tag)
}

func (c *Comm) p2p(ctx context.Context, send bool, buf []byte, peer, tag int) (int, error) {
	start := c.clock()
	name := "recv"
	if send {
		name = "send"
	}
	c.mu.Lock()
	if err := c.stopped(); err != nil {
		c.mu.Unlock()
		c.observeRejected(name, start, err)
		return 0, err
	}
	var n int
	err := ctx.Err()
	switch {
	case err != nil:
		err = ctxError(err)
	case peer < 0 || peer >= c.size || peer == c.rank:
		err = fault.New(fault.ErrInvalidArgument, c.rank, "%s: peer %d (world %d, self %d)", name, peer, c.size, c.rank)
	case tag < 0 || tag > 1<<31-1:
		err = fault.New(fault.ErrInvalidArgument, c.rank, "%s: tag %d outside [0, 2^31)", name, tag)
	default:
		c.startOp(ctx, start)
		seqs := c.recvSeq
		if send {
			seqs = c.sendSeq
		}
		seqs[peer]++
		n, err = c.eng.p2p(ctx, send, peer, tag, seqs[peer], buf)
	}
	if err != nil {
		err = c.fail(err)
	}
	if o := c.observer; o != nil { // under the lock: the engine's figures are this call's
		ev := OpEvent{Op: name, Algo: "direct", Rank: c.rank, Size: c.size, Duration: time.Since(start), Err: err,
			LastPeer: c.eng.lastPeer, LastWait: c.eng.lastWait}
		c.eng.traffic.fill(&ev)
		o.OpDone(ev)
	}
	c.tallyOp(name, algo.AlgoDirect, err)
	c.mu.Unlock()
	return n, err
}
