package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// Transport is one rank's shared-memory streams to the other local ranks. It
// implements transport.Transport, and transport.Slots (slots.go). Its conns
// may be driven from any goroutines (one per direction per conn at a time);
// Wait is meant for the progress goroutine that drives them.
type Transport struct {
	cfg      Config
	rank     int
	size     int
	streams  int
	pid      int
	me       int   // this rank's index in cfg.Local
	localIdx []int // by world rank: index in cfg.Local, or -1
	zthresh  int   // messages of at least this many bytes go by CMA; <= 0 never
	zvec     int   // gather-sends go by CMA when their slices average this many bytes
	mapMax   int   // mappings of a peer's buffers a stream keeps; <= 0: no mapped copies

	path   string // own segment file
	linked bool   // path still names the segment
	own    *segment
	segs   []*segment // by local index; segs[me] == own
	dead   []atomic.Bool
	pollMu sync.Mutex // serializes pidfd polls (their PollFd is shared)

	conns []*conn     // by peer*streams + stream; nil for this rank and remote ranks
	list  []*conn     // the non-nil conns
	stats []peerStats // by local index

	ll     []llPeer // LL state by local index (slots.go); nil when cfg.SlotBytes is 0
	window []uint64 // this rank's LL window: the slots its peers store into
	slots  transport.SlotWindow

	cmaRecv bool        // this process may read peers' memory with process_vm_readv
	cmaOff  atomic.Bool // CMA failed at run time: off for good
	// shared: communicators share the Conns (transport.Demux), so an LL
	// load no longer reads stream 0 for a frame (ShareConns).
	shared   atomic.Bool
	mapOff   atomic.Bool // the kernel refused to share a peer's buffer: off for good
	freeMu   sync.Mutex  // serializes publishFreed
	unwatch  func()      // stops publishFreed
	seenBell atomic.Uint32
	guard    transport.Guard // protects the mappings for Wait and Wake
	log      *slog.Logger

	// Rebalance's view: the CPUs this process may use (as at Open) and
	// scratch counts of local ranks by CPU.
	cpus   []int
	perCPU []int

	// An LL batch (BeginBatch): the goroutine making it owns these.
	batch    bool
	bellsDue bool          // some llPeer.bellDue is set
	fence    atomic.Uint32 // the target of ringDue's locked instruction

	closedErr error
	closeOnce sync.Once
	closeErr  error
}

var (
	_ transport.Transport = (*Transport)(nil)
	_ transport.Slots     = (*Transport)(nil)
)

// peerStats are the byte counters of one peer. The send and receive
// directions may run on different goroutines, and in-process ranks allocate
// theirs side by side: each counter gets its own cache lines.
type peerStats struct {
	sent  atomic.Uint64
	_     [lineSize - 8]byte
	recvd atomic.Uint64
	_     [lineSize - 8]byte
	// LL words: Stores add to llSent, Loads to llRecvd, one goroutine each.
	llSent, llRecvd counter
	_               [lineSize - 16]byte
}

// counter is a byte count with one writer and any number of readers. The
// writer adds with a plain store, not a locked add: after a Store to a peer's
// slot, a locked instruction would wait for the peer's cache line to arrive.
type counter struct{ n uint64 }

func (c *counter) add(n uint64) { storeRelease(&c.n, c.n+n) }
func (c *counter) load() uint64 { return atomic.LoadUint64(&c.n) }

