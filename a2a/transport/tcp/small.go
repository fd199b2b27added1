package tcp

import (
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/transport"
)

// smallMax is the largest payload that goes through a conn's staging buffer:
// the header and the payload are copied into one contiguous buffer and move
// with one send or recv of it, not with a sendmsg or readv of two iovecs.
// On this machine's kernel an iovec costs what copying 4 KiB does: a readv
// that finds the socket empty, which a spinning receiver issues many times
// per message, ran at 750-1080 ns against 520-580 ns for recv (C loop, 200000
// calls), and a 2-rank exchange of 56-byte frames over loopback (the 8 B
// AllToAllV) at 5.40-5.44 us p50 against 4.97-5.04 us, six alternations
// (scripts/peers/tcp_exchange.c, docs/PERFORMANCE.md).
const smallMax = 4 << 10

// staging is one direction's contiguous copy of a small frame: the header
// and then the payload.
type staging [hdrSize + smallMax]byte

// smallSend reports whether op goes through the send staging buffer.
func smallSend(op *transport.SendOp) bool { return op.Vec == nil && len(op.Data) <= smallMax }

// smallRecv reports whether op goes through the receive staging buffer: an
// exact-length receive into Dst, whose length is known before the header.
func smallRecv(op *transport.RecvOp) bool {
	return op.DstVec == nil && op.Window == nil && op.Route == nil && !op.AnyLen && op.Want.Len <= smallMax
}

// sendSmall is send for a small frame: a fresh op's header and payload are
// copied into the staging buffer, and every call sends what is left of it.
func (c *conn) sendSmall(op *transport.SendOp, fresh bool) (bool, error) {
	total := hdrSize + len(op.Data)
	if fresh {
		copy(c.sstage[:], op.Wire[:])
		copy(c.sstage[hdrSize:], op.Data)
	}
	for op.Progress < total {
		n, blocked, err := c.sendto(c.sstage[op.Progress:total])
		if blocked || err != nil {
			return false, err
		}
		op.Progress += n
	}
	return true, nil
}

// sendto sends b with one send(2) and counts what went out; blocked reports
// a full socket buffer (EAGAIN). See sendmsg.
func (c *conn) sendto(b []byte) (n int, blocked bool, err error) {
	for {
		sent, _, errno := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(c.fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), unix.MSG_NOSIGNAL, 0, 0)
		if errno != unix.EINTR {
			return c.sentResult(int(sent), errno)
		}
	}
}

// recvSmall is recv for a small frame: it reads the frame, and nothing of the
// next, into the staging buffer, checks the header once it is in, and copies
// the payload out once all of it is.
func (c *conn) recvSmall(op *transport.RecvOp) (bool, error) {
	total := hdrSize + int(op.Want.Len)
	for op.Progress < total {
		p := op.Progress
		n, err := c.recvfrom(c.rstage[p:total])
		if n == 0 || err != nil {
			return false, err
		}
		op.Progress += n
		if p < hdrSize && op.Progress >= hdrSize {
			copy(op.Wire[:], c.rstage[:hdrSize])
			if err := c.header(op); err != nil {
				return false, err
			}
		}
	}
	op.N = copy(c.rdst, c.rstage[hdrSize:total])
	return true, nil
}

// recvfrom reads into b (not empty) with one recv(2). It returns 0 and no
// error when the socket is empty. See readvIov.
func (c *conn) recvfrom(b []byte) (int, error) {
	for {
		n, _, errno := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(c.fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0, 0, 0)
		if errno == unix.EINTR {
			continue
		}
		return c.received(int(n), errno)
	}
}
