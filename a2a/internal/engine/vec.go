package engine

import (
	"slices"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// GatherMap lays a list of pieces of a real buffer end to end as one virtual
// buffer, so that the planners, which address a send or receive buffer by
// displacements that are prefix sums of the counts, plan a gather-send or a
// scattered receive unchanged: the engine turns each virtual range a step
// addresses into the real slices behind it (SetVirtual).
type GatherMap struct {
	buf    []byte
	pieces []piece // non-empty pieces in virtual order
	start  []int   // virtual offset of pieces[i]
	total  int
}

// piece is n bytes of the real buffer from byte off.
type piece struct{ off, n int }

// Reset empties m for buf, keeping its storage.
func (m *GatherMap) Reset(buf []byte) {
	m.buf, m.pieces, m.start, m.total = buf, m.pieces[:0], m.start[:0], 0
}

// Add appends n bytes of the buffer from off (already checked against it);
// empty pieces are left out.
func (m *GatherMap) Add(off, n int) {
	if n == 0 {
		return
	}
	m.pieces = append(m.pieces, piece{off, n})
	m.start = append(m.start, m.total)
	m.total += n
}

// Release drops the map's reference to the caller's buffer.
func (m *GatherMap) Release() { m.buf = nil }

// slices appends to out the real slices behind virtual bytes [off, off+n).
func (m *GatherMap) slices(out [][]byte, off, n int) ([][]byte, error) {
	if off < 0 || n < 0 || off+n > m.total {
		return out, fault.New(fault.ErrInvalidArgument, -1, "schedule addresses [%d:%d] of %d gathered bytes", off, off+n, m.total)
	}
	if n == 0 {
		return out, nil
	}
	i, found := slices.BinarySearch(m.start, off)
	if !found {
		i-- // start[0] is 0, so off lies in an earlier piece
	}
	for in := off - m.start[i]; n > 0; i, in = i+1, 0 {
		p := m.pieces[i]
		k := min(p.n-in, n)
		out = append(out, m.buf[p.off+in:p.off+in+k])
		n -= k
	}
	return out, nil
}

// vecState is the engine's state for gathered and scattered buffers.
type vecState struct {
	// maps[b], when set, makes buffer b of the running schedule virtual.
	maps [3]*GatherMap
	// slices of the round's vectored steps (ops keep sub-slices of it), and
	// staging for transports that do not move vectors themselves.
	vecs  [][]byte
	stage []byte
}

// SetVirtual makes the send and receive buffers of the next runs virtual
// (nil: real), laid out by the maps.
func (e *Engine) SetVirtual(send, recv *GatherMap) {
	e.vec.maps[algo.BufSend], e.vec.maps[algo.BufRecv] = send, recv
}

// vectored reports whether buf is a gathered or scattered buffer.
func (e *Engine) vectored(b algo.Buf) bool { return int(b) < len(e.vec.maps) && e.vec.maps[b] != nil }

// resolve returns span s of bufs as one slice, or as a list of slices (the
// second result) when its buffer is virtual.
func (e *Engine) resolve(bufs *Buffers, s algo.Span) ([]byte, [][]byte, error) {
	if !e.vectored(s.Buf) {
		b, err := bufs.span(s)
		return b, nil, err
	}
	start := len(e.vec.vecs)
	vs, err := e.vec.maps[s.Buf].slices(e.vec.vecs, s.Off, s.Len)
	e.vec.vecs = vs
	return nil, vs[start:len(vs):len(vs)], err
}

// staging returns n bytes of staging for one op of the current round. Ops of
// a round keep what they were given: a larger buffer replaces the old one for
// later ops only.
func (e *Engine) staging(n int) []byte {
	l := len(e.vec.stage)
	if cap(e.vec.stage)-l < n {
		e.vec.stage = make([]byte, 0, 2*cap(e.vec.stage)+n)
		l = 0
	}
	e.vec.stage = e.vec.stage[:l+n]
	return e.vec.stage[l : l+n : l+n]
}

// vecConn reports whether conn moves vectored payloads itself.
func vecConn(conn transport.Conn) bool {
	v, ok := conn.(transport.VecConn)
	return ok && v.Vectored()
}

// resetSend prepares op to send span src of bufs: Data, or a gather list,
// packed into staging when conn cannot take it. It returns the payload length.
func (e *Engine) resetSend(op *transport.SendOp, h transport.Header, bufs *Buffers, src algo.Span, conn transport.Conn) (int, error) {
	data, vec, err := e.resolve(bufs, src)
	if err != nil {
		return 0, err
	}
	switch {
	case vec == nil:
		op.Reset(h, data)
	case vecConn(conn):
		op.ResetVec(h, vec)
	default:
		var c transport.VecCursor
		data = e.staging(src.Len)
		c.Gather(vec, data)
		op.Reset(h, data)
	}
	return int(op.Hdr.Len), nil
}

// resetRecv prepares op to receive span dst of bufs: into Dst, or scattered,
// through staging when conn cannot do that; scatter is then the list to copy
// the staging into once the message is in.
func (e *Engine) resetRecv(op *transport.RecvOp, h transport.Header, bufs *Buffers, dst algo.Span, conn transport.Conn) (n int, scatter [][]byte, err error) {
	data, vec, err := e.resolve(bufs, dst)
	if err != nil {
		return 0, nil, err
	}
	switch {
	case vec == nil:
		op.Reset(h, data, false)
	case vecConn(conn):
		op.ResetVec(h, vec)
	default:
		op.Reset(h, e.staging(dst.Len), false)
		scatter = vec
	}
	return int(op.Want.Len), scatter, nil
}

// localCopyOf makes the local copy of step st, between virtual buffers or a
// virtual and a real one.
func (e *Engine) localCopyOf(st *algo.Step, bufs *Buffers) (c localCopy, err error) {
	if st.Src.Len != st.Dst.Len {
		return c, fault.New(fault.ErrInvalidArgument, -1, "schedule copies %d bytes into %d", st.Src.Len, st.Dst.Len)
	}
	src, sv, err := e.resolve(bufs, st.Src)
	if err != nil {
		return c, err
	}
	dst, dv, err := e.resolve(bufs, st.Dst)
	if err != nil {
		return c, err
	}
	if sv == nil {
		sv = e.oneSlice(src)
	}
	if dv == nil {
		dv = e.oneSlice(dst)
	}
	return localCopy{sv: sv, dv: dv, left: st.Src.Len}, nil
}

// oneSlice is a list of the one slice b, kept in the round's vecs.
func (e *Engine) oneSlice(b []byte) [][]byte {
	l := len(e.vec.vecs)
	e.vec.vecs = append(e.vec.vecs, b)
	return e.vec.vecs[l : l+1 : l+1]
}

// copyVecSome does up to copyChunk bytes of a vectored local copy and
// reports whether it finished it.
func copyVecSome(c *localCopy) bool {
	for budget := copyChunk; budget > 0 && c.left > 0; {
		s := c.sc.Piece(c.sv, budget)
		d := c.dc.Piece(c.dv, len(s))
		n := copy(d, s)
		c.sc.Advance(c.sv, n)
		c.dc.Advance(c.dv, n)
		c.left -= n
		budget -= n
	}
	return c.left == 0
}
