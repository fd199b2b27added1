package shm

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

const hdrSize = transport.HeaderSize

// Ring records. A record is a frame header, then either the payload (inline)
// or a CMA descriptor: the address of the sender's buffer and the descriptor's
// id, which the receiver's acknowledgment names. The high bits of the
// header's flags byte (kindByte, transport.TransportFlags) tell which; the
// receiver refuses any other value of them.
//
// A gather-send (SendOp.Vec) by CMA sends a recCMAVec descriptor instead:
// the address and count of an array of remote iovecs (address, length) in
// the sender's memory, then the id. The receiver reads that array with one
// process_vm_readv and then the payload with iovec lists on both sides.
//
// A send from a shareable buffer sends a recMap descriptor: a recCMA
// descriptor's address, then where the bytes are in the buffer's memfd,
// which the receiver maps once and copies from (mapped.go).
const (
	kindByte     = 7 // the flags byte: the kind is its high nibble
	kindShift    = 4
	recInline    = 0
	recCMA       = 1
	recCMAVec    = 2
	recMap       = 3
	descSize     = 16
	descVecSize  = 24
	maxCMAIov    = 1024    // IOV_MAX: iovecs per process_vm_readv side
	maxRemoteIov = 1 << 20 // slices of one vectored frame a receiver accepts
)

// Copy sizes. chunkBytes is the largest fragment body: the peer copies one
// fragment out while this side copies the next one in. callBytes bounds the
// bytes one TrySend or TryRecv copies, so the engine alternates between
// directions and peers. cmaCallBytes bounds one process_vm_readv; frames are
// at most 1 MiB (algo.DefaultBlockSize), so a frame takes one call. Measured
// with BenchmarkExchangeProcs (1 MiB each way through 256 KiB rings): chunks
// of 16, 32, 64 and 128 KiB and calls of 256 KiB or 1 MiB all ran within the
// noise of each other (~150 us), bound by the two copies.
const (
	chunkBytes   = 32 << 10
	callBytes    = 256 << 10
	cmaCallBytes = 1 << 20
)

// pollEvery is how many fruitless calls a stream makes before it checks
// whether its peer's process still exists; Wait checks at every park.
const pollEvery = 1024

// idle marks a watch that no op waits on.
const idle = ^uint64(0)

// The ring is a sequence of fragments, each starting at a multiple of
// fragAlign: an 8-byte stamp, then the body. A record's first fragment holds
// the whole header (and the descriptor, or the payload's first bytes); later
// fragments continue its payload. The stamp is the stream position where the
// body ends, stored last (atomically) to publish the fragment, and the sender
// zeroes the next fragment's stamp slot before, so a receiver polls the first
// cache line of the fragment it waits for: one cache miss brings it the
// stamp, the header and a small payload. A stale slot is never mistaken for a
// stamp: it was zeroed, and a stamp exceeds its own position.
const fragAlign = 64

// alignFrag rounds a stream position up to a fragment boundary.
func alignFrag(pos uint64) uint64 { return (pos + fragAlign - 1) &^ (fragAlign - 1) }

// ring is one SPSC ring as seen by either side.
type ring struct {
	head  *atomic.Uint64 // bytes ever consumed; the receiver's
	ack   *atomic.Uint64 // last CMA descriptor id<<2 | ackStatus; the receiver's
	cmaOK *atomic.Uint32 // the receiver takes CMA descriptors; the receiver's
	data  []byte
	mask  uint64
}

// stamp is the stamp slot of the fragment at stream position pos (a
// multiple of fragAlign, so the slot never wraps).
func (r *ring) stamp(pos uint64) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&r.data[pos&r.mask]))
}

// put copies src into the ring at stream position pos, wrapping at the end.
func (r *ring) put(pos uint64, src []byte) {
	n := copy(r.data[pos&r.mask:], src)
	if n < len(src) {
		copy(r.data, src[n:])
	}
}

// get copies the ring's bytes at stream position pos into dst.
func (r *ring) get(pos uint64, dst []byte) {
	n := copy(dst, r.data[pos&r.mask:])
	if n < len(dst) {
		copy(dst[n:], r.data)
	}
}

