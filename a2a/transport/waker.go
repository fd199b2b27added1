package transport

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// Waker is the eventfd with which Wake ends a transport's Wait from any
// goroutine: Wait sleeps on it beside the transport's other descriptors
// (in one epoll set). The eventfd is level-triggered, so a Wake before the
// sleep still ends it, until Clear. Wake may come at any time, also after
// Close; Clear and FD only while the transport's own guard keeps the Waker
// from being closed.
type Waker struct {
	fd    int
	one   [8]byte // the increment Wake writes
	guard Guard   // keeps fd open for Wake
}

// NewWaker creates a Waker: a non-blocking, close-on-exec eventfd.
func NewWaker() (*Waker, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	w := &Waker{fd: fd}
	binary.NativeEndian.PutUint64(w.one[:], 1)
	return w, nil
}

// FD is the eventfd, readable from the first Wake until Clear.
func (w *Waker) FD() int { return w.fd }

// Wake makes the eventfd readable; after Close it does nothing. It never
// blocks: a counter at its maximum is readable already.
func (w *Waker) Wake() {
	if !w.guard.Acquire() {
		return
	}
	unix.Write(w.fd, w.one[:])
	w.guard.Release()
}

// Clear takes in the Wakes so far, so that the eventfd stops being
// readable. It never blocks.
func (w *Waker) Clear() {
	var b [8]byte
	unix.Read(w.fd, b[:])
}

// Close closes the eventfd once no Wake uses it. It is idempotent.
func (w *Waker) Close() error {
	if !w.guard.Shut() {
		return nil
	}
	w.guard.Drain(nil)
	return unix.Close(w.fd)
}
