package transport

import (
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// SharedPrefix starts the memfd names of shareable mappings: a peer checks
// that a descriptor it received names such a memfd, of the generation it
// claims, before it maps it (/proc shows "/memfd:a2a-buf-GEN (deleted)").
const SharedPrefix = "a2a-buf-"

// SharedName is the memfd name of the shareable mapping of generation gen.
func SharedName(gen uint64) string { return SharedPrefix + strconv.FormatUint(gen, 10) }

// SharedSeals are the seals of a shareable mapping's memfd: its size is
// fixed, so a peer's mapping of it can never fault with SIGBUS.
const SharedSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// AllocShared returns n zeroed bytes in a shareable mapping: a memfd of n
// bytes rounded up to align (a power of two, a multiple of the page size),
// mapped MAP_SHARED at an address aligned to align and advised to use huge
// pages (the kernel backs shared memory with them only where
// /sys/kernel/mm/transparent_hugepage/shmem_enabled allows). The mapping is
// in the registry (FindBuffer, AcquireShared) until FreeShared. Errors wrap
// fault.ErrResource when memory or descriptors run out, else
// fault.ErrInvalidArgument.
func AllocShared(n, align int) ([]byte, error) {
	size := (n + align - 1) &^ (align - 1)
	buffers.Lock()
	buffers.nextGen++
	gen := buffers.nextGen
	buffers.Unlock()
	bad := func(err error, what string) error {
		if fault.LocalResource(err) != "" {
			return fault.Exhausted(-1, err, "AllocBuffer(%d): %s", n, what)
		}
		return fault.Wrap(fault.ErrInvalidArgument, -1, err, "AllocBuffer(%d): %s", n, what)
	}
	fd, err := unix.MemfdCreate(SharedName(gen), unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, bad(err, "memfd_create")
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, bad(err, "sizing the memfd")
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, SharedSeals); err != nil {
		unix.Close(fd)
		return nil, bad(err, "sealing the memfd")
	}
	// Reserve room to align the start, map the memfd over the aligned
	// middle, then give back the head and tail of the reservation.
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(size+align), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		unix.Close(fd)
		return nil, bad(err, "reserving address space")
	}
	head := (uintptr(align) - uintptr(p)%uintptr(align)) % uintptr(align)
	start := unsafe.Add(p, head)
	if _, err := unix.MmapPtr(fd, 0, start, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
		unix.MunmapPtr(p, uintptr(size+align))
		unix.Close(fd)
		return nil, bad(err, "mapping the memfd")
	}
	if head > 0 {
		unix.MunmapPtr(p, head)
	}
	unix.MunmapPtr(unsafe.Add(start, size), uintptr(align)-head) // head < align: never empty
	b := unsafe.Slice((*byte)(start), size)
	// Only advice: without huge pages the buffer still works with base pages.
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	buffers.Lock()
	addSpan(&bufferSpan{base: uintptr(start), size: size, fd: fd, gen: gen})
	buffers.Unlock()
	return b[:n:size], nil
}

// FreeShared releases a mapping from AllocShared (any reslicing that keeps
// its start and capacity): watchers release it, then it is unmapped and its
// memfd closed. It fails with fault.ErrInvalidArgument, leaving the mapping
// as it was, when b is not such a mapping, when a registration (Pin) holds
// it, or while a send from it is in flight (a peer may be reading it).
func FreeShared(b []byte) error {
	if cap(b) == 0 {
		return fault.New(fault.ErrInvalidArgument, -1, "FreeBuffer: empty slice")
	}
	ptr := unsafe.Pointer(unsafe.SliceData(b))
	base := uintptr(ptr)
	buffers.Lock()
	s := find(base, cap(b))
	switch {
	case s == nil || s.base != base || s.size != cap(b) || s.fd < 0:
		buffers.Unlock()
		return fault.New(fault.ErrInvalidArgument, -1, "FreeBuffer: %d-byte slice at %#x is not from AllocBuffer", cap(b), base)
	case s.pins > 0:
		buffers.Unlock()
		return fault.New(fault.ErrInvalidArgument, -1, "FreeBuffer: the %d-byte buffer at %#x is registered %d times (Deregister first)", s.size, base, s.pins)
	case s.inflight.Load() > 0:
		buffers.Unlock()
		return fault.New(fault.ErrInvalidArgument, -1, "FreeBuffer: the %d-byte buffer at %#x is in use by an operation in flight", s.size, base)
	}
	i, _ := slicesIndex(s)
	buffers.spans = append(buffers.spans[:i], buffers.spans[i+1:]...)
	buffers.Unlock()
	notifyRemoved(s)
	err := unix.MunmapPtr(ptr, uintptr(s.size))
	unix.Close(s.fd)
	if err != nil {
		return fault.Wrap(fault.ErrInvalidArgument, -1, err, "FreeBuffer")
	}
	return nil
}