// conn is one stream to one peer: it sends on a ring in the peer's segment and
// receives on one in this rank's. Its send fields are touched only by the
// goroutine driving its sends, its receive fields only by the one driving its
// receives; the watches are atomics because Wait reads them.
type conn struct {
	_         [lineSize]byte // apart from other ranks' conns (in-process ranks)
	t         *Transport
	peer      int // world rank
	stream    int
	peerIdx   int // local index
	peerSeg   *segment
	tx, rx    ring
	guard     transport.Guard
	sent      *atomic.Uint64 // bytes to peer, shared by the peer's streams
	recvd     *atomic.Uint64
	closedErr error

	_        [lineSize]byte
	sendSide transport.SendSide // which op owns the send direction; sticky error
	stail    uint64             // where our next fragment starts
	shead    uint64             // the receiver's head, as last loaded
	scma     bool               // the op travels by CMA
	sid      uint64             // id of the last CMA descriptor sent
	sidle    uint32
	scur     transport.VecCursor // next payload byte of a gather-send
	svec     []unix.RemoteIovec  // a gather-send's slices, for a recCMAVec descriptor
	sshare   transport.Shared    // the shareable buffer a recMap send is from
	swHead   atomic.Uint64       // head a stalled send waits to move, or idle
	swAck    atomic.Uint64       // ack a stalled CMA send waits to change, or idle

	_        [lineSize]byte
	recvSide transport.RecvSide // which op owns the receive direction; sticky error
	rhead    uint64             // next byte to consume
	rend     uint64             // end of the current fragment's body
	rdst     []byte             // payload destination, known once the header is in
	rcma     bool               // the payload comes by CMA
	raddr    uint64             // sender's buffer address
	rid      uint64             // descriptor id to acknowledge
	ridle    uint32
	rw       atomic.Uint64 // stamp slot a stalled receive waits on, or idle
	rcmas    uint64        // messages received by CMA
	rmap     bool          // the payload comes from a mapping of the sender's buffer
	rsrc     []byte        // that payload in the mapping
	rmapped  uint64        // messages received from mappings
	rmaps    mapCache
	liov     unix.Iovec
	riov     unix.RemoteIovec
	// Vectored CMA receives (a recCMAVec descriptor, or RecvOp.DstVec): the
	// sender's slices and the next one to read (rri, rro), where the next
	// byte lands, the iovec lists of one call, and the contiguous
	// destination as a one-slice list.
	rvec     bool
	rrv      []unix.RemoteIovec
	rri, rro int
	rcur     transport.VecCursor
	lvecs    []unix.Iovec
	rvecs    []unix.RemoteIovec
	rone     [1][]byte
	_        [lineSize]byte
}

// recKind is the record kind a header carries.
func recKind(wire *[hdrSize]byte) byte { return wire[kindByte] >> kindShift }

// Vectored reports that conn moves vectored payloads itself: by CMA with
// iovec lists on both sides, or with ring copies straight from and to the
// slices.
func (c *conn) Vectored() bool { return true }

// putPayload copies payload bytes [p, p+n) of op into the ring at stream
// position pos; a gather payload's bytes come from the cursor, which is at p.
func (c *conn) putPayload(pos uint64, op *transport.SendOp, p, n int) {
	if op.Vec == nil {
		c.tx.put(pos, op.Data[p:p+n])
		return
	}
	for n > 0 {
		b := c.scur.Piece(op.Vec, n)
		c.tx.put(pos, b)
		c.scur.Advance(op.Vec, len(b))
		pos, n = pos+uint64(len(b)), n-len(b)
	}
}

// getPayload copies n ring bytes at the receive head into op's payload from
// byte p: Dst, or the scattered slices from the cursor, which is at p.
func (c *conn) getPayload(op *transport.RecvOp, p, n int) {
	if op.DstVec == nil {
		c.rx.get(c.rhead, c.rdst[p:p+n])
		return
	}
	pos := c.rhead
	for n > 0 {
		b := c.rcur.Piece(op.DstVec, n)
		c.rx.get(pos, b)
		c.rcur.Advance(op.DstVec, len(b))
		pos, n = pos+uint64(len(b)), n-len(b)
	}
}

var _ transport.Conn = (*conn)(nil)

