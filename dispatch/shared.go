package dispatch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a"
)

// Shared memory: between ranks of one host, the receive and output buffers
// of a handle live in memfd segments that the other ranks of the host map,
// and rows between them skip the AllToAllV:
//
//   - Dispatch packs each row straight into the receive buffer of the rank
//     hosting its expert: one copy instead of a pack and the exchange's copy.
//     After the counts, a small exchange of segment descriptors says where
//     each sender's block goes; the AllToAllV for the other hosts (every
//     pair exchanges a message in it), or a barrier on one host, says "all
//     rows written".
//   - Combine reads the expert outputs for its tokens where the experts wrote
//     them. The reverse AllToAllV's copy of those rows becomes an exchange of
//     descriptors (which also says "outputs ready").
//
// Ordering rules: a rank maps a peer's segment only while that peer is
// still inside the same operation (the operation ends with a collective
// every rank joins after mapping), and nothing writes to a segment before
// the descriptor exchange of a later dispatch, which every rank joins only
// after it has finished reading. A memfd is freed by the kernel when its
// last descriptor and mapping go, so a killed rank leaves nothing in
// /dev/shm.

// segment is memory the other ranks of the host can map: a memfd kept open,
// so that a peer opens it as /proc/<pid>/fd/<fd>.
type segment struct {
	fd  int
	gen uint64 // unique among this dispatcher's segments: tells peers a new segment from an old one at the same fd
	mem []byte
}

// segmentName names the memfds (as /proc shows them: "/memfd:a2a-dispatch (deleted)").
const segmentName = "a2a-dispatch"

// segmentAlign is what sharedBuffer rounds the sizes of the buffers it grows
// to, so that growing steps do not remap every time.
const segmentAlign = 2 << 20

// newSegment creates a segment of size bytes, rounded up to whole pages (what
// the mapping takes anyway): the caller decides how much room to leave for
// growth, so that a small segment such as New's probe costs one page.
func newSegment(size int, gen uint64) (*segment, error) {
	return newSegmentFlags(size, gen, unix.MAP_POPULATE)
}

// newSegmentFlags is newSegment with the mapping's extra flags: the decode
// mode's worst-case buffers (decode.go) leave out MAP_POPULATE, so that only
// the pages the steps write are ever allocated.
func newSegmentFlags(size int, gen uint64, flags int) (*segment, error) {
	size = alignUp(max(size, 1), os.Getpagesize())
	fd, err := unix.MemfdCreate(segmentName, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ftruncate memfd to %d bytes: %w", size, err)
	}
	// Populated now: the pages are touched by the first step anyway, and
	// faulting shared pages in one at a time is slower than this.
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|flags)
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
	return mapPeerFlags(pid, fd, size, unix.MAP_POPULATE)
}

// mapPeerFlags is mapPeer with the mapping's extra flags (see newSegmentFlags).
func mapPeerFlags(pid, fd, size, flags int) ([]byte, error) {
	path := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
	// Only ever a dispatcher's memfd: a corrupt descriptor must not get rows
	// written into some other file the peer has open.
	if link, err := os.Readlink(path); err != nil || !strings.HasPrefix(link, "/memfd:"+segmentName+" ") {
		return nil, fmt.Errorf("%s is %q, not a dispatcher segment (%v)", path, link, err)
	}
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
	mem, err := unix.Mmap(f, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|flags)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	return mem, nil
}

// probeShared decides, collectively, which pairs of ranks move rows through
// shared memory: two ranks of one host that both want it (RowsAuto, not
// A2A_TRANSPORT=tcp) and could each map a probe segment of the other and read
// back what it wrote there. The probe's two small collectives run when some
// host holds two ranks (every rank knows that alike); d.sharedWith, d.shared
// and d.exchange then come out the same on every rank.
func (d *Dispatcher) probeShared(ctx context.Context) error {
	P, me := d.size, d.rank
	// Once here rather than in every step's descriptors: os.Getpid is a
	// system call.
	d.pid = os.Getpid()
	canMap := make([]byte, P*P) // canMap[i*P+j] = 1: rank i mapped rank j's probe
	if some, mine := colocation(d.comm, me); some {
		if err := d.probe(ctx, canMap, mine); err != nil {
			return err
		}
	}
	d.sharedWith = make([]bool, P)
	for i := range P {
		for j := range P {
			if i == j {
				continue
			}
			// A rank only maps the probes of its own host's ranks: no
			// need to compare hosts again.
			ok := canMap[i*P+j] == 1 && canMap[j*P+i] == 1
			if i == me {
				d.sharedWith[j] = ok
				d.hostPeers = d.hostPeers || ok
			}
			d.shared = d.shared || ok
			d.exchange = d.exchange || !ok
		}
	}
	return nil
}

