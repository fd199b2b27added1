package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/transport"
)

// Segment layout. The first page is the header; ring i follows at
// pageSize + i*(pageSize+RingBytes), a control page and then its data. After
// the rings comes the LL window: two slots (parities 0 and 1) per local source,
// each slotStride bytes, one length word and then the data words. Fields that
// different ranks write live on different cache-line pairs (the adjacent-line
// prefetcher moves 128-byte pairs).
const (
	pageSize = 4096
	lineSize = 128

	segMagic   = 0x31304d4853413241 // "A2ASHM01"
	segVersion = 5                  // 4: recMap records; 5: packed LL slots

	// Header fields written once by the owner before it publishes offMagic.
	offMagic   = 0  // u64, stored last
	offVersion = 8  // u32
	offPID     = 12 // u32 creator pid
	offStart   = 16 // u64 creator start time (clock ticks since boot), tells pid reuse apart
	offGroup   = 24 // u64 hash of the group name
	offEpoch   = 32 // u32
	offRank    = 36 // u32 owner's world rank
	offNLocal  = 40 // u32
	offStreams = 44 // u32
	offRing    = 48 // u64 ring data bytes
	offLocals  = 56 // u64 hash of the local rank list
	offAddr    = 64 // u64 address of the mapping in the owner's address space (CMA probe)
	offSegSize = 72 // u64
	offSlot    = 80 // u64 LL slot payload bytes (0: no LL window)

	offClosed   = 1 * lineSize    // u32: the owner closed its transport
	offRefused  = offClosed + 4   // u32: world rank + 1 of a peer whose configuration differs
	offSleeping = 2 * lineSize    // u32: waiters parked on the doorbell
	offCPU      = offSleeping + 4 // u32: CPU + 1 the owner last polled on (Rebalance), 0: unknown
	offBell     = 3 * lineSize    // u32: the doorbell futex word
	offAttached = 4 * lineSize    // u32 per local index: that rank mapped this segment
	offFreed    = 24 * lineSize   // u64: shareable buffers this process freed (mapped.go)
	offFreedGen = 25 * lineSize   // u64 per slot: their generations, the last freedSlots of them

	// Ring control page.
	ctlHead  = 0            // u64 bytes ever consumed (receiver)
	ctlAck   = 2 * lineSize // u64 id<<2 | status of the last CMA descriptor (receiver)
	ctlCMAOK = ctlAck + 8   // u32 the receiver reads this source's memory with CMA
)

// The receiver's answers to a CMA descriptor, in the low bits of ctlAck.
const (
	ackDone     = 0 // payload copied
	ackFallback = 1 // CMA refused by the kernel: stream the payload through the ring
	ackRejected = 2 // the header did not match the receiver's expectation
)

// headerBytes is the size of the fields written before offMagic.
const headerBytes = offSlot + 8

func segBytes(nLocal, streams, ringBytes, slotBytes int) int {
	return windowBase(nLocal, streams, ringBytes) + (nLocal-1)*2*slotStride(slotBytes)
}

// windowBase is the offset of the LL window, after the rings.
func windowBase(nLocal, streams, ringBytes int) int {
	return pageSize + (nLocal-1)*streams*(pageSize+ringBytes)
}

// slotStride is the size of one LL slot, its length word and data words,
// rounded up to a cache-line pair; 0 when LL slots are off (slotBytes 0, as
// Config.normalize leaves it).
func slotStride(slotBytes int) int {
	if slotBytes == 0 {
		return 0
	}
	return (8*(1+transport.PackedWords(slotBytes)) + lineSize - 1) &^ (lineSize - 1)
}

func groupHash(group string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(group))
	return h.Sum64()
}

func localsHash(size int, local []int) uint64 {
	h := fnv.New64a()
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], uint32(size))
	h.Write(b[:])
	for _, r := range local {
		binary.LittleEndian.PutUint32(b[:], uint32(r))
		h.Write(b[:])
	}
	return h.Sum64()
}

const namePrefix = "a2a-"

// groupPrefix starts the names of a group's segments.
func groupPrefix(group string) string { return fmt.Sprintf("%s%016x-", namePrefix, groupHash(group)) }

// segName is the file name of rank's segment in group at epoch.
func segName(group string, epoch uint32, rank int) string {
	return fmt.Sprintf("%s%d-%d", groupPrefix(group), epoch, rank)
}

// parseName splits a segment file name into its group hash, epoch and rank.
func parseName(name string) (group uint64, epoch uint32, rank int, ok bool) {
	rest, found := strings.CutPrefix(name, namePrefix)
	if !found {
		return 0, 0, 0, false
	}
	parts := strings.Split(rest, "-")
	if len(parts) != 3 || len(parts[0]) != 16 {
		return 0, 0, 0, false
	}
	g, err1 := strconv.ParseUint(parts[0], 16, 64)
	e, err2 := strconv.ParseUint(parts[1], 10, 32)
	r, err3 := strconv.ParseUint(parts[2], 10, 31)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, 0, false
	}
	return g, uint32(e), int(r), true
}

// segment is one mapped segment: this rank's own or a peer's.
type segment struct {
	mem   []byte
	rank  int // owner's world rank
	pid   int
	pidfd int         // -1 when the owner is this process
	pfd   unix.PollFd // polls pidfd; Transport.pollMu serializes its use
	addr  uint64      // the mapping's address in the owner's process (CMA probe)

	closed   *atomic.Uint32
	freed    *atomic.Uint64
	sleeping *atomic.Uint32
	bell     *atomic.Uint32
	cpu      *atomic.Uint32
}

func u64at(mem []byte, off int) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&mem[off])) }
func u32at(mem []byte, off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&mem[off])) }