// TrySend copies as much of op into the ring as fits, at most callBytes per
// call; a message of at least the ZCopy threshold goes as a CMA descriptor
// and completes when the receiver acknowledges its copy (until then op.Data
// must not change, as for any op in flight). A full ring, or a descriptor not
// yet acknowledged, returns (false, nil); a peer that closed or exited fails
// with fault.ErrPeerLost naming it. An op passed again after it reported done
// starts over as a new message.
func (c *conn) TrySend(op *transport.SendOp) (bool, error) {
	if err := c.guard.Enter(c.closedErr); err != nil {
		return false, err
	}
	defer c.guard.Release()
	fresh, ok, err := c.sendSide.Claim(op, c.peer, "shm")
	if !ok {
		return false, err
	}
	if fresh {
		if err := c.t.goneErr(c.peerIdx, c.stream); err != nil {
			c.sendSide.Finish(false, err)
			return false, err
		}
		z := c.t.zthresh
		n := op.PayloadLen()
		c.scma = z > 0 && n >= z && c.tx.cmaOK.Load() != 0 && (op.Vec == nil || n >= c.t.zvec*len(op.Vec))
		c.sshare.Release() // of an op abandoned in flight
		if c.scma {
			op.Wire[kindByte] = op.Wire[kindByte]&^transport.TransportFlags | recCMA<<kindShift
			if op.Vec == nil && c.t.mapMax > 0 {
				if sh, ok := transport.AcquireShared(addrOf(op.Data), n); ok {
					c.sshare = sh
					op.Wire[kindByte] = op.Wire[kindByte]&^transport.TransportFlags | recMap<<kindShift
				}
			}
			if op.Vec != nil {
				op.Wire[kindByte] = op.Wire[kindByte]&^transport.TransportFlags | recCMAVec<<kindShift
				c.svec = c.svec[:0]
				for _, b := range op.Vec {
					if len(b) > 0 {
						c.svec = append(c.svec, unix.RemoteIovec{Base: addrOf(b), Len: len(b)})
					}
				}
			}
		}
		c.scur.Reset()
	}
	done, err := c.send(op)
	if c.sendSide.Finish(done, err) {
		c.sshare.Release()
		if c.swHead.Load() != idle {
			c.swHead.Store(idle)
		}
		if c.swAck.Load() != idle {
			c.swAck.Store(idle)
		}
	}
	return done, err
}

func (c *conn) send(op *transport.SendOp) (bool, error) {
	plen := op.PayloadLen()
	total := hdrSize + plen
	moved := 0
	budget := callBytes
	if op.Progress == 0 {
		rec := hdrSize
		vec := c.scma && op.Vec != nil
		switch {
		case vec:
			rec += descVecSize
		case c.sshare.Held():
			rec += descMapSize
		case c.scma:
			rec += descSize
		}
		first := rec
		if !c.scma {
			first += min(plen, chunkBytes)
		}
		room := c.room(first)
		if room < rec {
			return c.sendStall(c.shead, &c.swHead)
		}
		c.tx.put(c.stail+8, op.Wire[:])
		if vec {
			c.sid++
			var d [descVecSize]byte
			binary.LittleEndian.PutUint64(d[0:], uint64(uintptr(unsafe.Pointer(&c.svec[0]))))
			binary.LittleEndian.PutUint64(d[8:], uint64(len(c.svec)))
			binary.LittleEndian.PutUint64(d[16:], c.sid)
			c.tx.put(c.stail+8+hdrSize, d[:])
			c.publish(rec)
			op.Progress = hdrSize
			c.sent.Add(hdrSize)
			return false, nil
		}
		if c.sshare.Held() {
			c.sid++
			var d [descMapSize]byte
			putMapDesc(d[:], uint64(addrOf(op.Data)), &c.sshare, c.sid)
			c.tx.put(c.stail+8+hdrSize, d[:])
			c.publish(rec)
			op.Progress = hdrSize
			c.sent.Add(hdrSize)
			return false, nil
		}
		if c.scma {
			c.sid++
			var d [descSize]byte
			binary.LittleEndian.PutUint64(d[0:], uint64(addrOf(op.Data)))
			binary.LittleEndian.PutUint64(d[8:], c.sid)
			c.tx.put(c.stail+8+hdrSize, d[:])
			c.publish(rec)
			op.Progress = hdrSize
			c.sent.Add(hdrSize)
			return false, nil // the receiver cannot have copied it yet
		}
		n := min(room-rec, plen, chunkBytes)
		c.putPayload(c.stail+8+hdrSize, op, 0, n)
		c.publish(hdrSize + n)
		op.Progress = hdrSize + n
		moved, budget = hdrSize+n, budget-n
	}
	if c.scma {
		a := c.tx.ack.Load()
		if a>>2 != c.sid {
			return c.sendStall(a, &c.swAck)
		}
		switch a & 3 {
		case ackDone:
			op.Progress = total
			c.sent.Add(uint64(plen))
			return true, nil
		case ackFallback:
			// The receiver turned CMA off and takes the payload inline now.
			c.scma = false
			c.swAck.Store(idle)
		default:
			return false, fault.New(fault.ErrMismatch, c.peer,
				"shm: rank %d rejected part %d of the message of %s op %d on stream %d", c.peer, op.Hdr.Round, op.Hdr.Kind, op.Hdr.Seq, c.stream)
		}
	}
	for op.Progress < total && budget > 0 {
		left := total - op.Progress
		// Wait for room for a useful fragment rather than trickle small
		// ones into a nearly full ring.
		useful := min(left, chunkBytes, len(c.tx.data)/4)
		room := c.room(useful)
		if room < useful {
			break
		}
		n := min(room, left, chunkBytes, budget)
		p := op.Progress - hdrSize
		c.putPayload(c.stail+8, op, p, n)
		// Publish chunk by chunk, so the receiver copies out while we copy in.
		c.publish(n)
		op.Progress += n
		moved += n
		budget -= n
	}
	if moved > 0 {
		c.sent.Add(uint64(moved))
	}
	if op.Progress == total {
		return true, nil
	}
	if moved > 0 {
		return false, nil
	}
	return c.sendStall(c.shead, &c.swHead)
}

