package transport

import (
	"errors"
	"os"
	"strconv"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
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

// A shareable buffer is aligned, zeroed, a sealed memfd of its generation,
// found by FindBuffer and AcquireShared with its offset; FreeShared refuses
// foreign memory, a pinned buffer and one in flight, and tells WatchFreed.
func TestSharedBuffer(t *testing.T) {
	const align = 2 << 20
	b, err := AllocShared(3<<20+5, align)
	if err != nil {
		t.Fatal(err)
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	if len(b) != 3<<20+5 || cap(b) != 4<<20 || p%align != 0 {
		t.Fatalf("len %d cap %d at %#x", len(b), cap(b), p)
	}
	for i, v := range b[:cap(b)] {
		if v != 0 {
			t.Fatalf("byte %d is %d, want zeroed memory", i, v)
		}
	}
	if base, size, ok := FindBuffer(p+100, 1000); !ok || base != p || size != cap(b) {
		t.Errorf("FindBuffer: %#x %d %v", base, size, ok)
	}
	sh, ok := AcquireShared(p+100, 1000)
	if !ok || sh.Off != 100 || sh.Size != cap(b) || sh.Gen == 0 {
		t.Fatalf("AcquireShared: %+v %v", sh, ok)
	}
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(sh.FD))
	if err != nil || !IsSharedName(link, sh.Gen) || IsSharedName(link, sh.Gen+1) {
		t.Errorf("memfd link %q (%v) for generation %d", link, err, sh.Gen)
	}
	if seals, err := unix.FcntlInt(uintptr(sh.FD), unix.F_GET_SEALS, 0); err != nil || seals != SharedSeals {
		t.Errorf("seals %#x (%v), want %#x", seals, err, SharedSeals)
	}
	if err := FreeShared(b); !errors.Is(err, fault.ErrInvalidArgument) {
		t.Errorf("FreeShared in flight: %v", err)
	}
	sh.Release()
	sh.Release() // twice: nothing
	base, gen, err := Pin(p+10, 10)
	if err != nil || base != p || gen != sh.Gen {
		t.Fatalf("Pin: %#x %d %v", base, gen, err)
	}
	if err := FreeShared(b); !errors.Is(err, fault.ErrInvalidArgument) {
		t.Errorf("FreeShared pinned: %v", err)
	}
	if err := Unpin(base, gen); err != nil {
		t.Fatal(err)
	}
	heap := make([]byte, 100)
	if _, _, err := Pin(uintptr(unsafe.Pointer(&heap[0])), 100); !errors.Is(err, fault.ErrInvalidArgument) {
		t.Errorf("Pin of heap memory: %v", err)
	}
	if err := FreeShared(heap); !errors.Is(err, fault.ErrInvalidArgument) {
		t.Errorf("FreeShared of heap memory: %v", err)
	}
	var freed []uint64
	stop := WatchFreed(func(g uint64) { freed = append(freed, g) })
	defer stop()
	if err := FreeShared(b[:1]); err != nil {
		t.Fatal(err)
	}
	if len(freed) != 1 || freed[0] != gen {
		t.Errorf("WatchFreed saw %v, want [%d]", freed, gen)
	}
	if _, _, ok := FindBuffer(p, 1); ok {
		t.Error("found after FreeShared")
	}
}
