package shm

import (
	"encoding/binary"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// Mapped copies. A large message whose bytes lie in a shareable buffer of
// the sender (transport.AcquireShared: a2a.AllocBuffer memory, a memfd)
// travels as a recMap descriptor: the CMA descriptor's address, then the
// memfd's number in the sender, its generation, its size and the message's
// offset in it. The receiver maps the memfd once, read-only, and copies out
// of the mapping with plain loads (Go's copy, which streams with
// non-temporal stores from a few hundred KiB on), where CMA would call
// process_vm_readv, which pins every page it reads on every call. The
// acknowledgment is CMA's, so the mapping is read only while the sender's op
// waits for it: a sender never reuses memory a receiver is reading.
//
// Trust: the receiver takes the memfd with pidfd_getfd(2) on the pidfd it
// holds for the sender since Open (which pins the process, whatever happens
// to its pid), under the same ptrace check as process_vm_readv: a rank only
// ever maps memory of a process it could read by CMA anyway. Before mapping
// it checks that the descriptor names a memfd of a2a's shareable buffers of
// the generation the descriptor claims (its name says so), of the size
// claimed, sealed against shrinking: a replaced or truncated buffer is
// fault.ErrMismatch, never SIGBUS. When the kernel refuses pidfd_getfd
// (EPERM, ENOSYS) the receiver stops mapping for good and reads the same
// bytes by CMA from the descriptor's address; when a mapping fails for lack
// of memory or descriptors, it reads that message by CMA.
//
// Cache: each stream's receive side keeps the mappings it made, keyed by
// memfd number and generation, at most Config.MapCache of them, the least
// recently used unmapped first. A buffer's memory is released only when its
// last mapping goes, so a rank that frees a shareable buffer lists its
// generation in its segment (the last freedSlots of them, and a count), and
// a stream unmaps the listed buffers at its next mapped message (all of its
// mappings when it missed some). A descriptor naming a known memfd number
// with a new generation unmaps the old mapping too. A stream whose peer is
// lost unmaps its mappings at once, and Close unmaps every mapping; a memfd
// disappears with its last descriptor and mapping, so nothing of it
// outlives both ranks, and it never was a file in Config.Dir.

// descMapSize is the size of a recMap descriptor: address, memfd number,
// generation, memfd size, offset, id.
const descMapSize = 48

// maxMapBytes bounds the memfd size a descriptor may claim.
const maxMapBytes = 1 << 46

// mapDesc is a recMap descriptor past its address.
type mapDesc struct {
	fd        int
	gen       uint64
	size, off uint64
}

// putMapDesc encodes the descriptor of a send from sh with id into d.
func putMapDesc(d []byte, addr uint64, sh *transport.Shared, id uint64) {
	le := binary.LittleEndian
	le.PutUint64(d[0:], addr)
	le.PutUint64(d[8:], uint64(sh.FD))
	le.PutUint64(d[16:], sh.Gen)
	le.PutUint64(d[24:], uint64(sh.Size))
	le.PutUint64(d[32:], uint64(sh.Off))
	le.PutUint64(d[40:], id)
}

func getMapDesc(d []byte) mapDesc {
	le := binary.LittleEndian
	return mapDesc{fd: int(int32(le.Uint64(d[8:]))), gen: le.Uint64(d[16:]), size: le.Uint64(d[24:]), off: le.Uint64(d[32:])}
}

// mapEntry is a peer's buffer mapped here.
type mapEntry struct {
	fd   int
	gen  uint64
	mem  []byte
	used uint64 // mapCache.clock when last used
}

// mapCache is one stream's mappings of its peer's buffers; only the
// goroutine driving the stream's receives touches it.
type mapCache struct {
	ents  []mapEntry
	clock uint64
	maps  uint64 // mappings made, for tests
	freed uint64 // the peer's count of freed buffers, as last seen
}

// drop unmaps every mapping.
func (m *mapCache) drop() {
	for _, e := range m.ents {
		unix.Munmap(e.mem)
	}
	clear(m.ents)
	m.ents = m.ents[:0]
}

// remove unmaps entry i.
func (m *mapCache) remove(i int) {
	unix.Munmap(m.ents[i].mem)
	last := len(m.ents) - 1
	m.ents[i] = m.ents[last]
	m.ents[last] = mapEntry{}
	m.ents = m.ents[:last]
}

// mapSource returns the plen bytes a recMap descriptor d points at, mapped
// here, or nil when this message must be read by CMA instead.
func (c *conn) mapSource(d []byte, plen int) ([]byte, error) {
	t := c.t
	md := getMapDesc(d)
	if md.fd < 0 || md.gen == 0 || md.size == 0 || md.size > maxMapBytes || md.off > md.size || uint64(plen) > md.size-md.off {
		return nil, fault.New(fault.ErrMismatch, c.peer, "shm: stream %d from rank %d: a %d-byte message at %d of a %d-byte buffer", c.stream, c.peer, plen, md.off, md.size)
	}
	if t.mapMax <= 0 || t.mapOff.Load() {
		return nil, nil
	}
	c.syncFreed()
	m := &c.rmaps
	m.clock++
	for i := range m.ents {
		e := &m.ents[i]
		if e.fd != md.fd {
			continue
		}
		if e.gen == md.gen && uint64(len(e.mem)) == md.size {
			e.used = m.clock
			return e.mem[md.off : md.off+uint64(plen)], nil
		}
		m.remove(i) // a new buffer behind the same number: the old one is gone
		break
	}
	mem, err := c.mapPeerBuffer(md)
	if mem == nil || err != nil {
		return nil, err
	}
	if len(m.ents) >= t.mapMax {
		lru := 0
		for i := range m.ents {
			if m.ents[i].used < m.ents[lru].used {
				lru = i
			}
		}
		m.remove(lru)
	}
	m.ents = append(m.ents, mapEntry{fd: md.fd, gen: md.gen, mem: mem, used: m.clock})
	m.maps++
	return mem[md.off : md.off+uint64(plen)], nil
}

// mapPeerBuffer maps the peer's buffer md describes, read-only. It returns
// nil and no error when the message should go by CMA instead.
func (c *conn) mapPeerBuffer(md mapDesc) ([]byte, error) {
	var fd int
	var err error
	if pidfd := c.peerSeg.pidfd; pidfd >= 0 {
		fd, err = unix.PidfdGetfd(pidfd, md.fd, 0)
	} else {
		// The peer is this process (in-process ranks): the number is ours.
		fd, err = unix.FcntlInt(uintptr(md.fd), unix.F_DUPFD_CLOEXEC, 0)
	}
	if err != nil {
		return nil, c.mapErr(err, "taking")
	}
	defer unix.Close(fd)
	link, err := readlinkFD(fd)
	if err != nil || !transport.IsSharedName(link, md.gen) {
		return nil, fault.New(fault.ErrMismatch, c.peer, "shm: rank %d's descriptor %d names %q, not its shared buffer of generation %d (%v)", c.peer, md.fd, link, md.gen, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, c.mapErr(err, "inspecting")
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 || uint64(st.Size) != md.size {
		return nil, fault.New(fault.ErrMismatch, c.peer, "shm: rank %d's shared buffer of generation %d holds %d bytes (seals %#x), its descriptor says %d", c.peer, md.gen, st.Size, seals, md.size)
	}
	mem, err := unix.Mmap(fd, 0, int(md.size), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, c.mapErr(err, "mapping")
	}
	return mem, nil
}

// mapErr decides what a failure to map the peer's buffer means: the peer
// went (fault.ErrPeerLost), the kernel forbids taking its descriptors
// (mapping off for good, nil: read by CMA), or a passing shortage (nil:
// this message by CMA).
func (c *conn) mapErr(err error, what string) error {
	t := c.t
	switch {
	case err == unix.ESRCH:
		return fault.Wrap(fault.ErrPeerLost, c.peer, err, "shm: rank %d (pid %d) exited (stream %d)", c.peer, c.peerSeg.pid, c.stream)
	case err == unix.EBADF:
		return fault.Wrap(fault.ErrMismatch, c.peer, err, "shm: rank %d sent a descriptor of a buffer it does not hold (stream %d)", c.peer, c.stream)
	case fault.LocalResource(err) != "":
		t.log.Debug("shm: mapping a peer's buffer failed, reading it by CMA", "rank", t.rank, "peer", c.peer, "err", err)
		return nil
	}
	if t.mapOff.CompareAndSwap(false, true) {
		t.log.Info("shm: mapping peers' buffers refused, reading them by CMA from now on", "rank", t.rank, "peer", c.peer, "step", what, "err", err)
	}
	return nil
}

// readlinkFD reads the /proc link of this process's descriptor fd.
func readlinkFD(fd int) (string, error) {
	var b [128]byte
	n, err := unix.Readlink("/proc/self/fd/"+strconv.Itoa(fd), b[:])
	if err != nil {
		return "", err
	}
	return string(b[:n]), nil
}

// Copy pieces. Go's copy streams with non-temporal stores from 1 MiB on,
// which bypasses the caches: right for data that does not fit them, 2x
// slower for data that does (one thread on the 2-core EPYC VM, 4 MiB: 23
// GB/s in one copy, 43 GB/s in 512 KiB pieces; 16 MiB: 17 against 9 GB/s).
// A message up to cachedCopyMax, which with its destination and the other
// rank's pair fits the 32 MiB L3, is copied in mapPiece pieces and stays in
// the cache for whoever reads it next; a larger one in one copy.
const (
	mapPiece      = 256 << 10
	cachedCopyMax = 8 << 20
)

// copyCached copies src to dst (of equal length) as the policy above says.
func copyCached(dst, src []byte) {
	if len(src) > cachedCopyMax {
		copy(dst, src)
		return
	}
	for off := 0; off < len(src); off += mapPiece {
		end := min(off+mapPiece, len(src))
		copy(dst[off:end], src[off:end])
	}
}

// mapRecv copies the payload of a recMap descriptor out of the mapping of
// the sender's buffer, at most cmaCallBytes per call, or has op.Combine
// reduce it from there.
func (c *conn) mapRecv(op *transport.RecvOp) (bool, error) {
	got := op.Progress - hdrSize
	plen := len(c.rsrc)
	n := min(plen-got, cmaCallBytes)
	if plen > cachedCopyMax {
		n = min(plen-got, cachedCopyMax) // whole copies, to stream past the caches
	}
	switch {
	case op.Combine != nil && op.DstVec == nil && op.Window == nil:
		// The reduction reads the mapping in place: no copy to Dst. n is
		// a multiple of transport.CombinePiece but at the end.
		if err := op.Combine.Combine(op.CombineID, got, c.rsrc[got:got+n]); err != nil {
			return false, err
		}
		op.Combined = true
	case op.DstVec == nil:
		copyCached(c.rdst[got:got+n], c.rsrc[got:got+n])
	default:
		for p, left := got, n; left > 0; {
			b := c.rcur.Piece(op.DstVec, left)
			copyCached(b, c.rsrc[p:p+len(b)])
			c.rcur.Advance(op.DstVec, len(b))
			p, left = p+len(b), left-len(b)
		}
	}
	got += n
	op.Progress += n
	if got < plen {
		return false, nil
	}
	// A sender that died meanwhile fails the message as CMA would
	// (ESRCH), though its memory outlives it here: its op never completes.
	if c.t.dead[c.peerIdx].Load() {
		c.rmaps.drop()
		return false, c.t.goneErr(c.peerIdx, c.stream)
	}
	c.rmapped++
	return c.cmaDone(op, got)
}

// freedSlots is how many of the last freed generations a segment lists.
const freedSlots = 32

// freedGen is slot i of seg's list of freed generations.
func freedGen(seg *segment, i uint64) *atomic.Uint64 {
	return u64at(seg.mem, offFreedGen+8*int(i%freedSlots))
}

// publishFreed lists gen, a shareable buffer this process freed, in this
// rank's segment, for the peers that mapped it to unmap it (syncFreed):
// its memory is released only when the last mapping goes.
func (t *Transport) publishFreed(gen uint64) {
	if !t.guard.Acquire() {
		return
	}
	defer t.guard.Release()
	t.freeMu.Lock()
	n := t.own.freed.Load()
	freedGen(t.own, n).Store(gen)
	t.own.freed.Store(n + 1)
	t.freeMu.Unlock()
}

// syncFreed unmaps the mappings of buffers the peer freed since the last
// call: those its segment lists, or all of them when more were freed than
// it lists.
func (c *conn) syncFreed() {
	m := &c.rmaps
	seg := c.peerSeg
	n := seg.freed.Load()
	if n == m.freed {
		return
	}
	if n-m.freed <= freedSlots {
		for i := m.freed; i < n; i++ {
			gen := freedGen(seg, i).Load()
			for k := 0; k < len(m.ents); k++ {
				if m.ents[k].gen == gen {
					m.remove(k)
					k--
				}
			}
		}
	}
	// Slots overwritten before or while we read them: drop everything.
	if seg.freed.Load()-m.freed > freedSlots {
		m.drop()
	}
	m.freed = n
}