// Open creates this rank's segment, maps the segment of every other local rank
// (retrying until it exists, since ranks start in any order), waits until
// every local rank mapped this rank's segment, and unlinks its file. Errors:
// fault.ErrTimeout (fault.ErrAborted if ctx is cancelled) when ctx ends first,
// naming the lowest local rank missing; fault.ErrMismatch when a peer's
// segment disagrees on the configuration; fault.ErrPeerLost when a peer
// exits or closes during Open; fault.ErrInvalidArgument for a bad Config or
// an unusable Dir. A failed Open leaves no file behind.
func Open(ctx context.Context, cfg Config) (*Transport, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	t := &Transport{
		cfg:       cfg,
		rank:      cfg.Rank,
		size:      cfg.Size,
		streams:   cfg.Streams,
		pid:       os.Getpid(),
		localIdx:  make([]int, cfg.Size),
		zthresh:   cfg.ZCopyThreshold,
		zvec:      cfg.ZCopyVecSlice,
		mapMax:    cfg.MapCache,
		segs:      make([]*segment, len(cfg.Local)),
		dead:      make([]atomic.Bool, len(cfg.Local)),
		conns:     make([]*conn, cfg.Size*cfg.Streams),
		stats:     make([]peerStats, len(cfg.Local)),
		slots:     transport.SlotWindow{Name: "shm", Rank: cfg.Rank, Bytes: cfg.SlotBytes},
		log:       cfg.Logger,
		closedErr: fault.New(fault.ErrClosed, -1, "shm: transport closed"),
	}
	for i := range t.localIdx {
		t.localIdx[i] = -1
	}
	for i, r := range cfg.Local {
		t.localIdx[r] = i
	}
	t.me = t.localIdx[cfg.Rank]
	t.sweepGroup()
	if err := t.create(); err != nil {
		t.Close()
		return nil, err
	}
	if err := t.attach(ctx); err != nil {
		t.Close()
		return nil, err
	}
	t.initConns()
	t.unwatch = transport.WatchFreed(t.publishFreed)
	t.initSlots()
	t.initPlacement()
	t.log.Debug("shm: open", "rank", t.rank, "local", cfg.Local, "streams", t.streams,
		"ring", cfg.RingBytes, "slot", cfg.SlotBytes, "cma", t.cmaRecv, "zcopy", t.zthresh, "mapcache", t.mapMax)
	return t, nil
}

// sweepGroup removes stale segments of this group from other epochs: files
// of ranks killed while opening an earlier transport. Names of this epoch
// belong to ranks opening now; each replaces its own stale file (create).
func (t *Transport) sweepGroup() {
	prefix := groupPrefix(t.cfg.Group)
	mine := prefix + strconv.FormatUint(uint64(t.cfg.Epoch), 10) + "-"
	removed, err := sweep(t.cfg.Dir, func(name string) bool {
		return strings.HasPrefix(name, prefix) && !strings.HasPrefix(name, mine)
	})
	if len(removed) > 0 {
		t.log.Info("shm: removed stale segments", "dir", t.cfg.Dir, "files", removed)
	}
	if err != nil {
		t.log.Warn("shm: sweeping stale segments", "dir", t.cfg.Dir, "err", err)
	}
}

