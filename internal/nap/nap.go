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

// timerSlack is the timer slack For sets on its thread, in nanoseconds. The
// kernel's default of 50 us may add that much to every sleep: a 20 us nap
// took 88-94 us with it on the 2-core VM, 37-47 us with 1 us.
const timerSlack = 1000

// For blocks the calling thread for d in nanosleep, as a thread waiting for
// a device kernel does (a cgo call into a driver is the same to the Go
// runtime: a system call, during which its P serves other goroutines). A
// signal that interrupts the sleep does not shorten it.
//
// For first sets the thread's timer slack to 1 us. The setting stays with
// the thread; it only makes the runtime's own timed waits on it, when the
// thread serves other goroutines later, as exact.
func For(d time.Duration) {
	if d <= 0 {
		return
	}
	unix.Prctl(unix.PR_SET_TIMERSLACK, timerSlack, 0, 0, 0)
	ts := unix.NsecToTimespec(d.Nanoseconds())
	for unix.Nanosleep(&ts, &ts) == unix.EINTR {
	}
}
