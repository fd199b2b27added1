package engine

import (
	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// opID is what every frame of an operation carries: its kind, sequence
// number and algorithm.
type opID struct {
	kind transport.OpKind
	seq  uint64
	algo algo.Algo
}

// round is the state of the round being run: its transport operations, the
// frames among them still in flight, and its local copies.
type round struct {
	sendOps      []transport.SendOp
	recvOps      []transport.RecvOp
	nSend, nRecv int // sendOps[:nSend] and recvOps[:nRecv] belong to this round
	active       []activeOp
	copies       []localCopy // done while the network is idle
	copied       int         // copies[:copied] are done
}

// localCopy is a copy or reduce step still to do; it shrinks as chunks are done.
type localCopy struct {
	dst, src []byte
	reduce   bool
	with     []byte // a three-operand reduce: dst = with op src
	// A copy from or to a gathered buffer: the slices, the cursors and the
	// bytes left (vec.go).
	sv, dv [][]byte
	sc, dc transport.VecCursor
	left   int
}

// activeOp is a frame of the round in flight: sendOps[idx] or recvOps[idx].
type activeOp struct {
	send        bool
	into        []byte // RecvReduce: reduce the landed frame into this span
	with        []byte // three-operand RecvReduce: into = with op landed (landed op with if landedFirst)
	landedFirst bool
	scatter     [][]byte // copy the landed staging here once the frame is in (vec.go)
	done        bool
	peer        int
	stream      int
	idx         int
	conn        transport.Conn

	// An LL message that travels as a frame (recvOps[idx]): announce is
	// set when it is the announcement of a count-byte block, landing in dst.
	dst      []byte
	announce bool
	count    int
	// watchLL: until the frame begins to arrive, the peer's slot is watched
	// for an LL message it should not have stored (algo.Step.WatchLL).
	watchLL bool
}

// post turns the steps of one round into transport operations; local copies
// are queued for the gaps of the transfers.
func (e *Engine) post(id opID, steps []algo.Step, bufs *Buffers) error {
	rd := &e.round
	rd.active, rd.nSend, rd.nRecv = rd.active[:0], 0, 0
	rd.copies, rd.copied = rd.copies[:0], 0
	e.ll.loads, e.ll.left = e.ll.loads[:0], 0
	e.vec.vecs, e.vec.stage = e.vec.vecs[:0], e.vec.stage[:0]
	storesLast := false
	for i := range steps {
		st := &steps[i]
		var err error
		switch st.Kind {
		case algo.StepCopy:
			err = e.postCopy(st, bufs)
		case algo.StepReduce:
			err = e.postReduce(st, bufs)
		case algo.StepSend:
			err = e.postSend(id, st, bufs)
		case algo.StepRecv, algo.StepRecvReduce:
			err = e.postRecv(id, st, bufs)
		case algo.StepStore:
			var later bool
			later, err = e.postStore(id, st, bufs)
			storesLast = storesLast || later
		case algo.StepLoad:
			err = e.postLoad(id, st, bufs)
		default:
			err = fault.New(fault.ErrInvalidArgument, -1, "schedule step kind %s not supported by the engine", st.Kind)
		}
		if err != nil {
			return err
		}
	}
	if storesLast {
		return e.postDeferredStores(id, steps, bufs)
	}
	return nil
}

// postCopy queues a copy step.
func (e *Engine) postCopy(st *algo.Step, bufs *Buffers) error {
	if e.vectored(st.Src.Buf) || e.vectored(st.Dst.Buf) {
		c, err := e.localCopyOf(st, bufs)
		if err != nil {
			return err
		}
		e.round.copies = append(e.round.copies, c)
		return nil
	}
	src, dst, err := bufs.srcDst(st)
	if err != nil {
		return err
	}
	if len(dst) > 0 && &dst[0] != &src[0] { // in-place collectives copy a buffer onto itself
		e.addCopy(dst, src, false)
	}
	return nil
}

// postReduce queues a local reduction step.
func (e *Engine) postReduce(st *algo.Step, bufs *Buffers) error {
	src, dst, err := bufs.srcDst(st)
	if err != nil {
		return err
	}
	if len(dst) != len(src) {
		return fault.New(fault.ErrInvalidArgument, -1, "schedule reduces %d bytes into %d", len(src), len(dst))
	}
	e.addCopy(dst, src, true)
	if st.With.Len > 0 {
		rd := &e.round
		with, err := bufs.span(st.With)
		if err != nil {
			return err
		}
		if len(with) != len(dst) {
			return fault.New(fault.ErrInvalidArgument, -1, "schedule combines %d bytes with %d", len(dst), len(with))
		}
		rd.copies[len(rd.copies)-1].with = with
	}
	return nil
}

// frameHeader checks a frame step's peer and stream and makes its header.
func (e *Engine) frameHeader(id opID, st *algo.Step) (transport.Header, error) {
	if st.Peer < 0 || st.Peer >= e.size || st.Peer == e.rank || st.Stream < 0 || st.Stream >= e.streams {
		return transport.Header{}, fault.New(fault.ErrInvalidArgument, st.Peer, "schedule step %s to peer %d stream %d", st.Kind, st.Peer, st.Stream)
	}
	h := transport.Header{Kind: id.kind, Algo: uint8(id.algo), Stream: uint16(st.Stream), Epoch: e.epoch, Seq: id.seq, Aux: e.aux}
	if st.Last {
		h.Flags = transport.FlagLast
	}
	send := st.Kind == algo.StepSend
	h.Src = uint32(st.Peer)
	if send {
		h.Src = uint32(e.rank)
	}
	h.Round = e.frames.next(send, st.Peer*e.streams+st.Stream)
	return h, nil
}

// nextSendOp is the round's next free send operation.
func (rd *round) nextSendOp() (*transport.SendOp, int) {
	if rd.nSend == len(rd.sendOps) {
		rd.sendOps = append(rd.sendOps, transport.SendOp{})
	}
	rd.nSend++
	return &rd.sendOps[rd.nSend-1], rd.nSend - 1
}

// nextRecvOp is the round's next free receive operation.
func (rd *round) nextRecvOp() (*transport.RecvOp, int) {
	if rd.nRecv == len(rd.recvOps) {
		rd.recvOps = append(rd.recvOps, transport.RecvOp{})
	}
	rd.nRecv++
	return &rd.recvOps[rd.nRecv-1], rd.nRecv - 1
}

// postSend posts a frame to a peer.
func (e *Engine) postSend(id opID, st *algo.Step, bufs *Buffers) error {
	h, err := e.frameHeader(id, st)
	if err != nil {
		return err
	}
	conn := e.conns.Conn(st.Peer, st.Stream)
	op, idx := e.round.nextSendOp()
	n, err := e.resetSend(op, h, bufs, st.Src, conn)
	if err != nil {
		return err
	}
	e.op.traffic.Add(true, e.op.sameHost[st.Peer], n)
	e.round.active = append(e.round.active, activeOp{send: true, peer: st.Peer, stream: st.Stream, idx: idx, conn: conn})
	return nil
}

// postRecv posts the receipt of a frame: into a span, scattered over a
// virtual buffer's slices, or (RecvReduce) into scratch to be reduced into
// its destination as it lands.
func (e *Engine) postRecv(id opID, st *algo.Step, bufs *Buffers) error {
	h, err := e.frameHeader(id, st)
	if err != nil {
		return err
	}
	conn := e.conns.Conn(st.Peer, st.Stream)
	a := activeOp{peer: st.Peer, stream: st.Stream, conn: conn, watchLL: st.WatchLL && e.ll.watchOf[st.Peer] != nil}
	op, idx := e.round.nextRecvOp()
	a.idx = idx
	var n int
	if st.Kind == algo.StepRecv && e.vectored(st.Dst.Buf) {
		n, a.scatter, err = e.resetRecv(op, h, bufs, st.Dst, conn)
	} else {
		n, err = e.resetRecvReduce(op, h, bufs, st, &a)
	}
	if err != nil {
		return err
	}
	e.op.traffic.Add(false, e.op.sameHost[st.Peer], n)
	e.round.active = append(e.round.active, a)
	return nil
}

// resetRecvReduce prepares op to land a frame in one span: the step's
// destination, or for RecvReduce its source (scratch), with the spans the
// landed frame is reduced into and with set on a.
func (e *Engine) resetRecvReduce(op *transport.RecvOp, h transport.Header, bufs *Buffers, st *algo.Step, a *activeOp) (int, error) {
	landing := st.Dst
	if st.Kind == algo.StepRecvReduce {
		landing = st.Src
	}
	dst, err := bufs.span(landing)
	if err != nil {
		return 0, err
	}
	op.Reset(h, dst, false)
	if st.Kind == algo.StepRecvReduce {
		if a.into, a.with, err = reduceSpans(bufs, st, len(dst)); err != nil {
			return 0, err
		}
		a.landedFirst = st.LandedFirst
		// A transport that reads the frame in place (a peer's registered
		// buffer, mapped) reduces it from there, with no landing copy;
		// a is the round's next active op.
		op.Combine, op.CombineID = e, len(e.round.active)
	}
	return len(dst), nil
}

// reduceSpans resolves the spans a RecvReduce step reduces a landed frame of
// n bytes into (into) and with (with, nil for two operands).
func reduceSpans(bufs *Buffers, st *algo.Step, n int) (into, with []byte, err error) {
	if into, err = bufs.span(st.Dst); err != nil {
		return nil, nil, err
	}
	if len(into) != n {
		return nil, nil, fault.New(fault.ErrInvalidArgument, -1, "schedule reduces a received %d-byte message into %d bytes", n, len(into))
	}
	if st.With.Len == 0 {
		return into, nil, nil
	}
	if with, err = bufs.span(st.With); err != nil {
		return nil, nil, err
	}
	if len(with) != n {
		return nil, nil, fault.New(fault.ErrInvalidArgument, -1, "schedule combines a received %d-byte message with %d bytes", n, len(with))
	}
	return into, with, nil
}

// pushZero extends s by one zeroed element and returns it, to be filled
// field by field: appending a composite literal copies the whole struct,
// gathered-buffer fields included, with write barriers.
func pushZero[T any](s []T) ([]T, *T) {
	n := len(s)
	if n == cap(s) {
		var zero T
		s = append(s, zero)
	} else {
		// An assignment, not clear: clear of one element with pointers
		// calls memclrHasPointers and its bulk write barrier (~10 ns of
		// a persistent 8 B call's ~120).
		s = s[:n+1]
		var zero T
		s[n] = zero
	}
	return s, &s[n]
}

// addCopy adds a plain copy (or reduction) of src into dst to the round.
func (e *Engine) addCopy(dst, src []byte, reduce bool) {
	var c *localCopy
	e.round.copies, c = pushZero(e.round.copies)
	c.dst, c.src, c.reduce = dst, src, reduce
}
