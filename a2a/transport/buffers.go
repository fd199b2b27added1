package transport

import (
	"slices"
	"sync"
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
var buffers struct {
	sync.RWMutex
	spans    []bufferSpan // sorted by base, disjoint
	watchers map[int]func(base uintptr, size int)
	nextID   int
}

type bufferSpan struct {
	base uintptr
	size int
}

// AddBuffer records mem, a mapping from a2a.AllocBuffer (its whole
// capacity), as memory a transport may register until RemoveBuffer.
func AddBuffer(mem []byte) {
	if cap(mem) == 0 {
		return
	}
	s := bufferSpan{uintptr(unsafe.Pointer(unsafe.SliceData(mem))), cap(mem)}
	buffers.Lock()
	defer buffers.Unlock()
	i, _ := slices.BinarySearchFunc(buffers.spans, s.base, func(e bufferSpan, b uintptr) int { return cmpPtr(e.base, b) })
	buffers.spans = slices.Insert(buffers.spans, i, s)
}

// RemoveBuffer forgets mem (as passed to AddBuffer, any reslicing that keeps
// its start and capacity) and, before returning, has every watcher release
// what it registered of it: the caller unmaps it next.
func RemoveBuffer(mem []byte) {
	if cap(mem) == 0 {
		return
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	buffers.Lock()
	i, ok := slices.BinarySearchFunc(buffers.spans, base, func(e bufferSpan, b uintptr) int { return cmpPtr(e.base, b) })
	if !ok {
		buffers.Unlock()
		return
	}
	s := buffers.spans[i]
	buffers.spans = slices.Delete(buffers.spans, i, i+1)
	watchers := make([]func(uintptr, int), 0, len(buffers.watchers))
	for _, w := range buffers.watchers {
		watchers = append(watchers, w)
	}
	buffers.Unlock()
	for _, w := range watchers {
		w(s.base, s.size)
	}
}

// FindBuffer returns the AllocBuffer mapping that holds the n bytes at p
// whole (its base and size), or ok false when they are not in one: Go heap,
// stack or foreign memory, which a transport must copy instead.
func FindBuffer(p uintptr, n int) (base uintptr, size int, ok bool) {
	buffers.RLock()
	defer buffers.RUnlock()
	i, found := slices.BinarySearchFunc(buffers.spans, p, func(e bufferSpan, b uintptr) int { return cmpPtr(e.base, b) })
	if !found {
		i--
	}
	if i < 0 {
		return 0, 0, false
	}
	s := buffers.spans[i]
	if p < s.base || p-s.base+uintptr(n) > uintptr(s.size) {
		return 0, 0, false
	}
	return s.base, s.size, true
}

// WatchBuffers calls release(base, size) whenever RemoveBuffer removes a
// mapping, until stop is called; release must not call back into this
// registry. A call that RemoveBuffer began before stop may still run after
// it, so release must cope with its owner being closed.
func WatchBuffers(release func(base uintptr, size int)) (stop func()) {
	buffers.Lock()
	defer buffers.Unlock()
	if buffers.watchers == nil {
		buffers.watchers = map[int]func(uintptr, int){}
	}
	id := buffers.nextID
	buffers.nextID++
	buffers.watchers[id] = release
	return func() {
		buffers.Lock()
		delete(buffers.watchers, id)
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
