package tcp

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// TestConnectOutOfDescriptors: ranks that run out of file descriptors while
// they connect (dialing or accepting) fail with ErrResource naming
// themselves, at once; no rank blames its peer (ErrPeerLost), which is how
// a healthy rank used to be reported lost. Both ranks are in this process,
// under a descriptor limit a few short of their 2 x 16 connections.
func TestConnectOutOfDescriptors(t *testing.T) {
	const streams = 16
	ls, addrs := listenAll(t, []Config{testConfig(t, 0, 2, streams), testConfig(t, 1, 2, streams)})
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = uint64(len(fds) + streams + streams/2)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	// The rank that runs out fails; the other is released by its peer's
	// failure or, here without a control plane, by its context: a timeout,
	// never a lost peer.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	ts, errs := connectAll(ctx, ls, addrs)
	took := time.Since(start)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	for _, tr := range ts {
		if tr != nil {
			tr.Close()
		}
	}
	exhausted := 0
	for r, err := range errs {
		t.Logf("rank %d: %v", r, err)
		var fe *fault.Error
		switch {
		case err == nil:
			t.Errorf("rank %d connected %d streams under a limit short of them", r, streams)
		case errors.Is(err, fault.ErrPeerLost):
			t.Errorf("rank %d blamed its peer for its own shortage: %v", r, err)
		case errors.Is(err, fault.ErrResource):
			exhausted++
			if !errors.As(err, &fe) || fe.Rank != r || !strings.Contains(err.Error(), "out of file descriptors") {
				t.Errorf("rank %d: %v, want ErrResource naming rank %d and its descriptors", r, err, r)
			}
		case !errors.Is(err, fault.ErrTimeout):
			t.Errorf("rank %d: %v, want ErrResource or a timeout", r, err)
		}
	}
	if exhausted == 0 {
		t.Errorf("no rank reported ErrResource (took %v)", took)
	}
}
