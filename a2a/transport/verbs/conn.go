package verbs

import (
	"bytes"
	"unsafe"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
	ibv "github.com/a2a-moe/a2a/verbs"
)

const hdrSize = transport.HeaderSize

// conn is one stream to one peer: an RC QP whose sends are RDMA WRITEs WITH
// IMM into the peer's receive ring for this (rank, stream), and whose
// receives are the peer's writes into this rank's ring.
//
// A frame (header and payload) travels as chunks of up to ChunkBytes, one
// ring slot each, the header at the start of the first; a slot never holds
// parts of two frames. The sender may have RingSlots chunks unconsumed in
// the ring (its credits); the receiver returns consumed slots in the
// immediate of its own writes on the stream, or, when it has nothing to
// send, in an empty write once half the ring is free. A peer one operation
// ahead simply fills the ring, where its chunks wait for the receive.
//
// Send modes by frame: one of at most the QP's inline size is copied into
// the work request; a payload of at least Transport.zcopy bytes in an
// AllocBuffer mapping is read by the device where it is (zero-copy: the op
// is done only when its writes completed); anything else goes through
// bounce buffers (done once posted).
//
// Every field is guarded by Transport.mu.
type conn struct {
	t            *Transport
	idx          int // peer*streams+stream
	peer, stream int
	qp           *ibv.QP
	raddr        uint64 // this stream's ring in the peer's memory
	rkey         uint32
	ctl          []byte // this stream's control area (zero-copy header, hello)
	ctlAddr      uint64
	closedEr     error
	lost         error // the peer or the QP is gone, or a hello failed: every op fails with it
	gone         bool  // the peer said goodbye or the QP failed: nothing more leaves
	sge          [2]ibv.SGE
	inl          [maxInline]byte // an inline frame is assembled here

	// send side
	sendSide transport.SendSide
	sseq     uint64 // chunks written into the peer's ring
	returned uint64 // ring slots the peer gave back
	sqOut    int    // send work requests not completed
	zmr      *ibv.MR
	zpend    int // zero-copy writes of the current op not completed
	zcopy    bool
	inline   bool

	// receive side
	recvSide transport.RecvSide
	ring     []byte
	rlen     []int  // bytes in each ring slot
	rin      uint64 // chunks arrived
	rhead    uint64 // chunks consumed
	rfree    int    // consumed slots not returned yet
	rdst     []byte // payload destination of the frame being received
	rposted  int    // receives posted
	repost   int    // receives consumed, to post again

	remote              ibv.Addr // the peer's QP
	helloWant           []byte
	helloSent, helloGot bool
	helloAgain          bool // the hello timed out: reconnect and send it again
}

func (c *conn) slots() int { return len(c.rlen) }

func (c *conn) chunk() int { return c.t.geo.ChunkBytes }

// sqFull says the send queue has no room but the one kept for the goodbye.
func (c *conn) sqFull() bool { return c.sqOut >= sqDepth(c.slots())-1 }

func (c *conn) fail(err error) {
	if c.lost == nil {
		c.lost = err
	}
}

// post posts one send work request.
func (c *conn) post(wr ibv.SendWR, sges []ibv.SGE) error {
	if err := c.qp.PostSend(wr, sges); err != nil {
		err = fault.Wrap(fault.ErrPeerLost, c.peer, err, "verbs: posting on stream %d to rank %d", c.stream, c.peer)
		c.fail(err)
		return err
	}
	c.sqOut++
	return nil
}

// takeCredits returns the consumed slots the next write hands back.
func (c *conn) takeCredits() uint32 {
	n := min(c.rfree, immCredits)
	c.rfree -= n
	return uint32(n)
}

// TrySend posts as much of op as the credits, the send queue and the
// bounce pool allow. A peer that is gone fails with fault.ErrPeerLost.
func (c *conn) TrySend(op *transport.SendOp) (bool, error) {
	t := c.t
	if err := t.guard.Enter(c.closedEr); err != nil {
		return false, err
	}
	defer t.guard.Release()
	t.mu.Lock()
	defer t.mu.Unlock()
	fresh, ok, err := c.sendSide.Claim(op, c.peer, "verbs")
	if !ok {
		return false, err
	}
	if fresh {
		c.inline = hdrSize+len(op.Data) <= t.dev.inline
		c.zmr, c.zcopy = nil, false
		if !c.inline && t.zcopy > 0 && len(op.Data) >= t.zcopy {
			c.zmr = t.lookupMR(op.Data)
			c.zcopy = c.zmr != nil
		}
	}
	done, err := c.send(op)
	if c.sendSide.Finish(done, err) {
		c.zmr = nil
	}
	return done, err
}