// slicesIndex is the index of s in the registry; the caller holds the lock.
func slicesIndex(s *bufferSpan) (int, bool) {
	for i, e := range buffers.spans {
		if e == s {
			return i, true
		}
	}
	return -1, false
}

// Pin records a registration of the n bytes at p, which must lie in one
// shareable mapping: FreeShared refuses the mapping until Unpin. It returns
// the mapping's base and generation, which Unpin takes.
func Pin(p uintptr, n int) (base uintptr, gen uint64, err error) {
	buffers.Lock()
	defer buffers.Unlock()
	s := find(p, n)
	if s == nil || s.fd < 0 {
		return 0, 0, fault.New(fault.ErrInvalidArgument, -1,
			"Register: the %d bytes at %#x are not in one AllocBuffer buffer: only its memory can be shared", n, p)
	}
	s.pins++
	return s.base, s.gen, nil
}

// Unpin releases a registration Pin returned. It fails with
// fault.ErrInvalidArgument for a registration released already, and while
// a send from the mapping is in flight: a peer may be reading it.
func Unpin(base uintptr, gen uint64) error {
	buffers.Lock()
	defer buffers.Unlock()
	s := find(base, 1)
	switch {
	case s == nil || s.base != base || s.gen != gen || s.pins == 0:
		return fault.New(fault.ErrInvalidArgument, -1, "Deregister: no registration of the buffer at %#x (generation %d)", base, gen)
	case s.inflight.Load() > 0:
		return fault.New(fault.ErrInvalidArgument, -1, "Deregister: the buffer at %#x is in use by an operation in flight", base)
	}
	s.pins--
	return nil
}

// Shared is a send's hold on the shareable mapping its data lies in: a
// descriptor a peer on this host can map (FD in this process, Gen, Size) and
// the data's offset in it. The mapping cannot be freed until Release.
type Shared struct {
	FD   int
	Gen  uint64
	Size int
	Off  int
	span *bufferSpan
}

// AcquireShared returns a hold on the shareable mapping that holds the n
// bytes at p whole, or ok false when they are in none (the caller copies
// them some other way).
func AcquireShared(p uintptr, n int) (sh Shared, ok bool) {
	buffers.RLock()
	defer buffers.RUnlock()
	s := find(p, n)
	if s == nil || s.fd < 0 {
		return Shared{}, false
	}
	s.inflight.Add(1)
	return Shared{FD: s.fd, Gen: s.gen, Size: s.size, Off: int(p - s.base), span: s}, true
}

// Held reports whether sh holds a mapping (Release not called yet).
func (sh *Shared) Held() bool { return sh.span != nil }

// Release drops the hold; a second call does nothing.
func (sh *Shared) Release() {
	if sh.span != nil {
		sh.span.inflight.Add(-1)
		sh.span = nil
	}
}

// IsSharedName reports whether link, a /proc/PID/fd link, names the memfd
// of a shareable mapping of generation gen.
func IsSharedName(link string, gen uint64) bool {
	rest, ok := strings.CutPrefix(link, "/memfd:"+SharedName(gen))
	return ok && (rest == "" || rest == " (deleted)")
}