func newSegment(mem []byte, rank, pid int) *segment {
	return &segment{
		mem:      mem,
		rank:     rank,
		pid:      pid,
		pidfd:    -1,
		closed:   u32at(mem, offClosed),
		freed:    u64at(mem, offFreed),
		sleeping: u32at(mem, offSleeping),
		bell:     u32at(mem, offBell),
		cpu:      u32at(mem, offCPU),
	}
}

func (s *segment) attached(localIdx int) *atomic.Uint32 {
	return u32at(s.mem, offAttached+4*localIdx)
}

// ring returns the view of ring i of the segment.
func (s *segment) ring(i, ringBytes int) ring {
	base := pageSize + i*(pageSize+ringBytes)
	return ring{
		head:  u64at(s.mem, base+ctlHead),
		ack:   u64at(s.mem, base+ctlAck),
		cmaOK: u32at(s.mem, base+ctlCMAOK),
		data:  s.mem[base+pageSize : base+pageSize+ringBytes : base+pageSize+ringBytes],
		mask:  uint64(ringBytes - 1),
	}
}

// unmap releases the mapping and the pidfd.
func (s *segment) unmap() error {
	var errs []error
	if s.pidfd >= 0 {
		errs = append(errs, unix.Close(s.pidfd))
		s.pidfd = -1
	}
	if s.mem != nil {
		errs = append(errs, unix.Munmap(s.mem))
		s.mem = nil
	}
	return errors.Join(errs...)
}

// segInfo is what a segment header says about its creator.
type segInfo struct {
	magic   uint64
	version uint32
	pid     int
	start   uint64
	group   uint64
	epoch   uint32
	rank    int
	nLocal  int
	streams int
	ring    uint64
	locals  uint64
	addr    uint64
	segSize uint64
	slot    uint64
	closed  bool
	// fileSize is the file's size when read (not part of the header): a
	// mapping beyond it would fault with SIGBUS on first touch.
	fileSize int64
}

func decodeInfo(b []byte) segInfo {
	le := binary.LittleEndian
	return segInfo{
		magic:   le.Uint64(b[offMagic:]),
		version: le.Uint32(b[offVersion:]),
		pid:     int(le.Uint32(b[offPID:])),
		start:   le.Uint64(b[offStart:]),
		group:   le.Uint64(b[offGroup:]),
		epoch:   le.Uint32(b[offEpoch:]),
		rank:    int(le.Uint32(b[offRank:])),
		nLocal:  int(le.Uint32(b[offNLocal:])),
		streams: int(le.Uint32(b[offStreams:])),
		ring:    le.Uint64(b[offRing:]),
		locals:  le.Uint64(b[offLocals:]),
		addr:    le.Uint64(b[offAddr:]),
		segSize: le.Uint64(b[offSegSize:]),
		slot:    le.Uint64(b[offSlot:]),
	}
}

// readInfo reads the header of the segment open on fd.
func readInfo(fd int) (segInfo, int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return segInfo{}, 0, err
	}
	if st.Size < pageSize {
		return segInfo{}, st.Mtim.Nano(), nil
	}
	var b [offClosed + 4]byte
	if _, err := unix.Pread(fd, b[:], 0); err != nil {
		return segInfo{}, 0, err
	}
	info := decodeInfo(b[:])
	info.closed = binary.LittleEndian.Uint32(b[offClosed:]) != 0
	info.fileSize = st.Size
	return info, st.Mtim.Nano(), nil
}

// staleAfter is how long a segment file may exist without a complete header
// before a sweeper considers its creator dead: a live creator writes the
// header microseconds after creating the file.
const staleAfter = 10 * time.Second

// stale reports whether a segment whose header says info, last modified at
// mtime (ns), belongs to nobody: its creator closed it, died, or died before
// writing the header.
func stale(info segInfo, mtime int64, self int) bool {
	if info.pid == 0 {
		return time.Since(time.Unix(0, mtime)) > staleAfter
	}
	if info.closed {
		return true
	}
	if info.pid == self {
		return false
	}
	return !processAlive(info.pid, info.start)
}

// processAlive reports whether pid runs and started at start (clock ticks
// since boot), so that a recycled pid does not pass for the creator. Zombies
// count as dead.
func processAlive(pid int, start uint64) bool {
	st, state, err := procStart(pid)
	if err != nil {
		return false
	}
	return state != 'Z' && state != 'X' && st == start
}

// procStart reads a process's start time and state from /proc/PID/stat.
func procStart(pid int) (start uint64, state byte, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name may hold spaces and parentheses: fields resume after
	// the last ')'. Field 3 is the state, field 22 the start time.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return start, f[0][0], err
}

// Sweep removes the a2a segment files in dir whose creator closed them or no
// longer runs, and returns their names. Live ranks unlink their segments as
// soon as all local peers attached, so only ranks killed while opening a
// transport leave files behind; Open already sweeps its own group. Sweep is
// meant for a daemon's start-up, when no job is reopening the same names.
func Sweep(dir string) ([]string, error) {
	return sweep(dir, func(string) bool { return true })
}

// sweep removes the stale segments of dir whose name match accepts.
func sweep(dir string, match func(name string) bool) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var removed []string
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if _, _, _, ok := parseName(name); !ok || !match(name) {
			continue
		}
		path := filepath.Join(dir, name)
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			if err != unix.ENOENT {
				errs = append(errs, fmt.Errorf("%s: %w", path, err))
			}
			continue
		}
		info, mtime, err := readInfo(fd)
		unix.Close(fd)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			continue
		}
		if !stale(info, mtime, self) {
			continue
		}
		if err := unix.Unlink(path); err != nil && err != unix.ENOENT {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}
