package fault

import (
	"errors"
	"os"
	"syscall"
)

// LocalResource names the local resource err says this process ran out of
// ("file descriptors", "memory", ...), or returns "" when err is not such a
// failure. Running out is this rank's condition, never a peer's: a caller
// that would retry a failure as a peer not answering yet, or report it as a
// lost peer, checks this first.
func LocalResource(err error) string {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return ""
	}
	switch errno {
	case syscall.EMFILE:
		return "file descriptors (its RLIMIT_NOFILE, ulimit -n)"
	case syscall.ENFILE:
		return "file descriptors (the system's limit, fs.file-max)"
	case syscall.ENOMEM:
		return "memory"
	case syscall.ENOSPC:
		return "space"
	case syscall.ENOBUFS:
		return "socket buffers"
	case syscall.EAGAIN:
		// EAGAIN is a resource failure only from calls that allocate: no
		// local port left (connect), locked memory over RLIMIT_MEMLOCK
		// (mmap, mlock); elsewhere it means "try again".
		var se *os.SyscallError
		if errors.As(err, &se) {
			switch se.Syscall {
			case "socket", "connect":
				return "local ports"
			case "mmap", "mlock":
				return "locked memory (RLIMIT_MEMLOCK, ulimit -l)"
			}
		}
	}
	return ""
}

// Exhausted returns an ErrResource for rank, which ran out of the resource
// err names (LocalResource), wrapping err.
func Exhausted(rank int, err error, format string, args ...any) *Error {
	e := Wrap(ErrResource, rank, err, format, args...)
	if what := LocalResource(err); what != "" {
		e.Detail += ": out of " + what
	}
	return e
}
