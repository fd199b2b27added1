package transport

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The registry finds the mapping that holds a span whole, tells watchers
// when one is removed (before the caller unmaps it), and forgets it.
func TestBufferRegistry(t *testing.T) {
	a, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(a)
	b, err := unix.Mmap(-1, 0, 64<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	AddBuffer(a[:10]) // a reslice: the capacity counts
	AddBuffer(b)
	base := func(m []byte) uintptr { return uintptr(unsafe.Pointer(&m[0])) }
	heap := make([]byte, 100)
	for _, tc := range []struct {
		name string
		p    uintptr
		n    int
		want uintptr
		ok   bool
	}{
		{"start of a", base(a), 1, base(a), true},
		{"all of a", base(a), len(a), base(a), true},
		{"inside b", base(b) + 100, 1000, base(b), true},
		{"past b's end", base(b) + 100, len(b), 0, false},
		{"go heap", base(heap), len(heap), 0, false},
	} {
		got, _, ok := FindBuffer(tc.p, tc.n)
		if ok != tc.ok || got != tc.want {
			t.Errorf("%s: %#x %v, want %#x %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
	var released []uintptr
	stop := WatchBuffers(func(base uintptr, size int) { released = append(released, base, uintptr(size)) })
	RemoveBuffer(a)
	if len(released) != 2 || released[0] != base(a) || released[1] != uintptr(len(a)) {
		t.Errorf("released %#x, want a's base and size", released)
	}
	if _, _, ok := FindBuffer(base(a), 1); ok {
		t.Error("a is still found after RemoveBuffer")
	}
	stop()
	RemoveBuffer(b)
	if len(released) != 2 {
		t.Errorf("a stopped watcher was called: %#x", released)
	}
	RemoveBuffer(b) // unknown: nothing happens
}