// create creates, sizes, maps and initializes this rank's segment.
func (t *Transport) create() error {
	cfg := &t.cfg
	t.path = filepath.Join(cfg.Dir, segName(cfg.Group, cfg.Epoch, cfg.Rank))
	size := segBytes(len(cfg.Local), cfg.Streams, cfg.RingBytes, cfg.SlotBytes)
	bad := func(err error, what string) error {
		if fault.LocalResource(err) != "" {
			return fault.Exhausted(t.rank, err, "shm: rank %d %s %s (%s)", t.rank, what, t.path, spaceFor(cfg.Dir, size))
		}
		return fault.Wrap(fault.ErrInvalidArgument, -1, err, "shm: %s %s", what, t.path)
	}
	var fd int
	for attempt := 0; ; attempt++ {
		var err error
		fd, err = unix.Open(t.path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err == nil {
			break
		}
		if err != unix.EEXIST || attempt == 3 {
			return bad(err, "creating")
		}
		// A file of our own name: a leftover of a rank killed while opening
		// this group and epoch before, or a live duplicate of this rank.
		old, err := unix.Open(t.path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			continue // vanished meanwhile
		}
		info, mtime, err := readInfo(old)
		unix.Close(old)
		if err != nil {
			return bad(err, "inspecting")
		}
		if !stale(info, mtime, t.pid) {
			return fault.New(fault.ErrInvalidArgument, t.rank,
				"shm: %s belongs to live pid %d: rank %d of group %q epoch %d opened twice", t.path, info.pid, t.rank, cfg.Group, cfg.Epoch)
		}
		t.log.Info("shm: replacing stale segment", "path", t.path, "pid", info.pid)
		if err := unix.Unlink(t.path); err != nil && err != unix.ENOENT {
			return bad(err, "removing stale")
		}
	}
	t.linked = true
	// fallocate reserves the memory now: a full tmpfs fails Open instead of
	// raising SIGBUS on the first touch of a ring page.
	err := unix.Fallocate(fd, 0, 0, int64(size))
	if err == unix.EOPNOTSUPP {
		err = unix.Ftruncate(fd, int64(size)) // a Dir on a file system without fallocate
	}
	var mem []byte
	if err == nil {
		mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	}
	unix.Close(fd)
	if err != nil {
		return bad(err, "allocating")
	}
	t.own = newSegment(mem, t.rank, t.pid)
	t.segs[t.me] = t.own
	start, _, err := procStart(t.pid)
	if err != nil {
		return bad(err, "reading the start time of this process for")
	}
	le := binary.LittleEndian
	le.PutUint32(mem[offVersion:], segVersion)
	le.PutUint32(mem[offPID:], uint32(t.pid))
	le.PutUint64(mem[offStart:], start)
	le.PutUint64(mem[offGroup:], groupHash(cfg.Group))
	le.PutUint32(mem[offEpoch:], cfg.Epoch)
	le.PutUint32(mem[offRank:], uint32(cfg.Rank))
	le.PutUint32(mem[offNLocal:], uint32(len(cfg.Local)))
	le.PutUint32(mem[offStreams:], uint32(cfg.Streams))
	le.PutUint64(mem[offRing:], uint64(cfg.RingBytes))
	le.PutUint64(mem[offLocals:], localsHash(cfg.Size, cfg.Local))
	le.PutUint64(mem[offAddr:], uint64(uintptr(unsafe.Pointer(&mem[0]))))
	le.PutUint64(mem[offSegSize:], uint64(size))
	le.PutUint64(mem[offSlot:], uint64(cfg.SlotBytes))
	u64at(mem, offMagic).Store(segMagic) // publishes the header

	// CMA self-test: seccomp filters and kernels without CMA fail it.
	if t.zthresh > 0 {
		var b [8]byte
		var liov unix.Iovec
		var riov unix.RemoteIovec
		n, errno := cmaRead(t.pid, b[:], uint64(uintptr(unsafe.Pointer(&mem[0]))), &liov, &riov)
		t.cmaRecv = errno == 0 && n == 8 && le.Uint64(b[:]) == segMagic
		if !t.cmaRecv {
			t.log.Info("shm: process_vm_readv unavailable, large messages use the ring", "err", errno)
		}
	}
	return nil
}

// srcIndex is the index of the source at local index src among the sources
// of the rank at local index owner (a rank is not its own source). Rings and
// LL slots are both laid out by it.
func (t *Transport) srcIndex(owner, src int) int {
	if src > owner {
		src--
	}
	return src
}

// ringIndex is the index, in the segment of the rank at local index owner, of
// the ring fed by the rank at local index src on stream.
func (t *Transport) ringIndex(owner, src, stream int) int {
	return t.srcIndex(owner, src)*t.streams + stream
}

// attach maps every peer's segment and waits until every peer mapped ours,
// then unlinks our file.
func (t *Transport) attach(ctx context.Context) error {
	n := len(t.cfg.Local)
	const minBackoff, maxBackoff = 50 * time.Microsecond, 2 * time.Millisecond
	backoff := minBackoff
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		progress := false
		for i := range n {
			if t.segs[i] != nil {
				continue
			}
			seg, err := t.mapPeer(i)
			if err != nil {
				return err
			}
			if seg != nil {
				t.segs[i] = seg
				t.probeCMA(i)
				seg.attached(t.me).Store(1)
				progress = true
			}
		}
		var missing []int
		for i := range n {
			if i == t.me {
				continue
			}
			if t.segs[i] == nil || t.own.attached(i).Load() == 0 {
				missing = append(missing, t.cfg.Local[i])
			}
		}
		if len(missing) == 0 {
			break
		}
		if v := u32at(t.own.mem, offRefused).Load(); v != 0 {
			return fault.New(fault.ErrMismatch, int(v-1), "shm: rank %d found this rank's segment configured differently from its own", v-1)
		}
		ctxErr := func() error {
			kind := fault.ErrTimeout
			if errors.Is(ctx.Err(), context.Canceled) {
				kind = fault.ErrAborted
			}
			return fault.Wrap(kind, missing[0], context.Cause(ctx),
				"shm: rank %d opening group %q epoch %d, waiting for local ranks %v", t.rank, t.cfg.Group, t.cfg.Epoch, missing)
		}
		// A peer sharing our deadline closes when it passes: report the
		// deadline and the ranks missing, not that peer.
		if ctx.Err() != nil {
			return ctxErr()
		}
		t.checkPeers()
		for i, seg := range t.segs {
			if seg != nil && i != t.me {
				if err := t.goneErr(i, -1); err != nil {
					if ctx.Err() != nil {
						// The deadline passed since the look above, and the
						// peer sharing it closed on seeing it first.
						return ctxErr()
					}
					return err
				}
			}
		}
		if progress {
			backoff = minBackoff
		}
		timer.Reset(backoff)
		select {
		case <-ctx.Done():
			return ctxErr()
		case <-timer.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
	if err := unix.Unlink(t.path); err != nil && err != unix.ENOENT {
		t.log.Warn("shm: unlinking segment", "path", t.path, "err", err)
	}
	t.linked = false
	return nil
}

// spaceFor says how much a segment of size bytes needs and how much the file
// system of dir has free, for an error that says what to free or enlarge.
func spaceFor(dir string, size int) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "it needs " + kib(uint64(size))
	}
	return fmt.Sprintf("it needs %s, %s has %s free", kib(uint64(size)), dir, kib(st.Bavail*uint64(st.Bsize)))
}

