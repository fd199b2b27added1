package transport

import (
	"testing"

	"golang.org/x/sys/unix"
)

// A Waker's eventfd is readable from the first Wake until Clear, however
// many Wakes came in between; after Close, Wake does nothing and Close
// again neither.
func TestWaker(t *testing.T) {
	w, err := NewWaker()
	if err != nil {
		t.Fatal(err)
	}
	readable := func() bool {
		fds := []unix.PollFd{{Fd: int32(w.FD()), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	if readable() {
		t.Fatal("readable before any Wake")
	}
	w.Wake()
	w.Wake()
	if !readable() {
		t.Fatal("not readable after Wake")
	}
	w.Clear()
	if readable() {
		t.Fatal("readable after Clear")
	}
	w.Clear() // nothing to take: must not block
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w.Wake() // after Close: nothing, and no write to a reused descriptor
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