func (c *conn) send(op *transport.SendOp) (bool, error) {
	t := c.t
	total := hdrSize + len(op.Data)
	polled := false
	for op.Progress < total {
		if c.lost != nil {
			return false, c.lost
		}
		blocked := c.sseq-c.returned >= uint64(c.slots()) || c.sqFull() || (!c.inline && !c.zcopy && len(t.pool.free) == 0)
		if blocked {
			if polled {
				return false, nil
			}
			if err := t.poll(); err != nil {
				return false, err
			}
			polled = true
			continue
		}
		if err := c.postChunk(op, total); err != nil {
			return false, err
		}
	}
	if c.zpend > 0 {
		// Zero-copy: the caller may reuse the buffer only once the device
		// has read it.
		if err := t.poll(); err != nil {
			return false, err
		}
		if c.zpend > 0 {
			return false, c.lost
		}
	}
	return true, nil
}

// postChunk writes the next chunk of op into the peer's ring.
func (c *conn) postChunk(op *transport.SendOp, total int) error {
	t := c.t
	n := min(c.chunk(), total-op.Progress)
	wr := ibv.SendWR{Op: ibv.OpRDMAWriteWithImm, Flags: ibv.SendSignaled,
		RemoteAddr: c.raddr + (c.sseq%uint64(c.slots()))*uint64(c.chunk()), RKey: c.rkey}
	var sges []ibv.SGE
	switch {
	case c.inline:
		copy(c.inl[copy(c.inl[:], op.Wire[:]):], op.Data)
		c.sge[0] = ibv.SGE{Addr: uint64(uintptr(unsafe.Pointer(&c.inl[0]))), Length: uint32(total), LKey: t.dev.ctl.mr.LKey()}
		wr.ID, wr.Flags = wrID(c.idx, wrInline, 0), wr.Flags|ibv.SendInline
		sges = c.sge[:1]
	case c.zcopy:
		k := 0
		off := op.Progress - hdrSize
		if op.Progress == 0 {
			copy(c.ctl[ctlHeader:], op.Wire[:])
			c.sge[0] = ibv.SGE{Addr: c.ctlAddr + ctlHeader, Length: hdrSize, LKey: t.dev.ctl.mr.LKey()}
			k, off = 1, 0
		}
		if m := n - hdrSize*k; m > 0 {
			c.sge[k] = ibv.SGE{Addr: uint64(uintptr(unsafe.Pointer(&op.Data[off]))), Length: uint32(m), LKey: c.zmr.LKey()}
			k++
		}
		wr.ID = wrID(c.idx, wrZCopy, 0)
		sges = c.sge[:k]
	default:
		i, buf := t.pool.get()
		fill(buf[:n], op, op.Progress)
		c.sge[0] = t.pool.sge(i, n)
		wr.ID = wrID(c.idx, wrBounce, i)
		sges = c.sge[:1]
	}
	wr.Imm = c.takeCredits()
	if err := c.post(wr, sges); err != nil {
		if _, kind, i := splitWR(wr.ID); kind == wrBounce {
			t.pool.put(i) // not posted: no completion will return it
		}
		return err
	}
	if c.zcopy {
		c.zpend++
	}
	c.sseq++
	op.Progress += n
	t.sent[c.peer].Add(uint64(n))
	return nil
}

// fill copies the frame's bytes [from, from+len(dst)) (header, then
// payload) into dst.
func fill(dst []byte, op *transport.SendOp, from int) {
	if from < hdrSize {
		k := copy(dst, op.Wire[from:])
		copy(dst[k:], op.Data)
		return
	}
	copy(dst, op.Data[from-hdrSize:])
}

// TryRecv takes the chunks in the ring into op: the first one's header
// decides where the payload goes (op.Land). A header differing from
// op.Want, or chunks longer than the header says, fail with
// fault.ErrMismatch; the stream is then unusable. A peer that is gone fails
// with fault.ErrPeerLost once the chunks it wrote before are taken.
func (c *conn) TryRecv(op *transport.RecvOp) (bool, error) {
	t := c.t
	if err := t.guard.Enter(c.closedEr); err != nil {
		return false, err
	}
	defer t.guard.Release()
	t.mu.Lock()
	defer t.mu.Unlock()
	fresh, ok, err := c.recvSide.Claim(op, c.peer, "verbs")
	if !ok {
		return false, err
	}
	if fresh {
		c.rdst = nil
	}
	done, err := c.recv(op)
	if c.recvSide.Finish(done, err) {
		c.rdst = nil
	}
	return done, err
}