// kib formats a byte count in KiB, the unit of tmpfs sizes (df -k).
func kib(n uint64) string { return fmt.Sprintf("%d KiB", (n+1023)/1024) }

// mapPeer maps the segment of the rank at local index i. It returns nil and
// no error while the segment is missing, incomplete or a stale leftover that
// its owner has yet to replace.
func (t *Transport) mapPeer(i int) (*segment, error) {
	cfg := &t.cfg
	r := cfg.Local[i]
	path := filepath.Join(cfg.Dir, segName(cfg.Group, cfg.Epoch, r))
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err == unix.ENOENT {
		return nil, nil
	}
	if what := fault.LocalResource(err); what != "" {
		return nil, fault.Exhausted(t.rank, err, "shm: rank %d opening the segment of rank %d", t.rank, r)
	}
	if err != nil {
		return nil, fault.Wrap(fault.ErrInvalidArgument, r, err, "shm: opening %s", path)
	}
	defer unix.Close(fd)
	info, mtime, err := readInfo(fd)
	if err != nil {
		return nil, fault.Wrap(fault.ErrInvalidArgument, r, err, "shm: reading %s", path)
	}
	if info.magic != segMagic || stale(info, mtime, t.pid) {
		return nil, nil
	}
	size := segBytes(len(cfg.Local), cfg.Streams, cfg.RingBytes, cfg.SlotBytes)
	mismatch := func(what string, got, want any) error {
		if info.version == segVersion {
			// Tell the owner, which may never get to see our segment.
			if hp, err := unix.Mmap(fd, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
				u32at(hp, offRefused).Store(uint32(cfg.Rank) + 1)
				unix.Munmap(hp)
			}
		}
		return fault.New(fault.ErrMismatch, r, "shm: rank %d's segment %s has %s %v, this rank uses %v", r, path, what, got, want)
	}
	switch {
	case info.version != segVersion:
		return nil, mismatch("version", info.version, segVersion)
	case info.group != groupHash(cfg.Group) || info.epoch != cfg.Epoch || info.rank != r:
		return nil, mismatch("identity", fmt.Sprintf("%x/%d/%d", info.group, info.epoch, info.rank), fmt.Sprintf("%x/%d/%d", groupHash(cfg.Group), cfg.Epoch, r))
	case info.nLocal != len(cfg.Local) || info.locals != localsHash(cfg.Size, cfg.Local):
		return nil, mismatch("local rank set (count)", info.nLocal, len(cfg.Local))
	case info.streams != cfg.Streams:
		return nil, mismatch("streams", info.streams, cfg.Streams)
	case info.ring != uint64(cfg.RingBytes):
		return nil, mismatch("ring bytes", info.ring, cfg.RingBytes)
	case info.slot != uint64(cfg.SlotBytes):
		return nil, mismatch("small-message mailbox (LL slot) bytes", info.slot, cfg.SlotBytes)
	case info.segSize != uint64(size):
		return nil, mismatch("size", info.segSize, size)
	case info.fileSize < int64(size):
		// A truncated file (by another process of the user) would fault on
		// first touch instead of failing here.
		return nil, mismatch("file size", info.fileSize, size)
	}
	pidfd := -1
	if info.pid != t.pid {
		pidfd, err = unix.PidfdOpen(info.pid, 0)
		if err != nil {
			return nil, nil // exited: a stale file its owner will replace
		}
		// The pidfd pins the process: if it still is the creator now, the
		// pidfd tells us when it exits, whatever happens to the pid.
		if !processAlive(info.pid, info.start) {
			unix.Close(pidfd)
			return nil, nil
		}
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		return nil, fault.Wrap(fault.ErrInvalidArgument, r, err, "shm: mapping %s", path)
	}
	seg := newSegment(mem, r, info.pid)
	seg.pidfd = pidfd
	seg.pfd = unix.PollFd{Fd: int32(pidfd), Events: unix.POLLIN}
	seg.addr = info.addr
	return seg, nil
}

