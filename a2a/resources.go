package a2a

import (
	"os"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// descriptorHeadroom is what a rank keeps free beyond its data-plane links:
// the runtime's poller, NATS reconnects, a metrics listener, the
// application's own files.
const descriptorHeadroom = 16

// checkDescriptors fails with ErrResource, before any connection is made,
// when this rank's descriptor limit cannot hold the need descriptors its
// data-plane links will open. Failing here names the shortage and the fix;
// running out half-way would leave peers waiting for connections that
// never come. It checks nothing when the limit or the open count is
// unknown.
func checkDescriptors(rank, need int) error {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > 1<<30 {
		return nil
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	open := len(fds) - 1 // ReadDir's own descriptor
	free := int(lim.Cur) - open
	if need+descriptorHeadroom <= free {
		return nil
	}
	return fault.New(fault.ErrResource, rank,
		"rank %d is out of file descriptors: its data-plane links need %d and it has %d free (%d open, limit %d): raise ulimit -n to at least %d, or lower A2A_STREAMS",
		rank, need, free, open, lim.Cur, open+need+descriptorHeadroom)
}