// probe fills canMap (P*P) with every rank's view: whether it could map the
// probe segment of each same-host rank and read back that rank's token.
// colocated says whether another rank shares this rank's host.
func (d *Dispatcher) probe(ctx context.Context, canMap []byte, colocated bool) error {
	c, P, me := d.comm, d.size, d.rank
	willing := colocated && d.cfg.Rows == RowsAuto && hostPeersMapMemory(c, me)
	send, recv := make([]byte, descriptorBytes*P), make([]byte, descriptorBytes*P)
	var probe *segment
	if willing {
		var err error
		if probe, err = newSegment(8, 0); err != nil { // room for the token
			d.log.Info("dispatch: shared memory unavailable", "rank", me, "err", err)
			willing = false
		}
	}
	defer probe.free()
	// The token a peer must read back: this rank and process, so that a
	// stale or foreign descriptor cannot pass.
	if willing {
		binary.LittleEndian.PutUint64(probe.mem, uint64(d.pid)<<16|uint64(me))
		for j := range P {
			if j != me && c.Host(j) == c.Host(me) {
				descriptor{pid: d.pid, fd: probe.fd, size: len(probe.mem), off: 0, len: 8}.put(send[descriptorBytes*j:])
			}
		}
	}
	if err := c.AllToAll(ctx, send, recv); err != nil {
		return err
	}
	mine := make([]byte, P)
	for j := range P {
		if j == me || c.Host(j) != c.Host(me) || !willing {
			continue
		}
		desc := getDescriptor(recv[descriptorBytes*j:])
		if desc.pid == 0 {
			continue // that rank does not want it
		}
		mem, err := mapPeer(desc.pid, desc.fd, desc.size)
		if err != nil {
			d.log.Info("dispatch: shared memory unavailable", "rank", me, "peer", j, "err", err)
			continue
		}
		got, want := binary.LittleEndian.Uint64(mem), uint64(desc.pid)<<16|uint64(j)
		unix.Munmap(mem)
		if got != want {
			d.log.Info("dispatch: shared memory unavailable", "rank", me, "peer", j,
				"err", fmt.Sprintf("read %#x from its probe segment, want %#x", got, want))
			continue
		}
		mine[j] = 1
	}
	return c.AllGather(ctx, mine, canMap)
}

// hostPeersMapMemory reports whether the data plane links this rank (me)
// with every other rank of its host through links that map memory
// (transport.Capabilities.MapsMemory). Rows go through shared memory only
// where the data plane does: a network transport forced between the ranks
// of a host (A2A_TRANSPORT=tcp or verbs) means the bytes must cross it.
func hostPeersMapMemory(c *a2a.Comm, me int) bool {
	for j := range c.Size() {
		if j != me && c.Host(j) == c.Host(me) && !c.PeerCapabilities(j).MapsMemory {
			return false
		}
	}
	return true
}

// colocation reports whether some host holds two ranks of c's group (the
// same on every rank) and whether rank me's host does.
func colocation(c *a2a.Comm, me int) (some, mine bool) {
	ranks := make(map[int]int, c.Size()) // per host
	for r := range c.Size() {
		ranks[c.Host(r)]++
	}
	for _, n := range ranks {
		some = some || n > 1
	}
	return some, ranks[c.Host(me)] > 1
}

// ErrSharedMemory is wrapped by the errors of creating this rank's shared
// buffers or mapping a peer's (with the system's error, e.g. unix.ENOMEM).
var ErrSharedMemory = errors.New("dispatch: shared memory")

// readShared makes the expert outputs of every shared-memory peer readable
// in place: it tells each such rank where its rows' outputs are in this
// rank's segment, learns the same from them, and maps what is not mapped yet.
// Afterwards the row peer j's expert computed for this rank's slot at send
// offset off is h.rowSrc[j][off-h.rowDelta[j]:]. The exchange also says
// "outputs ready": a rank sends its descriptors once its experts are done.
func (h *Handle) readShared() error {
	d := h.d
	if !d.hostPeers {
		return h.exchangeDescriptors("outputs", d.hdr) // nothing to offer or read: just take part
	}
	seg, base, ok := h.outputSegment()
	if !ok && len(h.expertOut) == 0 {
		seg, base, ok = h.recvSeg, 0, true // no rows: nothing to point at, any segment will do
	}
	if !ok {
		// Outputs computed somewhere else: bring them where peers can read them.
		out, err := h.sharedBuffer(&h.outSeg, len(h.recv), 0)
		if err != nil {
			return h.sharedFailure(err)
		}
		copy(out, h.expertOut)
		h.expertOut, h.output = out, out
		seg, base = h.outSeg, 0
	}
	h.putDescriptors(seg, func(i int) (int, int) {
		return base + h.recvDispl[i] + d.hdrSelf, h.recvCounts[i] - d.hdrSelf
	})
	if err := h.exchangeDescriptors("outputs", d.hdr); err != nil {
		return err
	}
	h.observeShared(true)
	return nil
}