// probeCMA decides whether this rank receives the large messages of the rank
// at local index i by CMA: it reads that rank's segment header from its
// address space. A refusal here (ptrace policy, user namespaces) keeps the
// pair on the ring from the start.
func (t *Transport) probeCMA(i int) {
	if !t.cmaRecv {
		return
	}
	seg := t.segs[i]
	ok := t.cfg.noProbe
	if !ok {
		var b [8]byte
		var liov unix.Iovec
		var riov unix.RemoteIovec
		n, errno := cmaRead(seg.pid, b[:], seg.addr, &liov, &riov)
		ok = errno == 0 && n == 8 && binary.LittleEndian.Uint64(b[:]) == segMagic
		if !ok {
			t.log.Info("shm: process_vm_readv refused, large messages from this rank use the ring", "peer", seg.rank, "pid", seg.pid, "err", errno)
		}
	}
	if ok {
		for s := range t.streams {
			t.own.ring(t.ringIndex(t.me, i, s), t.cfg.RingBytes).cmaOK.Store(1)
		}
	}
}

func (t *Transport) initConns() {
	for i, r := range t.cfg.Local {
		if i == t.me {
			continue
		}
		for s := range t.streams {
			c := &conn{
				t:         t,
				peer:      r,
				stream:    s,
				peerIdx:   i,
				peerSeg:   t.segs[i],
				tx:        t.segs[i].ring(t.ringIndex(i, t.me, s), t.cfg.RingBytes),
				rx:        t.own.ring(t.ringIndex(t.me, i, s), t.cfg.RingBytes),
				sent:      &t.stats[i].sent,
				recvd:     &t.stats[i].recvd,
				closedErr: fault.New(fault.ErrClosed, r, "shm: transport closed"),
			}
			c.rw.Store(idle)
			c.swHead.Store(idle)
			c.swAck.Store(idle)
			t.conns[r*t.streams+s] = c
			t.list = append(t.list, c)
		}
	}
}

// Name is "shm".
func (t *Transport) Name() string { return "shm" }

// Streams is the number of streams per peer pair.
func (t *Transport) Streams() int { return t.streams }

