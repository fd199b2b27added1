package dispatch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"a2a/a2a"
)

// Shared memory: when every rank of the group is on one host, the receive
// and output buffers of a handle live in memfd segments that the other ranks
// map, and neither direction runs an AllToAllV:
//
//   - Dispatch packs each row straight into the receive buffer of the rank
//     hosting its expert: one copy instead of a pack and the exchange's copy.
//     After the counts, a small exchange of segment descriptors says where
//     each sender's block goes, and a barrier says "all rows written".
//   - Combine reads the expert outputs for its tokens where the experts wrote
//     them. The reverse AllToAllV, a full copy of every output row, becomes
//     one exchange of descriptors (which also says "outputs ready") and a
//     barrier ("done reading": the experts may overwrite them).
//
// A memfd is freed by the kernel when its last descriptor and mapping go, so
// a killed rank leaves nothing in /dev/shm.

// segment is memory the other ranks of the host can map: a memfd kept open,
// so that a peer opens it as /proc/<pid>/fd/<fd>.
type segment struct {
	fd  int
	gen uint64 // unique among this dispatcher's segments: tells peers a new segment from an old one at the same fd
	mem []byte
}

// segmentAlign rounds segment sizes so that growing steps do not remap every
// time.
const segmentAlign = 2 << 20

func newSegment(size int, gen uint64) (*segment, error) {
	size = alignUp(max(size, 1), segmentAlign)
	fd, err := unix.MemfdCreate("a2a-dispatch", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ftruncate memfd to %d bytes: %w", size, err)
	}
	// Populated now: the pages are touched by the first step anyway, and
	// faulting shared pages in one at a time is slower than this.
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mmap memfd of %d bytes: %w", size, err)
	}
	return &segment{fd: fd, gen: gen, mem: mem}, nil
}

func (s *segment) free() {
	if s == nil {
		return
	}
	unix.Munmap(s.mem)
	unix.Close(s.fd)
}

// contains reports whether b lies inside the segment, and at which offset.
func (s *segment) contains(b []byte) (int, bool) {
	if s == nil || len(b) == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(s.mem)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < base || p+uintptr(len(b)) > base+uintptr(len(s.mem)) {
		return 0, false
	}
	return int(p - base), true
}

// descriptor tells a peer where its rows are in this rank's memory.
type descriptor struct {
	pid, fd  int
	gen      uint64
	size     int // of the whole segment
	off, len int // of the peer's rows
}

const descriptorBytes = 48

func (d descriptor) put(b []byte) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], uint64(d.pid))
	le.PutUint64(b[8:], uint64(d.fd))
	le.PutUint64(b[16:], d.gen)
	le.PutUint64(b[24:], uint64(d.size))
	le.PutUint64(b[32:], uint64(d.off))
	le.PutUint64(b[40:], uint64(d.len))
}

func getDescriptor(b []byte) descriptor {
	le := binary.LittleEndian
	return descriptor{
		pid: int(le.Uint64(b[0:])), fd: int(le.Uint64(b[8:])), gen: le.Uint64(b[16:]),
		size: int(le.Uint64(b[24:])), off: int(le.Uint64(b[32:])), len: int(le.Uint64(b[40:])),
	}
}

// peerView is a peer's segment mapped here (read-write: dispatch writes rows
// into peers' receive buffers).
type peerView struct {
	fd   int
	gen  uint64
	mem  []byte
	used uint64 // the descriptor exchange that last pointed at it
}

// views caches the peers' segments this rank has mapped, so that a step
// maps nothing once warm. A peer replaces a segment when a step outgrows it;
// the old mapping keeps the old memfd alive until it is evicted.
type views struct {
	byPeer [][]peerView
	clock  uint64 // counts descriptor exchanges
}

// viewIdle is how many descriptor exchanges may pass without one pointing at
// a mapping before it is unmapped (more than any pipeline keeps handles in
// flight uses).
const viewIdle = 64

// rows returns the part of peer's segment that desc points at, mapping the
// segment if this is the first time it is seen.
func (v *views) rows(peer int, desc descriptor) ([]byte, error) {
	if desc.off < 0 || desc.len < 0 || desc.off+desc.len > desc.size {
		return nil, fmt.Errorf("rows [%d, +%d) outside its %d-byte segment", desc.off, desc.len, desc.size)
	}
	list := v.byPeer[peer]
	for i := range list {
		pv := &list[i]
		if pv.fd != desc.fd {
			continue
		}
		if pv.gen == desc.gen && len(pv.mem) == desc.size {
			pv.used = v.clock
			return pv.mem[desc.off : desc.off+desc.len], nil
		}
		// The peer replaced the segment at this fd.
		unix.Munmap(pv.mem)
		list[i] = list[len(list)-1]
		list = list[:len(list)-1]
		break
	}
	mem, err := mapPeer(desc.pid, desc.fd, desc.size)
	if err != nil {
		v.byPeer[peer] = list
		return nil, err
	}
	v.byPeer[peer] = append(list, peerView{fd: desc.fd, gen: desc.gen, mem: mem, used: v.clock})
	return mem[desc.off : desc.off+desc.len], nil
}

