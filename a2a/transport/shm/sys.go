package shm

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// futex operations. The doorbells live in MAP_SHARED file mappings used by
// several processes, so the operations are the shared (non-private) ones.
const (
	futexWaitOp = 0 // FUTEX_WAIT
	futexWakeOp = 1 // FUTEX_WAKE
)

// futexWait sleeps while *word == val, at most timeout. It returns EINTR
// when a signal interrupted the sleep.
func futexWait(word *atomic.Uint32, val uint32, timeout time.Duration) unix.Errno {
	ts := unix.NsecToTimespec(int64(timeout))
	// Syscall, not RawSyscall: the thread blocks, so the runtime must be able
	// to hand its P to other goroutines (in-process ranks among them).
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWaitOp, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
	return errno
}

// futexWake wakes every waiter on word.
func futexWake(word *atomic.Uint32) {
	unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWakeOp, uintptr(1<<31-1), 0, 0, 0)
}

// ring rings the doorbell of seg if a waiter is parked on it. A waiter
// announces itself in seg.sleeping before it re-checks the rings and parks;
// the caller published its ring update before ringing. With sequentially
// consistent atomics one of the two sees the other's store, so no wake-up is
// lost, and the busy path costs one load of a line that is rarely written.
func ringBell(seg *segment) {
	if seg.sleeping.Load() != 0 {
		seg.bell.Add(1)
		futexWake(seg.bell)
	}
}

// cmaRead copies len(dst) bytes at remote in process pid into dst with one
// process_vm_readv. It returns the bytes copied (the kernel may stop short at
// a page it cannot read) and the errno.
func cmaRead(pid int, dst []byte, remote uint64, liov *unix.Iovec, riov *unix.RemoteIovec) (int, unix.Errno) {
	liov.Base = &dst[0]
	liov.SetLen(len(dst))
	riov.Base = uintptr(remote)
	riov.Len = len(dst)
	// Syscall, not RawSyscall: the copy may fault pages in and take long.
	n, _, errno := unix.Syscall6(unix.SYS_PROCESS_VM_READV, uintptr(pid),
		uintptr(unsafe.Pointer(liov)), 1, uintptr(unsafe.Pointer(riov)), 1, 0)
	liov.Base = nil // do not pin the caller's buffer
	return int(n), errno
}

// addrOf is the address of b's first byte, for a peer's process_vm_readv. Go's
// heap does not move objects, and the op holding b keeps it alive.
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// exited reports whether the process behind pidfd has exited (zombies
// included), without blocking.
func exited(pfd *unix.PollFd) bool {
	pfd.Revents = 0
	var ts unix.Timespec
	n, _, errno := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(pfd)), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	return errno == 0 && n > 0 && pfd.Revents&(unix.POLLIN|unix.POLLHUP|unix.POLLERR) != 0
}
