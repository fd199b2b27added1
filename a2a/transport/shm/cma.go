package shm

import (
	"encoding/binary"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// The receive side of CMA records (see the record kinds in conn.go): the
// descriptor after the header, then the payload copied straight from the
// sender's memory with process_vm_readv, and the acknowledgment that
// completes the sender's op.

// descBytes is the size of the CMA descriptor after a header of record kind
// kind, 0 for an inline record.
func descBytes(kind byte) int {
	switch kind {
	case recCMA:
		return descSize
	case recCMAVec:
		return descVecSize
	case recMap:
		return descMapSize
	}
	return 0
}

// recvDesc takes the descriptor after the header of a CMA record of kind
// (avail bytes in all) and prepares the copy from the sender's memory. The
// results are recvHeader's: an empty message is done at once.
func (c *conn) recvDesc(op *transport.RecvOp, kind byte, avail int) (more, done bool, err error) {
	ds := descBytes(kind)
	if avail != hdrSize+ds {
		return false, false, fault.New(fault.ErrMismatch, c.peer, "shm: stream %d from rank %d: CMA record of %d bytes", c.stream, c.peer, avail)
	}
	var d [descMapSize]byte
	c.rx.get(c.rhead, d[:ds])
	c.raddr = binary.LittleEndian.Uint64(d[0:])
	c.rid = binary.LittleEndian.Uint64(d[ds-8:])
	c.rhead += uint64(ds)
	c.release()
	plen := int(op.Got.Len)
	if plen == 0 && kind != recCMAVec {
		c.ack(ackDone)
		return false, true, nil
	}
	if kind == recMap {
		src, err := c.mapSource(d[:ds], plen)
		if err != nil {
			c.ack(ackRejected)
			return false, false, err
		}
		if src != nil {
			c.rsrc, c.rmap = src, true
			return true, false, nil
		}
		kind = recCMA // not mapped: the same bytes by CMA, from the address
	}
	c.rcma = true
	if kind == recCMAVec || op.DstVec != nil {
		c.rvec = true
		if err := c.remoteSlices(kind, binary.LittleEndian.Uint64(d[8:]), plen); err != nil || !c.rcma {
			return false, false, err
		}
	}
	return true, false, nil
}

// rejectDesc releases the sender of a record whose header this rank
// refused (avail bytes in all), when the record is a well-formed CMA
// descriptor: the sender waits for its acknowledgment, so it is told the
// descriptor was rejected.
func (c *conn) rejectDesc(op *transport.RecvOp, avail int) {
	ds := descBytes(recKind(&op.Wire))
	if ds == 0 || avail != hdrSize+ds {
		return
	}
	var d [descMapSize]byte
	c.rx.get(c.rhead+hdrSize, d[:ds])
	c.rhead += hdrSize + uint64(ds)
	c.release()
	c.rx.ack.Store(binary.LittleEndian.Uint64(d[ds-8:])<<2 | ackRejected)
	ringBell(c.peerSeg)
}

// remoteSlices sets c.rrv to the sender's slices of a vectored CMA
// receive: read from the sender's memory for a recCMAVec descriptor (count
// of them at c.raddr), else the one contiguous buffer at c.raddr. Their
// lengths must add up to the payload's plen bytes. It clears c.rcma when the
// kernel refuses CMA (see cmaRecv).
func (c *conn) remoteSlices(kind byte, count uint64, plen int) error {
	c.rri, c.rro = 0, 0
	if kind == recCMA {
		c.rrv = append(c.rrv[:0], unix.RemoteIovec{Base: uintptr(c.raddr), Len: plen})
		return nil
	}
	if count == 0 || count > maxRemoteIov || count > uint64(plen) {
		return fault.New(fault.ErrMismatch, c.peer, "shm: stream %d from rank %d: %d slices for a %d-byte message (frame)", c.stream, c.peer, count, plen)
	}
	n := int(count)
	if cap(c.rrv) < n {
		c.rrv = make([]unix.RemoteIovec, n)
	}
	c.rrv = c.rrv[:n]
	buf := unsafe.Slice((*byte)(unsafe.Pointer(&c.rrv[0])), n*int(unsafe.Sizeof(c.rrv[0])))
	for got := 0; got < len(buf); {
		k, errno := cmaRead(c.peerSeg.pid, buf[got:], c.raddr+uint64(got), &c.liov, &c.riov)
		if err := c.cmaErr(errno); err != nil || !c.rcma {
			return err
		}
		if errno == unix.EINTR {
			continue
		}
		if k == 0 {
			return fault.New(fault.ErrPeerLost, c.peer, "shm: rank %d's slice list ended early (stream %d)", c.peer, c.stream)
		}
		got += k
	}
	total := 0
	for _, v := range c.rrv {
		if v.Len <= 0 || v.Len > plen-total {
			return fault.New(fault.ErrMismatch, c.peer, "shm: stream %d from rank %d: slices do not add up to the %d-byte message (frame)", c.stream, c.peer, plen)
		}
		total += v.Len
	}
	if total != plen {
		return fault.New(fault.ErrMismatch, c.peer, "shm: stream %d from rank %d: slices hold %d bytes of a %d-byte message (frame)", c.stream, c.peer, total, plen)
	}
	return nil
}

// cmaErr maps a process_vm_readv errno: nil for success and EINTR; on
// EPERM or ENOSYS it turns CMA off, clears c.rcma and tells the sender to
// stream the payload instead (nil error); else the peer is lost.
func (c *conn) cmaErr(errno unix.Errno) error {
	switch errno {
	case 0, unix.EINTR:
		return nil
	case unix.EPERM, unix.ENOSYS:
		c.t.disableCMA(errno)
		c.rcma, c.rvec = false, false
		c.ack(ackFallback)
		return nil
	case unix.ESRCH:
		return fault.Wrap(fault.ErrPeerLost, c.peer, errno, "shm: rank %d (pid %d) exited (stream %d)", c.peer, c.peerSeg.pid, c.stream)
	default:
		return fault.Wrap(fault.ErrPeerLost, c.peer, errno, "shm: reading rank %d's buffer (stream %d)", c.peer, c.stream)
	}
}

// cmaRecvVec is cmaRecv with iovec lists: the sender's slices (c.rrv from
// c.rri, c.rro) on one side, the receive's (DstVec from c.rcur, or Dst) on
// the other, up to maxCMAIov entries and cmaCallBytes per call.
func (c *conn) cmaRecvVec(op *transport.RecvOp) (bool, error) {
	dst := op.DstVec
	if dst == nil {
		c.rone[0] = c.rdst
		dst = c.rone[:]
	}
	if c.lvecs == nil {
		c.lvecs, c.rvecs = make([]unix.Iovec, maxCMAIov), make([]unix.RemoteIovec, maxCMAIov)
	}
	plen := int(op.Got.Len)
	got := op.Progress - hdrSize
	for budget := cmaCallBytes; got < plen && budget > 0; {
		want := min(plen-got, budget)
		nl, cur := 0, c.rcur
		for bytes := 0; bytes < want && nl < maxCMAIov; nl++ {
			b := cur.Piece(dst, want-bytes)
			c.lvecs[nl].Base = &b[0]
			c.lvecs[nl].SetLen(len(b))
			bytes += len(b)
			cur.Advance(dst, len(b))
		}
		nr, ri, ro := 0, c.rri, c.rro
		for bytes := 0; bytes < want && nr < maxCMAIov && ri < len(c.rrv); nr++ {
			n := min(c.rrv[ri].Len-ro, want-bytes)
			c.rvecs[nr] = unix.RemoteIovec{Base: c.rrv[ri].Base + uintptr(ro), Len: n}
			bytes += n
			if ro += n; ro == c.rrv[ri].Len {
				ri, ro = ri+1, 0
			}
		}
		// Syscall, not RawSyscall: the copy may fault pages in and take long.
		k, _, errno := unix.Syscall6(unix.SYS_PROCESS_VM_READV, uintptr(c.peerSeg.pid),
			uintptr(unsafe.Pointer(&c.lvecs[0])), uintptr(nl), uintptr(unsafe.Pointer(&c.rvecs[0])), uintptr(nr), 0)
		clear(c.lvecs[:nl]) // do not pin the caller's buffers
		if err := c.cmaErr(errno); err != nil || !c.rcma {
			if !c.rcma {
				op.Progress = hdrSize
				c.rcur.Reset()
			}
			return false, err
		}
		if errno == unix.EINTR {
			continue
		}
		if k == 0 {
			return false, fault.New(fault.ErrPeerLost, c.peer, "shm: rank %d's buffer ended early (stream %d)", c.peer, c.stream)
		}
		n := int(k)
		c.rcur.Advance(dst, n)
		for m := n; m > 0; {
			step := min(c.rrv[c.rri].Len-c.rro, m)
			m -= step
			if c.rro += step; c.rro == c.rrv[c.rri].Len {
				c.rri, c.rro = c.rri+1, 0
			}
		}
		got += n
		budget -= n
		op.Progress += n
	}
	c.rone[0] = nil
	if got < plen {
		return false, nil
	}
	c.rcmas++
	return c.cmaDone(op, got)
}

// cmaRecv copies the payload of a CMA descriptor from the sender's memory.
// It clears c.rcma when the kernel refuses, after telling the sender to
// stream the payload through the ring instead (cmaErr).
func (c *conn) cmaRecv(op *transport.RecvOp) (bool, error) {
	got := op.Progress - hdrSize
	for budget := cmaCallBytes; got < len(c.rdst) && budget > 0; {
		n := min(len(c.rdst)-got, budget)
		k, errno := cmaRead(c.peerSeg.pid, c.rdst[got:got+n], c.raddr+uint64(got), &c.liov, &c.riov)
		if err := c.cmaErr(errno); err != nil || !c.rcma {
			if !c.rcma {
				op.Progress = hdrSize
			}
			return false, err
		}
		if errno == unix.EINTR {
			continue
		}
		if k == 0 {
			return false, fault.New(fault.ErrPeerLost, c.peer, "shm: rank %d's buffer ended early (stream %d)", c.peer, c.stream)
		}
		got += k
		budget -= k
		op.Progress += k
	}
	if got < len(c.rdst) {
		return false, nil
	}
	c.rcmas++
	return c.cmaDone(op, got)
}

// cmaDone completes a receive whose got bytes were all copied from the
// sender's memory, and tells the sender.
func (c *conn) cmaDone(op *transport.RecvOp, got int) (bool, error) {
	// A sender that closed meanwhile gave its buffer back to its caller, who
	// may have changed it while we copied.
	if c.peerSeg.closed.Load() != 0 {
		return false, c.t.goneErr(c.peerIdx, c.stream)
	}
	c.ack(ackDone)
	c.recvd.Add(uint64(got))
	op.N = got
	return true, nil
}

// ack answers the current CMA descriptor.
func (c *conn) ack(status uint64) {
	c.rx.ack.Store(c.rid<<2 | status)
	ringBell(c.peerSeg)
}