// evict unmaps the views no descriptor pointed at for viewIdle exchanges.
func (v *views) evict() {
	for p, list := range v.byPeer {
		kept := list[:0]
		for _, pv := range list {
			if v.clock-pv.used > viewIdle {
				unix.Munmap(pv.mem)
				continue
			}
			kept = append(kept, pv)
		}
		clear(list[len(kept):])
		v.byPeer[p] = kept
	}
}

func (v *views) close() {
	for p, list := range v.byPeer {
		for _, pv := range list {
			unix.Munmap(pv.mem)
		}
		v.byPeer[p] = nil
	}
}

// mapPeer maps size bytes of the memfd a process on this host holds open at
// fd.
func mapPeer(pid, fd, size int) ([]byte, error) {
	path := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
	f, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(f)
	var st unix.Stat_t
	if err := unix.Fstat(f, &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Size != int64(size) {
		return nil, fmt.Errorf("%s holds %d bytes, the descriptor says %d", path, st.Size, size)
	}
	mem, err := unix.Mmap(f, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	return mem, nil
}

// probeShared decides, collectively, whether this layer uses shared memory:
// only if every rank is on one host, wants them, and could map a probe
// segment of every other rank and read back what that rank wrote there. Two
// small collectives, run only when the group is on one host (every rank
// knows that alike), so all ranks take the same path.
func (d *Dispatcher) probeShared(ctx context.Context) (bool, error) {
	c, P := d.comm, d.size
	for r := range P {
		if c.Host(r) != c.Host(0) {
			return false, nil
		}
	}
	willing := d.cfg.Rows == RowsAuto && c.Config().Transport != "tcp"
	if P == 1 {
		return willing, nil // no peer to map
	}
	send, recv := make([]byte, descriptorBytes*P), make([]byte, descriptorBytes*P)
	var probe *segment
	if willing {
		var err error
		if probe, err = newSegment(1, 0); err != nil {
			d.log.Info("dispatch: shared memory unavailable", "rank", d.rank, "err", err)
			willing = false
		}
	}
	defer probe.free()
	// The token a peer must read back: this rank and process, so that a
	// stale or foreign descriptor cannot pass.
	token := uint64(os.Getpid())<<16 | uint64(d.rank)
	if willing {
		binary.LittleEndian.PutUint64(probe.mem, token)
		for j := range P {
			descriptor{pid: os.Getpid(), fd: probe.fd, size: len(probe.mem), off: 0, len: 8}.put(send[descriptorBytes*j:])
		}
	}
	if err := c.AllToAll(ctx, send, recv); err != nil {
		return false, err
	}
	ok := willing
	var probeErr error
	for j := range P {
		if j == d.rank || !ok {
			continue
		}
		desc := getDescriptor(recv[descriptorBytes*j:])
		if desc.pid == 0 {
			ok = false // that rank does not want them
			break
		}
		mem, err := mapPeer(desc.pid, desc.fd, desc.size)
		if err != nil {
			ok, probeErr = false, fmt.Errorf("rank %d: %w", j, err)
			break
		}
		want := uint64(desc.pid)<<16 | uint64(j)
		got := binary.LittleEndian.Uint64(mem)
		unix.Munmap(mem)
		if got != want {
			ok, probeErr = false, fmt.Errorf("rank %d: read %#x from its segment, want %#x", j, got, want)
			break
		}
	}
	if probeErr != nil {
		d.log.Info("dispatch: shared memory unavailable", "rank", d.rank, "err", probeErr)
	}
	mine, all := []byte{0}, make([]byte, P)
	if ok {
		mine[0] = 1
	}
	if err := c.AllGather(ctx, mine, all); err != nil {
		return false, err
	}
	for _, v := range all {
		if v == 0 {
			return false, nil
		}
	}
	return true, nil
}

// ErrSharedMemory is wrapped by the errors of creating this rank's shared
// buffers or mapping a peer's (with the system's error, e.g. unix.ENOMEM).
var ErrSharedMemory = errors.New("dispatch: shared memory")

// readShared makes the expert outputs of every peer readable in place: it
// tells each rank where its rows' outputs are in this rank's segment, learns
// the same from every rank, and maps what is not mapped yet. Afterwards the
// row a peer's expert computed for this rank's slot at send offset off is
// h.rowSrc[j][off-h.rowDelta[j]:].
func (h *Handle) readShared() error {
	d := h.d
	P, me := d.size, d.rank
	seg, base, ok := h.outputSegment()
	if !ok && len(h.expertOut) == 0 {
		seg, base, ok = h.recvSeg, 0, true // no rows: nothing to point at, any segment will do
	}
	if !ok {
		// Outputs computed somewhere else: bring them where peers can read them.
		out, err := h.sharedBuffer(&h.outSeg, len(h.recv), 0)
		if err != nil {
			return err
		}
		copy(out, h.expertOut)
		h.expertOut, h.output = out, out
		seg, base = h.outSeg, 0
	}
	pid := os.Getpid()
	for i := range P {
		if i == me {
			continue
		}
		descriptor{pid: pid, fd: seg.fd, gen: seg.gen, size: len(seg.mem),
			off: base + h.recvDispl[i] + d.hdrSelf, len: h.recvCounts[i] - d.hdrSelf}.put(h.descOut[descriptorBytes*i:])
	}
	return h.exchangeDescriptors("outputs", d.hdr)
}

// exchangeDescriptors sends h.descOut, receives every peer's descriptor for
// this rank and maps what they point at: the block of the send layout for
// peer j, after its first skip[j] bytes, is then rowSrc[j][pos-rowDelta[j]].
func (h *Handle) exchangeDescriptors(what string, skip []int) error {
	d := h.d
	if err := d.comm.AllToAll(h.ctx, h.descOut, h.descIn); err != nil {
		return err
	}
	d.views.clock++
	for j := range d.size {
		if j == d.rank {
			continue
		}
		desc := getDescriptor(h.descIn[descriptorBytes*j:])
		if want := h.sendCounts[j] - skip[j]; desc.len != want {
			return h.mismatch(j, "offers %d bytes of %s for this rank's %d bytes", desc.len, what, want)
		}
		rows, err := d.views.rows(j, desc)
		if err != nil {
			return fmt.Errorf("%w: rank %d's %s: %w", ErrSharedMemory, j, what, err)
		}
		h.rowSrc[j], h.rowDelta[j] = rows, h.sendDispl[j]+skip[j]
	}
	d.views.evict()
	return nil
}

// packShared packs the rows straight into the receivers' receive buffers:
// each rank tells every sender where its block goes, every sender packs, and
// a barrier says that all rows are in place. A rank that cannot write still
// joins the barrier, so that the others finish.
func (h *Handle) packShared() error {
	d := h.d
	pid := os.Getpid()
	seg := h.recvSeg
	for i := range d.size {
		if i == d.rank {
			continue
		}
		descriptor{pid: pid, fd: seg.fd, gen: seg.gen, size: len(seg.mem),
			off: h.recvDispl[i], len: h.recvCounts[i]}.put(h.descOut[descriptorBytes*i:])
	}
	err := h.exchangeDescriptors("receive buffer", h.noSkip())
	if err != nil && !errors.Is(err, ErrSharedMemory) && !errors.Is(err, a2a.ErrMismatch) {
		return err // the exchange itself failed: no barrier to join
	}
	if err == nil {
		h.pack()
	}
	return errors.Join(err, d.comm.Barrier(h.ctx))
}

// noSkip is a zero per-peer skip for exchangeDescriptors.
func (h *Handle) noSkip() []int {
	h.zeros = growInts(h.zeros, h.d.size)
	clear(h.zeros)
	return h.zeros
}

// outputSegment finds the segment holding h.expertOut (h.Recv() or
// h.Output(), both shared) and the offset of expertOut in it.
func (h *Handle) outputSegment() (*segment, int, bool) {
	for _, s := range []*segment{h.outSeg, h.recvSeg} {
		if off, ok := s.contains(h.expertOut); ok {
			return s, off, true
		}
	}
	return nil, 0, false
}

// sharedBuffer returns a buffer of n bytes in *seg, replacing the segment
// (and keeping its first keep bytes) if it is too small.
func (h *Handle) sharedBuffer(seg **segment, n, keep int) ([]byte, error) {
	if s := *seg; s != nil && len(s.mem) >= n {
		return s.mem[:n], nil
	}
	s, err := newSegment(n+n/4, h.d.segGen.Add(1))
	if err != nil {
		return nil, fmt.Errorf("%w: buffer of %d bytes: %w", ErrSharedMemory, n, err)
	}
	if old := *seg; old != nil {
		copy(s.mem, old.mem[:keep])
		old.free()
	}
	*seg = s
	return s.mem[:n], nil
}