// room returns the largest fragment body that fits in the ring now,
// reloading the receiver's head only when the cached one leaves less than
// want. A fragment of body n takes alignFrag(8+n) bytes, and the next
// fragment's stamp slot 8 more.
func (c *conn) room(want int) int {
	size := uint64(len(c.tx.data))
	free := size - (c.stail - c.shead)
	if maxBody(free) < want {
		c.shead = c.tx.head.Load()
		free = size - (c.stail - c.shead)
	}
	return maxBody(free)
}

func maxBody(free uint64) int {
	if free < fragAlign+8 {
		return 0
	}
	return int((free-8)&^(fragAlign-1)) - 8
}

// publish publishes the fragment of body n written at c.stail+8: it clears
// the next fragment's stamp slot, then stores this one's stamp.
func (c *conn) publish(n int) {
	end := c.stail + 8 + uint64(n)
	next := alignFrag(end)
	binary.LittleEndian.PutUint64(c.tx.data[next&c.tx.mask:], 0)
	c.tx.stamp(c.stail).Store(end)
	c.stail = next
	ringBell(c.peerSeg)
}

// sendStall reports a send that cannot progress until the value at watch
// (saw when last loaded) changes: it fails if the peer is gone, otherwise it
// leaves the value for Wait to compare.
func (c *conn) sendStall(saw uint64, watch *atomic.Uint64) (bool, error) {
	if err := c.t.goneErr(c.peerIdx, c.stream); err != nil {
		// An acknowledgment the peer stored before it went still counts.
		if watch == &c.swAck && c.tx.ack.Load() != saw {
			return false, nil
		}
		return false, err
	}
	if c.sidle++; c.sidle%pollEvery == 0 {
		c.t.checkPeer(c.peerIdx)
	}
	if watch.Load() != saw {
		watch.Store(saw)
	}
	return false, nil
}

// TryRecv takes as much of op from the ring as is there, at most callBytes
// per call, or copies a CMA message straight from the sender's buffer. The
// header decides where the payload goes: op.Dst[:Got.Len] (exactly op.Want.Len
// unless AnyLen), or op.Window[Got.Aux:Got.Aux+Got.Len] for a window receive
// (bounded by the window; op.Want.Len is not used). A header differing from
// op.Want, or a put outside the window, fails with fault.ErrMismatch; the
// stream is then unusable, since its framing is lost.
func (c *conn) TryRecv(op *transport.RecvOp) (bool, error) {
	if err := c.guard.Enter(c.closedErr); err != nil {
		return false, err
	}
	defer c.guard.Release()
	fresh, ok, err := c.recvSide.Claim(op, c.peer, "shm")
	if !ok {
		return false, err
	}
	if fresh {
		c.rdst = nil
		c.rcma = false
		c.rvec = false
		c.rmap = false
		c.rcur.Reset()
	}
	done, err := c.recv(op)
	if c.recvSide.Finish(done, err) {
		c.rdst = nil
		c.rsrc = nil
		if c.rw.Load() != idle {
			c.rw.Store(idle)
		}
	}
	return done, err
}

func (c *conn) recv(op *transport.RecvOp) (bool, error) {
	start := op.Progress
	if op.Progress < hdrSize {
		if more, done, err := c.recvHeader(op); !more {
			return done, err
		}
	}
	if c.rmap {
		return c.mapRecv(op)
	}
	if c.rcma {
		var done bool
		var err error
		if c.rvec {
			done, err = c.cmaRecvVec(op)
		} else {
			done, err = c.cmaRecv(op)
		}
		if done || err != nil || c.rcma {
			return done, err
		}
		// The kernel refused CMA: the sender streams the payload instead.
	}
	return c.recvRing(op, start)
}

