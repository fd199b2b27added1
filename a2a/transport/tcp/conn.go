package tcp

import (
	"io"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

const hdrSize = transport.HeaderSize

// maxIO caps the bytes of one sendmsg or readv. TrySend and TryRecv return
// after one syscall that moved bytes, so the engine alternates between
// directions and peers in maxIO pieces: the receiver copies data out of the
// socket while it is still in cache, right after the sender copied it in.
// It is the planners' frame (algo.DefaultBlockSize), so a default frame goes
// out in one sendmsg: the frames already bound what is in flight, and a
// second cut inside them only added syscalls and engine passes. Measured on
// 2 ranks, 1 MiB per peer over loopback, when messages were not framed: one
// syscall per message ran at ~540 us, 256 KiB pieces at ~300 us. With 512
// KiB frames, 512 KiB pieces beat 256 KiB ones by a median 13 % (15 of 16
// alternated pairs) and tie at 4 ranks (docs/PERFORMANCE.md, issue 21).
const maxIO = 512 << 10

// conn is one stream to one peer. Its send fields are touched only by the
// goroutine driving its sends, its receive fields only by the one driving its
// receives, so the two directions may progress on different goroutines. The
// iovec and msghdr storage lives here so that the syscalls allocate nothing.
type conn struct {
	fd        int
	peer      int
	stream    int
	guard     transport.Guard
	sent      *atomic.Uint64 // bytes to peer, shared by the peer's streams
	recvd     *atomic.Uint64
	closedErr error

	sendSide transport.SendSide // which op owns the send direction; sticky error
	siov     [2]unix.Iovec
	smsg     unix.Msghdr
	sstage   staging // a small frame being sent (smallMax)

	recvSide transport.RecvSide // which op owns the receive direction; sticky error
	rdst     []byte             // payload destination, known once the header is in
	riov     [2]unix.Iovec
	rstage   staging // a small frame being received (smallMax)

	// Vectored payloads (SendOp.Vec, RecvOp.DstVec): where the next byte
	// is, and iovecs for the header and up to maxVecIov slices per call,
	// made at the first such op.
	scur, rcur transport.VecCursor
	sviov      []unix.Iovec
	rviov      []unix.Iovec
}

// maxVecIov bounds the slices of a vectored payload one sendmsg or readv
// takes (besides maxIO bytes): rows of 2 KiB fill maxIO with 256.
const maxVecIov = 256

// Vectored reports that conn moves vectored payloads itself: one sendmsg or
// readv with an iovec per slice, no staging copy.
func (c *conn) Vectored() bool { return true }

// fillIov points iov at the header bytes from p (if p is inside it) and then
// at the payload slices of v from cur, at most maxIO payload bytes. It
// returns the entries used.
func fillIov(iov []unix.Iovec, wire *[hdrSize]byte, p int, v [][]byte, cur transport.VecCursor) int {
	cnt := 0
	if p < hdrSize {
		iov[0].Base = &wire[p]
		iov[0].SetLen(hdrSize - p)
		cnt = 1
	}
	for bytes := 0; cnt < len(iov) && bytes < maxIO; cnt++ {
		b := cur.Piece(v, maxIO-bytes)
		if b == nil {
			break
		}
		iov[cnt].Base = &b[0]
		iov[cnt].SetLen(len(b))
		bytes += len(b)
		cur.Advance(v, len(b))
	}
	return cnt
}

// TrySend writes as much of op as the socket takes: the header and the payload
// in one sendmsg straight from op.Data, at most maxIO bytes per call.
// A full socket returns (false, nil); a reset or closed peer fails with
// fault.ErrPeerLost naming the peer. An op passed again after it reported done
// starts over as a new message.
func (c *conn) TrySend(op *transport.SendOp) (bool, error) {
	if err := c.guard.Enter(c.closedErr); err != nil {
		return false, err
	}
	defer c.guard.Release()
	fresh, ok, err := c.sendSide.Claim(op, c.peer, "tcp")
	if !ok {
		return false, err
	}
	if smallSend(op) {
		done, err := c.sendSmall(op, fresh)
		c.sendSide.Finish(done, err)
		return done, err
	}
	if op.Vec == nil {
		done, err := c.send(op)
		if c.sendSide.Finish(done, err) {
			c.siov = [2]unix.Iovec{} // do not pin the caller's buffer
		}
		return done, err
	}
	if fresh {
		c.scur.Reset()
		if c.sviov == nil {
			c.sviov = make([]unix.Iovec, 1+maxVecIov)
		}
	}
	done, err := c.sendVec(op)
	if c.sendSide.Finish(done, err) {
		clear(c.sviov)
	}
	return done, err
}

// sendVec is send for a gather payload: the header and the slices from the
// cursor go out in one sendmsg, up to maxIO payload bytes per call.
func (c *conn) sendVec(op *transport.SendOp) (bool, error) {
	total := hdrSize + int(op.Hdr.Len)
	for op.Progress < total {
		p := op.Progress
		cnt := fillIov(c.sviov, &op.Wire, p, op.Vec, c.scur)
		n, blocked, err := c.sendmsg(&c.sviov[0], cnt)
		if blocked || err != nil {
			return false, err
		}
		op.Progress += n
		c.scur.Advance(op.Vec, op.Progress-max(p, hdrSize))
		if op.Progress < total {
			return false, nil
		}
	}
	return true, nil
}

// sendmsg sends the first cnt entries of iov and counts what went out;
// blocked reports a full socket buffer (EAGAIN).
func (c *conn) sendmsg(iov *unix.Iovec, cnt int) (n int, blocked bool, err error) {
	c.smsg.Iov = iov
	c.smsg.SetIovlen(cnt)
	for {
		// sendmsg rather than writev for MSG_NOSIGNAL: a dead peer must be an
		// error, not a SIGPIPE.
		// RawSyscall: on a non-blocking socket sendmsg never sleeps, and
		// entering the scheduler's syscall state would let the runtime hand
		// this P to another thread, waking a second core mid-operation.
		sent, _, errno := unix.RawSyscall(unix.SYS_SENDMSG, uintptr(c.fd), uintptr(unsafe.Pointer(&c.smsg)), unix.MSG_NOSIGNAL)
		if errno != unix.EINTR {
			return c.sentResult(int(sent), errno)
		}
	}
}

// sentResult is the outcome of a send that returned n and errno (not
// EINTR): the bytes sent, counted; blocked for a full socket buffer
// (EAGAIN); or the peer lost.
func (c *conn) sentResult(n int, errno unix.Errno) (sent int, blocked bool, err error) {
	switch errno {
	case 0:
		c.sent.Add(uint64(n))
		return n, false, nil
	case unix.EAGAIN:
		return 0, true, nil
	default:
		return 0, false, c.lost(errno, "send")
	}
}

func (c *conn) send(op *transport.SendOp) (bool, error) {
	total := hdrSize + len(op.Data)
	for op.Progress < total {
		cnt := 1
		if p := op.Progress; p < hdrSize {
			c.siov[0].Base = &op.Wire[p]
			c.siov[0].SetLen(hdrSize - p)
			if len(op.Data) > 0 {
				c.siov[1].Base = &op.Data[0]
				c.siov[1].SetLen(len(op.Data))
				cnt = 2
			}
		} else {
			p -= hdrSize
			c.siov[0].Base = &op.Data[p]
			c.siov[0].SetLen(min(len(op.Data)-p, maxIO))
		}
		if cnt == 2 {
			c.siov[1].SetLen(min(len(op.Data), maxIO))
		}
		n, blocked, err := c.sendmsg(&c.siov[0], cnt)
		if blocked || err != nil {
			return false, err
		}
		op.Progress += n
		if op.Progress < total {
			return false, nil
		}
	}
	return true, nil
}

// TryRecv reads as much of op as the socket holds. An exact-length receive
// reads header and payload with one readv into op.Dst, so a small message costs
// one syscall. AnyLen and window receives read the header alone first, since
// it decides where the payload goes: op.Dst[:Got.Len], or
// op.Window[Got.Aux:Got.Aux+Got.Len] (a window receive is bounded by the
// window; op.Want.Len is not used). A header differing from op.Want, or a put
// outside the window, fails with fault.ErrMismatch; the stream is then
// unusable, since its framing is lost.
func (c *conn) TryRecv(op *transport.RecvOp) (bool, error) {
	if err := c.guard.Enter(c.closedErr); err != nil {
		return false, err
	}
	defer c.guard.Release()
	fresh, ok, err := c.recvSide.Claim(op, c.peer, "tcp")
	if !ok {
		return false, err
	}
	if fresh {
		c.rdst = nil
	}
	if smallRecv(op) {
		done, err := c.recvSmall(op)
		if c.recvSide.Finish(done, err) {
			c.rdst = nil
		}
		return done, err
	}
	if op.DstVec == nil {
		done, err := c.recv(op)
		if c.recvSide.Finish(done, err) {
			c.rdst = nil
			c.riov = [2]unix.Iovec{}
		}
		return done, err
	}
	if fresh {
		c.rcur.Reset()
		if c.rviov == nil {
			c.rviov = make([]unix.Iovec, 1+maxVecIov)
		}
	}
	done, err := c.recvVec(op)
	if c.recvSide.Finish(done, err) {
		clear(c.rviov)
	}
	return done, err
}

// recvVec is recv for a scattered receive (exact length): one readv takes
// the header and the payload's first slices, later ones the slices from the
// cursor, up to maxIO payload bytes per call.
func (c *conn) recvVec(op *transport.RecvOp) (bool, error) {
	total := hdrSize + int(op.Want.Len)
	for op.Progress < total {
		p := op.Progress
		cnt := fillIov(c.rviov, &op.Wire, p, op.DstVec, c.rcur)
		n, err := c.readvIov(c.rviov[:cnt])
		if n == 0 || err != nil {
			return false, err
		}
		op.Progress += n
		if op.Progress > hdrSize {
			c.rcur.Advance(op.DstVec, op.Progress-max(p, hdrSize))
		}
		if p < hdrSize && op.Progress >= hdrSize {
			if err := c.header(op); err != nil {
				return false, err
			}
		}
		if op.Progress >= hdrSize && op.Progress < total {
			return false, nil
		}
	}
	op.N = total - hdrSize
	return true, nil
}

func (c *conn) recv(op *transport.RecvOp) (bool, error) {
	for {
		if p := op.Progress; p < hdrSize {
			c.riov[0].Base = &op.Wire[p]
			c.riov[0].SetLen(hdrSize - p)
			cnt := 1
			if op.Window == nil && !op.AnyLen && op.Want.Len > 0 {
				// Nothing of the payload is in yet, so it starts at Dst[0].
				c.riov[1].Base = &op.Dst[0]
				c.riov[1].SetLen(min(int(op.Want.Len), maxIO))
				cnt = 2
			}
			n, err := c.readv(cnt)
			if n == 0 || err != nil {
				return false, err
			}
			op.Progress += n
			if op.Progress < hdrSize {
				continue
			}
			if err := c.header(op); err != nil {
				return false, err
			}
		}
		got := op.Progress - hdrSize
		if got == len(c.rdst) {
			op.N = got
			return true, nil
		}
		c.riov[0].Base = &c.rdst[got]
		c.riov[0].SetLen(min(len(c.rdst)-got, maxIO))
		n, err := c.readv(1)
		if n == 0 || err != nil {
			return false, err
		}
		op.Progress += n
		if op.Progress-hdrSize < len(c.rdst) {
			return false, nil
		}
	}
}

// header decodes and checks a complete header and sets the payload
// destination.
func (c *conn) header(op *transport.RecvOp) error {
	got := &op.Got
	if err := got.Decode(op.Wire[:]); err != nil {
		return fault.Wrap(fault.ErrMismatch, c.peer, err, "tcp: stream %d from rank %d", c.stream, c.peer)
	}
	dst, err := op.Land(c.peer)
	if err != nil {
		return err
	}
	c.rdst = dst
	return nil
}

// readv reads into the first cnt entries of c.riov. It returns 0 and no error
// when the socket is empty.
func (c *conn) readv(cnt int) (int, error) { return c.readvIov(c.riov[:cnt]) }

// readvIov reads into iov (at least one entry); see readv.
func (c *conn) readvIov(iov []unix.Iovec) (int, error) {
	for {
		// RawSyscall: see send; readv on a non-blocking socket never sleeps.
		n, _, errno := unix.RawSyscall(unix.SYS_READV, uintptr(c.fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		if errno == unix.EINTR {
			continue
		}
		return c.received(int(n), errno)
	}
}

// received is the outcome of a read that returned n and errno (not EINTR):
// the bytes read, counted; 0 for an empty socket (EAGAIN); or the peer lost.
func (c *conn) received(n int, errno unix.Errno) (int, error) {
	switch errno {
	case 0:
		if n == 0 {
			return 0, fault.Wrap(fault.ErrPeerLost, c.peer, io.EOF, "tcp: rank %d closed stream %d", c.peer, c.stream)
		}
		c.recvd.Add(uint64(n))
		return n, nil
	case unix.EAGAIN:
		return 0, nil
	default:
		return 0, c.lost(errno, "receive")
	}
}

func (c *conn) lost(errno unix.Errno, dir string) error {
	return fault.Wrap(fault.ErrPeerLost, c.peer, errno, "tcp: %s on stream %d to rank %d", dir, c.stream, c.peer)
}

// close waits for any syscall in progress on the descriptor, then closes it.
func (c *conn) close() error {
	if !c.guard.Shut() {
		return nil
	}
	c.guard.Drain(nil)
	return unix.Close(c.fd)
}
