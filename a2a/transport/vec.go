package transport

// Vectored payloads. A frame's payload is one byte slice (SendOp.Data,
// RecvOp.Dst) or, for a gather-send or a scattered receive, a list of byte
// slices taken in order (SendOp.Vec, RecvOp.DstVec): rows of a token buffer
// that go to one rank, for instance. A transport that moves such a list
// without packing it first (TCP: one sendmsg or readv with an iovec per
// slice; shm: process_vm_readv with both iovec lists, or ring copies straight
// from and to the slices; verbs: a scatter-gather list) implements VecConn on
// its Conns. The engine packs and unpacks for the others.

// VecConn is a Conn that takes SendOps with Vec and RecvOps with DstVec set.
type VecConn interface {
	Conn
	// Vectored reports whether the Conn moves vectored payloads itself.
	Vectored() bool
}

// VecLen is the total length of v.
func VecLen(v [][]byte) int {
	n := 0
	for _, b := range v {
		n += len(b)
	}
	return n
}

// VecCursor is a position in a vectored payload: slice I, byte Off of it.
// Transports keep one per direction and advance it as bytes move, so that a
// payload of many slices is walked once, never searched.
type VecCursor struct {
	I, Off int
}

// Reset moves c to the start of the payload.
func (c *VecCursor) Reset() { c.I, c.Off = 0, 0 }

// Piece returns the contiguous bytes of v at c, at most max of them, and
// skips empty slices on the way; nil at the end of v.
func (c *VecCursor) Piece(v [][]byte, max int) []byte {
	for c.I < len(v) {
		if b := v[c.I][c.Off:]; len(b) > 0 {
			return b[:min(len(b), max)]
		}
		c.I, c.Off = c.I+1, 0
	}
	return nil
}

// Advance moves c n bytes forward in v.
func (c *VecCursor) Advance(v [][]byte, n int) {
	for n > 0 && c.I < len(v) {
		left := len(v[c.I]) - c.Off
		if n < left {
			c.Off += n
			return
		}
		n -= left
		c.I, c.Off = c.I+1, 0
	}
}

// Gather copies bytes of v from c into dst, advancing c, and returns how many
// it copied (less than len(dst) only at the end of v).
func (c *VecCursor) Gather(v [][]byte, dst []byte) int {
	n := 0
	for n < len(dst) {
		p := c.Piece(v, len(dst)-n)
		if p == nil {
			break
		}
		copy(dst[n:], p)
		n += len(p)
		c.Advance(v, len(p))
	}
	return n
}

// Scatter copies src into v from c on, advancing c, and returns how many
// bytes it copied (less than len(src) only at the end of v).
func (c *VecCursor) Scatter(v [][]byte, src []byte) int {
	n := 0
	for n < len(src) {
		p := c.Piece(v, len(src)-n)
		if p == nil {
			break
		}
		copy(p, src[n:])
		n += len(p)
		c.Advance(v, len(p))
	}
	return n
}