// Conn returns the stream-th stream to peer. It panics when peer is this rank,
// not a local rank, or either index is out of range: that is a bug in the
// caller.
func (t *Transport) Conn(peer, stream int) transport.Conn {
	if peer < 0 || peer >= t.size || peer == t.rank || stream < 0 || stream >= t.streams || t.conns[peer*t.streams+stream] == nil {
		panic(fmt.Sprintf("shm: rank %d has no stream %d to rank %d (world %d, local %v, %d streams)", t.rank, stream, peer, t.size, t.cfg.Local, t.streams))
	}
	return t.conns[peer*t.streams+stream]
}

// ZCopy reports whether this rank receives the large messages of peer by
// CMA: false for a rank that is not local, when ZCopyThreshold is negative on
// this rank, or once the kernel refused this rank process_vm_readv on peer.
func (t *Transport) ZCopy(peer int) bool {
	if peer < 0 || peer >= t.size || t.conns[peer*t.streams] == nil || !t.guard.Acquire() {
		return false
	}
	defer t.guard.Release()
	return t.conns[peer*t.streams].rx.cmaOK.Load() != 0
}

// Wait parks until a stream may progress, Wake is called, a peer goes, or
// timeout passes (timeout <= 0 polls once). Streams record what they last saw
// when they could not progress; Wait returns at once if any of it changed, so
// the caller must have tried every pending op (each returning not done) since
// it last progressed, as the engine does.
func (t *Transport) Wait(timeout time.Duration) error {
	if err := t.guard.Enter(t.closedErr); err != nil {
		return err
	}
	defer t.guard.Release()
	t.ringDue()
	own := t.own
	own.sleeping.Add(1)
	deadline := time.Now().Add(timeout)
	for {
		bell := own.bell.Load()
		left := time.Until(deadline)
		if bell != t.seenBell.Load() || t.checkPeers() || t.ready() || left <= 0 {
			break
		}
		// A signal ends the sleep early: sleep on unless something changed.
		if futexWait(own.bell, bell, left) != unix.EINTR {
			break
		}
	}
	own.sleeping.Add(^uint32(0)) // -1
	t.seenBell.Store(own.bell.Load())
	t.checkPeers()
	return nil
}

// ShareConns tells the transport that several communicators share its
// Conns from now on (transport.Sharer): a frame from a peer on stream 0 may
// be another communicator's while an LL load waits, and another goroutine
// may be reading it, so the load stops taking one for a mismatch. A load
// the peer never stores then ends at the operation's deadline instead.
func (t *Transport) ShareConns() { t.shared.Store(true) }

// ready reports whether a stream waiting for its peer may progress now.
func (t *Transport) ready() bool {
	for _, c := range t.list {
		active := false
		if w := c.rw.Load(); w != idle {
			active = true
			if c.rx.stamp(w).Load() > w+8 {
				return true
			}
		}
		if w := c.swHead.Load(); w != idle {
			active = true
			if c.tx.head.Load() != w {
				return true
			}
		}
		if w := c.swAck.Load(); w != idle {
			active = true
			if c.tx.ack.Load() != w {
				return true
			}
		}
		if active && t.gone(c.peerIdx) {
			return true
		}
	}
	return t.slotsReady()
}

// Wake makes a concurrent or the next Wait return at once. It is safe from any
// goroutine, also after Close.
func (t *Transport) Wake() {
	if !t.guard.Acquire() {
		return
	}
	t.own.bell.Add(1)
	futexWake(t.own.bell)
	t.guard.Release()
}

// gone reports whether the rank at local index i closed its transport or
// exited.
func (t *Transport) gone(i int) bool {
	return t.segs[i].closed.Load() != 0 || t.dead[i].Load()
}

// goneErr returns the ErrPeerLost error for the rank at local index i, or
// nil if it is still there.
func (t *Transport) goneErr(i, stream int) error {
	seg := t.segs[i]
	closed, dead := seg.closed.Load() != 0, t.dead[i].Load()
	if !closed && !dead {
		return nil
	}
	where := ""
	if stream >= 0 {
		where = fmt.Sprintf(" (stream %d)", stream)
	}
	if closed {
		return fault.New(fault.ErrPeerLost, seg.rank, "shm: rank %d closed its transport%s", seg.rank, where)
	}
	return fault.New(fault.ErrPeerLost, seg.rank, "shm: rank %d (pid %d) exited%s", seg.rank, seg.pid, where)
}

