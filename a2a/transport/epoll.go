package transport

import (
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// EpollWait waits for events on epfd at most timeout (<= 0: poll once). It
// keeps sub-millisecond timeouts with epoll_pwait2: a composed transport
// parks on one part for 100 us at a time while another may become ready, and
// epoll_wait's whole milliseconds made that a 1 ms sleep. noPwait2 is set for
// good by the first ENOSYS (kernels before 5.11).
func EpollWait(epfd int, evs []unix.EpollEvent, timeout time.Duration, noPwait2 *atomic.Bool) (int, error) {
	if timeout > 0 && timeout < time.Second && !noPwait2.Load() {
		ts := unix.NsecToTimespec(int64(timeout))
		n, _, errno := unix.Syscall6(unix.SYS_EPOLL_PWAIT2, uintptr(epfd), uintptr(unsafe.Pointer(&evs[0])), uintptr(len(evs)),
			uintptr(unsafe.Pointer(&ts)), 0, 0)
		if errno != unix.ENOSYS {
			if errno != 0 {
				return 0, errno
			}
			return int(n), nil
		}
		noPwait2.Store(true)
	}
	ms := 0
	if timeout > 0 {
		ms = int(min((timeout+time.Millisecond-1)/time.Millisecond, math.MaxInt32))
	}
	return unix.EpollWait(epfd, evs, ms)
}