func (c *conn) recv(op *transport.RecvOp) (bool, error) {
	t := c.t
	polled := false
	for {
		if c.rin == c.rhead {
			if !polled {
				if err := t.poll(); err != nil {
					return false, err
				}
				polled = true
				continue
			}
			return false, c.lost
		}
		slot := int(c.rhead % uint64(c.slots()))
		b := c.ring[slot*c.chunk() : slot*c.chunk()+c.rlen[slot]]
		if op.Progress == 0 {
			if len(b) < hdrSize {
				return false, fault.New(fault.ErrMismatch, c.peer, "verbs: stream %d from rank %d: a message (frame) starts with a %d-byte chunk", c.stream, c.peer, len(b))
			}
			copy(op.Wire[:], b[:hdrSize])
			if err := op.Got.Decode(op.Wire[:]); err != nil {
				return false, fault.Wrap(fault.ErrMismatch, c.peer, err, "verbs: stream %d from rank %d", c.stream, c.peer)
			}
			dst, err := op.Land(c.peer)
			if err != nil {
				return false, err
			}
			c.rdst = dst
			b = b[hdrSize:]
			op.Progress = hdrSize
			t.recvd[c.peer].Add(hdrSize)
		}
		got := op.Progress - hdrSize
		if len(b) > len(c.rdst)-got {
			return false, fault.New(fault.ErrMismatch, c.peer, "verbs: stream %d from rank %d: %d more bytes than its header announced", c.stream, c.peer, len(b)-(len(c.rdst)-got))
		}
		copy(c.rdst[got:], b)
		op.Progress += len(b)
		t.recvd[c.peer].Add(uint64(len(b)))
		c.consume()
		if got+len(b) == len(c.rdst) {
			op.N = len(c.rdst)
			return true, nil
		}
	}
}

// consume frees the head slot and returns half a ring's worth of slots in
// an empty write when that much is due.
func (c *conn) consume() {
	c.rhead++
	c.rfree++
	if c.rfree >= max(1, c.slots()/2) && !c.sqFull() && c.lost == nil {
		c.post(ibv.SendWR{ID: wrID(c.idx, wrCredit, 0), Op: ibv.OpRDMAWriteWithImm, Flags: ibv.SendSignaled,
			Imm: c.takeCredits(), RemoteAddr: c.raddr, RKey: c.rkey}, nil)
	}
}

// sendHello writes this rank's hello into ring slot 0.
func (c *conn) sendHello() error {
	t := c.t
	c.sge[0] = ibv.SGE{Addr: c.ctlAddr + ctlHello, Length: uint32(len(c.helloWant)), LKey: t.dev.ctl.mr.LKey()}
	err := c.post(ibv.SendWR{ID: wrID(c.idx, wrHello, 0), Op: ibv.OpRDMAWriteWithImm, Flags: ibv.SendSignaled,
		Imm: immHello, RemoteAddr: c.raddr, RKey: c.rkey}, c.sge[:1])
	c.sseq = 1 // the hello takes ring slot 0
	return err
}

// reconnect takes the QP through RESET back to RTS, reposts every receive
// and sends the hello again (see Transport.hello). A hello can time out
// with the peer up: its first RTR may wait for address resolution (ARP)
// for longer than the retries last, and its hello may have come in since.
func (c *conn) reconnect() error {
	t := c.t
	c.helloAgain = false
	t.log.Info("verbs: hello timed out, reconnecting", "peer", c.peer, "stream", c.stream)
	err := c.qp.Reset()
	if err == nil {
		err = c.qp.Init(t.dev.ep, connectOptions)
	}
	if err == nil {
		n := rqDepth(c.slots())
		ids, sges := t.recvIDs[:n], t.recvSGEs[:n]
		for i := range ids {
			ids[i], sges[i] = wrID(c.idx, wrRecv, 0), t.dev.rings.mr.SGE(0, 0)
		}
		err = c.qp.PostRecvs(ids, sges)
		c.rposted, c.repost = n, 0
	}
	if err == nil {
		// The peer sends nothing but its hello (one packet) before it has
		// this rank's: if that came in, the QP expects the next PSN, and a
		// retry of the hello is a duplicate it acknowledges.
		remote := c.remote
		if c.helloGot {
			remote.PSN = (remote.PSN + 1) & 0xffffff
		}
		err = c.qp.Connect(t.dev.ep, t.dev.psn, remote, connectOptions)
	}
	if err == nil {
		err = c.sendHello()
	}
	if err != nil {
		return fault.Wrap(fault.ErrPeerLost, c.peer, err, "verbs: reconnecting stream %d to rank %d", c.stream, c.peer)
	}
	return nil
}

// gotHello checks the hello that arrived in ring slot 0.
func (c *conn) gotHello(n int) {
	if c.rin != 0 || n != len(c.helloWant) || !bytes.Equal(c.ring[:n], c.helloWant) {
		c.fail(fault.New(fault.ErrMismatch, c.peer, "verbs: the hello on stream %d from rank %d does not carry this job's MAC for this pair and epoch", c.stream, c.peer))
		return
	}
	c.helloGot = true
	c.rin, c.rhead = 1, 1
	c.rfree++
}

// repostRecvs posts the consumed receives again.
func (c *conn) repostRecvs() {
	t := c.t
	if t.closing || c.lost != nil {
		return
	}
	n := c.repost
	ids, sges := t.recvIDs[:n], t.recvSGEs[:n]
	for i := range ids {
		ids[i] = wrID(c.idx, wrRecv, 0)
		sges[i] = t.dev.rings.mr.SGE(0, 0)
	}
	if err := c.qp.PostRecvs(ids, sges); err != nil {
		c.fail(fault.Wrap(fault.ErrPeerLost, c.peer, err, "verbs: posting receives on stream %d to rank %d", c.stream, c.peer))
		return
	}
	c.rposted += n
	c.repost = 0
}