// checkPeers polls the pidfds of peers in other processes and marks those
// that exited. It reports whether it found a new death.
func (t *Transport) checkPeers() bool {
	if !t.pollMu.TryLock() {
		return false
	}
	defer t.pollMu.Unlock()
	found := false
	for i, seg := range t.segs {
		if seg != nil && seg.pidfd >= 0 && !t.dead[i].Load() && exited(&seg.pfd) {
			t.dead[i].Store(true)
			t.logExit(seg)
			found = true
		}
	}
	return found
}

// logExit logs the exit of the peer owning seg. Ranks of a finished job exit
// at different times, each after its Close set the closed word of its
// segment (which outlives the peer in this mapping): such a departure is a
// Debug event. A peer that exited without closing its transport crashed or
// was killed, a loss worth a warning even when no operation waits on it.
func (t *Transport) logExit(seg *segment) {
	if seg.closed.Load() != 0 {
		t.log.Debug("shm: peer left after closing its transport", "rank", t.rank, "peer", seg.rank, "pid", seg.pid)
		return
	}
	t.log.Warn("shm: peer exited without closing its transport", "rank", t.rank, "peer", seg.rank, "pid", seg.pid)
}

// checkPeer is checkPeers for one peer, for a stream that waits long.
func (t *Transport) checkPeer(i int) {
	seg := t.segs[i]
	if seg.pidfd < 0 || t.dead[i].Load() || !t.pollMu.TryLock() {
		return
	}
	if exited(&seg.pfd) {
		t.dead[i].Store(true)
		t.logExit(seg)
	}
	t.pollMu.Unlock()
}

// disableCMA turns CMA off for every source after the kernel refused it at
// run time: this rank's rings tell the senders to stream instead.
func (t *Transport) disableCMA(errno unix.Errno) {
	if !t.cmaOff.CompareAndSwap(false, true) {
		return
	}
	t.log.Warn("shm: process_vm_readv refused, large messages use the ring from now on", "rank", t.rank, "err", errno)
	for _, c := range t.list {
		c.rx.cmaOK.Store(0)
	}
}

// Stats returns the bytes moved per peer (frame headers included; LL
// messages count 8 bytes per word, the length word included).
func (t *Transport) Stats() transport.Stats {
	s := transport.Stats{
		BytesSent:     make([]uint64, t.size),
		BytesReceived: make([]uint64, t.size),
	}
	for i, r := range t.cfg.Local {
		s.BytesSent[r] = t.stats[i].sent.Load() + t.stats[i].llSent.load()
		s.BytesReceived[r] = t.stats[i].recvd.Load() + t.stats[i].llRecvd.load()
	}
	return s
}

// Close marks this rank's segment closed and wakes the peers, so that their
// streams to it fail with fault.ErrPeerLost, waits for calls in progress on
// this transport, unmaps every segment and unlinks this rank's file if Open
// did not get to it. It is idempotent. Operations fail with fault.ErrClosed
// afterwards.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		if t.unwatch != nil {
			t.unwatch()
		}
		if t.own != nil {
			t.own.closed.Store(1)
			for _, seg := range t.segs {
				if seg != nil && seg != t.own {
					seg.bell.Add(1)
					futexWake(seg.bell)
				}
			}
		}
		for _, c := range t.list {
			c.guard.Shut()
			c.guard.Drain(nil)
			// No call is in progress on c: its mappings and holds go.
			c.rmaps.drop()
			c.sshare.Release()
		}
		if t.guard.Shut() {
			t.guard.Drain(func() {
				if t.own != nil {
					t.own.bell.Add(1)
					futexWake(t.own.bell)
				}
			})
		}
		var errs []error
		if t.linked {
			if err := unix.Unlink(t.path); err != nil && err != unix.ENOENT {
				errs = append(errs, fmt.Errorf("shm: unlinking %s: %w", t.path, err))
			}
			t.linked = false
		}
		for _, seg := range t.segs {
			if seg != nil {
				errs = append(errs, seg.unmap())
			}
		}
		t.closeErr = errors.Join(errs...)
	})
	return t.closeErr
}
