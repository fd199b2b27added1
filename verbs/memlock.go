package verbs

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrMemlock is matched by the error of a registration that RLIMIT_MEMLOCK forbids.
var ErrMemlock = errors.New("RLIMIT_MEMLOCK too low for RDMA memory registration")

// capIPCLock is CAP_IPC_LOCK's bit: with it the kernel ignores RLIMIT_MEMLOCK for pinning.
const capIPCLock = 14

// CheckMemlock says whether the process may pin need more bytes: nil when RLIMIT_MEMLOCK
// is unlimited or at least need, or the process has CAP_IPC_LOCK; else an error matching
// ErrMemlock that says how to raise the limit. (The limit covers all pinned memory of the
// process, so a need below it can still fail when much is registered already.)
func CheckMemlock(need uint64) error {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return nil // cannot tell: let the registration say
	}
	if rl.Cur == unix.RLIM_INFINITY || rl.Cur >= need || hasCapIPCLock() {
		return nil
	}
	return fmt.Errorf("%w: the limit is %d bytes, registering %d needs more: raise it "+
		"(ulimit -l unlimited; systemd LimitMEMLOCK=infinity; docker --ulimit memlock=-1; "+
		"/etc/security/limits.conf memlock)", ErrMemlock, rl.Cur, need)
}

// hasCapIPCLock reads the effective capabilities from /proc/self/status.
func hasCapIPCLock() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<capIPCLock) != 0
		}
	}
	return false
}
