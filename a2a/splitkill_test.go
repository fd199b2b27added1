package a2a

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// splitKillEnv, in the environment of this test binary, makes
// TestSplitKill9 one rank of the group instead of the test (see
// splitKillRank).
const splitKillEnv = "A2A_TEST_SPLIT_KILL_RANK"

// TestSplitKill9 runs 4 rank processes split into halves {0,1} and {2,3};
// once they have exchanged over both levels, rank 3 kills itself with
// SIGKILL, as kill -9 would. Rank 2, its partner in the child, must see
// ErrPeerLost in the child; ranks 0 and 1 must see it in the parent, which
// holds rank 3, while their own child, which does not, goes on working.
// Over TCP and shared memory.
func TestSplitKill9(t *testing.T) {
	if os.Getenv(splitKillEnv) != "" {
		os.Exit(splitKillRank())
	}
	url := startNATS(t)
	for _, tr := range []string{"tcp", "shm"} {
		t.Run(tr, func(t *testing.T) {
			group := fmt.Sprintf("kill-%s-%d", tr, time.Now().UnixNano())
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			outs, errs := runRankProcs(ctx, "TestSplitKill9", splitKillEnv+"=1", url, group, tr, 4)
			if !killedBySIGKILL(errs[3]) {
				t.Errorf("rank 3: %v, want killed by SIGKILL\n%s", errs[3], outs[3])
			}
			for r := range 3 {
				if errs[r] != nil || !strings.Contains(outs[r], "split-kill: ok") {
					t.Errorf("rank %d: %v\n%s", r, errs[r], outs[r])
				}
			}
		})
	}
}

// splitKillRank is one rank of TestSplitKill9 (its process); it returns
// the exit status.
func splitKillRank() int {
	if err := splitKillRun(); err != nil {
		fmt.Println("split-kill:", err)
		return 1
	}
	fmt.Println("split-kill: ok")
	return 0
}

func splitKillRun() error {
	c, ctx, cancel, err := joinRankProc()
	if err != nil {
		return err
	}
	defer cancel()
	defer c.Close()
	kid, err := c.Split(ctx, c.Rank()/2, c.Rank())
	if err != nil {
		return err
	}
	defer kid.Close()
	for round := range 3 {
		if err := splitExchange(ctx, kid, 1, round, 40); err != nil {
			return err
		}
		if err := splitExchange(ctx, c, 2, round, 40); err != nil {
			return err
		}
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	switch c.Rank() {
	case 3:
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	case 2:
		if err := kid.Barrier(ctx); !errors.Is(err, ErrPeerLost) {
			return fmt.Errorf("child Barrier after its peer was killed: %v, want ErrPeerLost", err)
		}
		return nil
	}
	if err := c.Barrier(ctx); !errors.Is(err, ErrPeerLost) {
		return fmt.Errorf("parent Barrier after rank 3 was killed: %v, want ErrPeerLost", err)
	}
	// The child of ranks 0 and 1 holds no lost rank: it goes on.
	for round := range 3 {
		if err := splitExchange(ctx, kid, 3, round, 40); err != nil {
			return fmt.Errorf("the child without the lost rank, after the loss: %w", err)
		}
	}
	send := binary.LittleEndian.AppendUint64(nil, 1)
	recv := make([]byte, 8)
	if err := kid.AllReduce(ctx, send, recv, Int64, Sum); err != nil || binary.LittleEndian.Uint64(recv) != 2 {
		return fmt.Errorf("the child's AllReduce after the loss: %v (%d)", err, binary.LittleEndian.Uint64(recv))
	}
	return nil
}
