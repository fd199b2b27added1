package a2a

import (
	"errors"
	"testing"
	"unsafe"
)

func TestAllocBuffer(t *testing.T) {
	for _, n := range []int{1, 4096, hugePage - 1, hugePage, hugePage + 1, 5 << 20} {
		b, err := AllocBuffer(n)
		if err != nil {
			t.Fatalf("AllocBuffer(%d): %v", n, err)
		}
		if len(b) != n || cap(b)%hugePage != 0 || cap(b) < n || uintptr(unsafe.Pointer(&b[0]))%hugePage != 0 {
			t.Fatalf("AllocBuffer(%d): len %d cap %d at %p", n, len(b), cap(b), &b[0])
		}
		for i := range b {
			if b[i] != 0 {
				t.Fatalf("AllocBuffer(%d): byte %d is %d, want zeroed memory", n, i, b[i])
			}
		}
		b[0], b[n-1] = 1, 2
		if err := FreeBuffer(b[:1]); err != nil { // a reslice keeps start and capacity
			t.Fatalf("FreeBuffer: %v", err)
		}
	}
	for _, n := range []int{0, -1} {
		if _, err := AllocBuffer(n); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("AllocBuffer(%d): %v, want ErrInvalidArgument", n, err)
		}
	}
	heap := make([]byte, 100)
	if err := FreeBuffer(heap); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("FreeBuffer of a heap slice: %v, want ErrInvalidArgument", err)
	}
	if err := FreeBuffer(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("FreeBuffer(nil): %v, want ErrInvalidArgument", err)
	}
}
