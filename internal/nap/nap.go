// Package nap keeps a thread off the CPU for a short, exact time.
//
// time.Sleep does not do that for durations under a millisecond: once every
// goroutine of a process is parked, the runtime waits for its next timer in
// epoll_wait, whose timeout is in whole milliseconds (runtime.netpoll rounds
// any wait under 1 ms up to 1 ms). A 20 us time.Sleep in an idle process
// lasts about a millisecond. A waiter that polls between short sleeps, or a
// benchmark that models a thread blocked on a device, needs the kernel's
// timer instead.
package nap

import (
	"time"

	"golang.org/x/sys/unix"
)

// For blocks the calling thread for d in nanosleep, as a thread waiting for
// a device kernel does (a cgo call into a driver is the same to the Go
// runtime: a system call, during which its P serves other goroutines). A
// signal that interrupts the sleep does not shorten it.
func For(d time.Duration) {
	if d <= 0 {
		return
	}
	ts := unix.NsecToTimespec(d.Nanoseconds())
	for unix.Nanosleep(&ts, &ts) == unix.EINTR {
	}
}