// packShared packs the rows: straight into the receive buffers of
// shared-memory peers, whose descriptors say where each sender's block goes,
// and into the send buffer for the others. Without an AllToAllV to follow (a
// group on one host), a barrier then says that all rows are in place.
func (h *Handle) packShared() error {
	seg := h.recvSeg
	if h.d.fp8 {
		seg = h.wireSeg // peers write wire rows, which unwire converts here
	}
	h.putDescriptors(seg, func(i int) (int, int) { return h.wireBytes(h.recvDispl[i]), h.wireBytes(h.recvCounts[i]) })
	if err := h.exchangeDescriptors("receive buffer", nil); err != nil {
		return err
	}
	if err := h.pack(); err != nil { // quantized before: cannot fail
		return err
	}
	h.observeShared(false)
	return h.sharedStepDone()
}

// sharedStepDone tells every rank that the others are done with this step's
// shared memory (rows written, or segments mapped): the AllToAllV that
// follows says it when there is one (every pair exchanges a message in it),
// else a barrier.
func (h *Handle) sharedStepDone() error {
	if h.d.exchange {
		return nil
	}
	return h.d.comm.Barrier(h.ctx)
}

// observeShared reports to a SharedTrafficObserver the bytes this rank gave
// its shared-memory peers and got from them: rows in a dispatch, expert
// outputs (without the CountsNATS headers) in a combine.
func (h *Handle) observeShared(combine bool) {
	d := h.d
	o, ok := d.cfg.Observer.(SharedTrafficObserver)
	if !ok {
		return
	}
	byPeer, _ := o.(SharedPeerObserver)
	var sent, received int64
	for j, shared := range d.sharedWith {
		if !shared {
			continue
		}
		var s, r int64
		if combine {
			s, r = int64(h.recvCounts[j]-d.hdrSelf), int64(h.sendCounts[j]-d.hdr[j])
		} else {
			s, r = int64(h.wireBytes(h.sendCounts[j])), int64(h.wireBytes(h.recvCounts[j]))
		}
		sent, received = sent+s, received+r
		if byPeer != nil {
			byPeer.ObserveSharedPeer(j, s, r)
		}
	}
	o.ObserveSharedTraffic(sent, received)
}

// putDescriptors fills h.descOut: for each shared-memory peer i, the span
// block(i) of seg; for the others, nothing.
func (h *Handle) putDescriptors(seg *segment, block func(i int) (off, n int)) {
	d := h.d
	clear(h.descOut)
	for i := range d.size {
		if d.sharedWith[i] {
			off, n := block(i)
			descriptor{pid: d.pid, fd: seg.fd, gen: seg.gen, size: len(seg.mem), off: off, len: n}.put(h.descOut[descriptorBytes*i:])
		}
	}
}

// exchangeDescriptors sends h.descOut, receives every shared-memory peer's
// descriptor for this rank and maps what it points at: the block of the
// send layout for peer j, after its first skip[j] bytes (none if skip is
// nil), is then rowSrc[j][pos-rowDelta[j]]. Dispatch passes nil: the
// receivers offer room for wire rows (wireBytes of the DType layout).
// Combine passes d.hdr, never nil: the outputs are in DType.
func (h *Handle) exchangeDescriptors(what string, skip []int) error {
	d := h.d
	if err := d.comm.AllToAll(h.ctx, h.descOut, h.descIn); err != nil {
		return err
	}
	d.views.clock++
	for j := range d.size {
		if !d.sharedWith[j] {
			continue
		}
		desc := getDescriptor(h.descIn[descriptorBytes*j:])
		// The dispatch's descriptors (skip nil) point at wire rows.
		want := h.wireBytes(h.sendCounts[j])
		head := 0
		if skip != nil {
			head = skip[j]
			want = h.sendCounts[j] - head
		}
		if desc.len != want {
			return h.sharedFailure(h.mismatch(j, "offers %d bytes of %s for this rank's %d bytes", desc.len, what, want))
		}
		rows, err := d.views.rows(j, desc)
		if err != nil {
			return h.sharedFailure(fmt.Errorf("%w: rank %d's %s: %w", ErrSharedMemory, j, what, err))
		}
		h.rowSrc[j], h.rowDelta[j] = rows, h.sendDispl[j]+head
	}
	d.views.evict()
	return nil
}

// sharedFailure aborts the Comm: the other ranks are already writing to or
// reading from this rank's memory, or waiting for this rank's rows, and
// without its part the step cannot complete anywhere. They fail with
// ErrAborted instead of waiting for their deadline.
func (h *Handle) sharedFailure(err error) error {
	h.d.comm.Abort(err)
	return err
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
// (and keeping its first keep bytes) if it is too small. A new segment gets
// a quarter more than n, rounded up to segmentAlign, so that the steps that
// follow, which usually differ a little, fit in it.
func (h *Handle) sharedBuffer(seg **segment, n, keep int) ([]byte, error) {
	if s := *seg; s != nil && len(s.mem) >= n {
		return s.mem[:n], nil
	}
	s, err := newSegment(alignUp(max(n+n/4, 1), segmentAlign), h.d.segGen.Add(1))
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
