package transport

import (
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"
)

// The registry of buffers from a2a.AllocBuffer. A transport that moves data
// without copying (verbs: the device reads the caller's memory) must
// register that memory with the device, which pins it, and registration is
// too slow to repeat per message. Such a transport may keep a registration
// only of memory that stays mapped until it is told otherwise: AllocBuffer's
// mappings, which FreeBuffer releases through this registry first, and never
// Go heap memory, whose pages the runtime may return to the OS. The registry
// is process-wide because AllocBuffer and FreeBuffer are; it is the one piece
// of global state the transports share, as MPI libraries hook their memory
// allocation for the same reason.
//
// Mappings from AllocShared are also shareable: a memfd backs them, so a
// process on this host may map the same pages (shm's mapped copies). Their
// registry entry keeps the memfd open and counts what holds them: user
// registrations (Pin) and sends a peer may be reading (AcquireShared), either
// of which makes FreeShared refuse, so a peer never reads freed memory.
var buffers struct {
	sync.RWMutex
	spans    []*bufferSpan // sorted by base, disjoint
	watchers map[int]func(base uintptr, size int)
	freed    map[int]func(gen uint64)
	nextID   int
	nextGen  uint64 // generations of shareable mappings, from 1
}

type bufferSpan struct {
	base uintptr
	size int
	fd   int    // the memfd behind a shareable mapping, else -1
	gen  uint64 // unique among this process's shareable mappings, 0 for others
	pins int    // registrations (Pin) not yet released
	// inflight counts sends whose receiver may be reading the mapping.
	inflight atomic.Int64
}

// AddBuffer records mem, a mapping from a2a.AllocBuffer (its whole
// capacity), as memory a transport may register until RemoveBuffer.
func AddBuffer(mem []byte) {
	if cap(mem) == 0 {
		return
	}
	buffers.Lock()
	defer buffers.Unlock()
	addSpan(&bufferSpan{base: uintptr(unsafe.Pointer(unsafe.SliceData(mem))), size: cap(mem), fd: -1})
}

// addSpan inserts s; the caller holds the lock.
func addSpan(s *bufferSpan) {
	i, _ := slices.BinarySearchFunc(buffers.spans, s.base, cmpSpan)
	buffers.spans = slices.Insert(buffers.spans, i, s)
}

func cmpSpan(e *bufferSpan, b uintptr) int { return cmpPtr(e.base, b) }

// RemoveBuffer forgets mem (as passed to AddBuffer, any reslicing that keeps
// its start and capacity) and, before returning, has every watcher release
// what it registered of it: the caller unmaps it next.
func RemoveBuffer(mem []byte) {
	if cap(mem) == 0 {
		return
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	buffers.Lock()
	i, ok := slices.BinarySearchFunc(buffers.spans, base, cmpSpan)
	if !ok {
		buffers.Unlock()
		return
	}
	s := buffers.spans[i]
	buffers.spans = slices.Delete(buffers.spans, i, i+1)
	buffers.Unlock()
	notifyRemoved(s)
}

// notifyRemoved has every watcher release s, and tells those of freed
// shareable mappings.
func notifyRemoved(s *bufferSpan) {
	buffers.RLock()
	watchers := make([]func(uintptr, int), 0, len(buffers.watchers))
	for _, w := range buffers.watchers {
		watchers = append(watchers, w)
	}
	var freed []func(uint64)
	if s.gen != 0 {
		for _, w := range buffers.freed {
			freed = append(freed, w)
		}
	}
	buffers.RUnlock()
	for _, w := range watchers {
		w(s.base, s.size)
	}
	for _, w := range freed {
		w(s.gen)
	}
}

// find returns the span holding the n bytes at p whole; the caller holds
// the lock.
func find(p uintptr, n int) *bufferSpan {
	i, found := slices.BinarySearchFunc(buffers.spans, p, cmpSpan)
	if !found {
		i--
	}
	if i < 0 {
		return nil
	}
	s := buffers.spans[i]
	if p < s.base || p-s.base+uintptr(n) > uintptr(s.size) {
		return nil
	}
	return s
}

// FindBuffer returns the AllocBuffer mapping that holds the n bytes at p
// whole (its base and size), or ok false when they are not in one: Go heap,
// stack or foreign memory, which a transport must copy instead.
func FindBuffer(p uintptr, n int) (base uintptr, size int, ok bool) {
	buffers.RLock()
	defer buffers.RUnlock()
	if s := find(p, n); s != nil {
		return s.base, s.size, true
	}
	return 0, 0, false
}

// WatchBuffers calls release(base, size) whenever RemoveBuffer removes a
// mapping, until stop is called; release must not call back into this
// registry. A call that RemoveBuffer began before stop may still run after
// it, so release must cope with its owner being closed.
func WatchBuffers(release func(base uintptr, size int)) (stop func()) {
	return watch(&buffers.watchers, release)
}

// WatchFreed calls freed(gen) whenever FreeShared frees the shareable
// mapping of generation gen, until stop is called, so that a transport
// tells the peers that mapped it to let go of it; freed must not call back
// into this registry and must cope with its owner being closed.
func WatchFreed(freed func(gen uint64)) (stop func()) {
	return watch(&buffers.freed, freed)
}

// watch adds f to the watchers in *m until stop.
func watch[F any](m *map[int]F, f F) (stop func()) {
	buffers.Lock()
	defer buffers.Unlock()
	if *m == nil {
		*m = map[int]F{}
	}
	id := buffers.nextID
	buffers.nextID++
	(*m)[id] = f
	return func() {
		buffers.Lock()
		delete(*m, id)
		buffers.Unlock()
	}
}

func cmpPtr(a, b uintptr) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