// recvHeader takes the header of the record at the receive head and, for a
// CMA record, its descriptor (recvDesc). more reports that the payload
// comes next; otherwise recv returns done and err.
func (c *conn) recvHeader(op *transport.RecvOp) (more, done bool, err error) {
	avail := c.avail()
	if avail == 0 {
		done, err = c.recvStall()
		return false, done, err
	}
	if avail < hdrSize {
		return false, false, fault.New(fault.ErrMismatch, c.peer, "shm: stream %d from rank %d: %d-byte record", c.stream, c.peer, avail)
	}
	c.rx.get(c.rhead, op.Wire[:])
	kind := recKind(&op.Wire)
	if err := c.header(op); err != nil {
		c.rejectDesc(op, avail)
		return false, false, err
	}
	c.rhead += hdrSize
	op.Progress = hdrSize
	c.recvd.Add(hdrSize)
	if descBytes(kind) > 0 {
		return c.recvDesc(op, kind, avail)
	}
	return true, false, nil
}

// recvRing copies op's payload out of the ring, at most callBytes per call,
// freeing each fragment as it finishes it. start is op.Progress when the
// call began.
func (c *conn) recvRing(op *transport.RecvOp, start int) (bool, error) {
	moved := 0
	got := op.Progress - hdrSize
	plen := len(c.rdst)
	if op.DstVec != nil {
		plen = int(op.Want.Len)
	}
	for budget := callBytes; got < plen && budget > 0; {
		avail := c.avail()
		if avail == 0 {
			break
		}
		n := min(avail, plen-got, budget)
		c.getPayload(op, got, n)
		c.rhead += uint64(n)
		got += n
		moved += n
		budget -= n
		if c.rhead == c.rend {
			// Free the space fragment by fragment, so the sender refills
			// while we copy.
			c.release()
		}
	}
	if c.rhead != c.rend {
		c.release() // a fragment taken in part
	} else if moved == 0 && op.Progress != start {
		c.release() // a header-only record
	}
	op.Progress = hdrSize + got
	if moved > 0 {
		c.recvd.Add(uint64(moved))
	}
	if got == plen {
		op.N = got
		return true, nil
	}
	if op.Progress != start {
		return false, nil
	}
	return c.recvStall()
}

// avail returns the bytes of the current fragment not consumed yet; when it
// is used up, it moves on to the next fragment if that one is published.
func (c *conn) avail() int {
	if c.rhead == c.rend {
		slot := alignFrag(c.rend)
		end := c.rx.stamp(slot).Load()
		if end <= slot+8 {
			return 0
		}
		c.rhead, c.rend = slot+8, end
	}
	return int(c.rend - c.rhead)
}

// release gives the consumed bytes back to the sender: all of the current
// fragment once it is used up.
func (c *conn) release() {
	h := c.rhead
	if h == c.rend {
		h = alignFrag(h)
	}
	c.rx.head.Store(h)
	ringBell(c.peerSeg)
}

// recvStall reports a receive that cannot progress until the next fragment
// is published: it fails if the sender is gone and published nothing more,
// otherwise it leaves the stamp slot it waits on for Wait to check.
func (c *conn) recvStall() (bool, error) {
	slot := alignFrag(c.rend)
	if err := c.t.goneErr(c.peerIdx, c.stream); err != nil {
		// Bytes the peer published before it went are still delivered.
		if c.rx.stamp(slot).Load() > slot+8 {
			return false, nil
		}
		c.rmaps.drop() // its buffers: nothing more will come from them
		return false, err
	}
	if c.ridle++; c.ridle%pollEvery == 0 {
		c.t.checkPeer(c.peerIdx)
	}
	if c.rw.Load() != slot {
		c.rw.Store(slot)
	}
	return false, nil
}

// header decodes and checks a complete header and sets the payload
// destination.
func (c *conn) header(op *transport.RecvOp) error {
	got := &op.Got
	if err := got.Decode(op.Wire[:]); err != nil {
		return fault.Wrap(fault.ErrMismatch, c.peer, err, "shm: stream %d from rank %d", c.stream, c.peer)
	}
	if k := recKind(&op.Wire); k > recMap {
		return fault.New(fault.ErrMismatch, c.peer, "shm: stream %d from rank %d: unknown record kind %d", c.stream, c.peer, k)
	}
	dst, err := op.Land(c.peer)
	if err != nil {
		return err
	}
	c.rdst = dst
	return nil
}
