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
// ErrPeerLost in the child; all three survivors must see it in the parent,
// which holds rank 3, while the child of ranks 0 and 1, which does not,
// goes on working. Then the survivors recover as Shrink's refusal on a
// child tells them to: they close their children, shrink the parent to
// the three of them, split it again and exchange over both levels. Over
// TCP and shared memory.
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
	}
	if err := c.Barrier(ctx); !errors.Is(err, ErrPeerLost) {
		return fmt.Errorf("parent Barrier after rank 3 was killed: %v, want ErrPeerLost", err)
	}
	if c.Rank() < 2 {
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
	}
	return splitKillRecover(ctx, c, kid)
}

// splitKillRecover is the survivors' recovery in TestSplitKill9: a child
// refuses Shrink with ErrInvalidArgument, so they close it, shrink the
// parent and split the survivors' communicator again ({0,1} and {2} in the
// new numbering), then exchange, verified, over both levels.
func splitKillRecover(ctx context.Context, c, kid *Comm) error {
	if _, err := kid.Shrink(ctx); !errors.Is(err, ErrInvalidArgument) {
		return fmt.Errorf("Shrink of a child: %v, want ErrInvalidArgument", err)
	}
	kid.Close()
	nc, err := c.Shrink(ctx)
	if err != nil {
		return fmt.Errorf("Shrink of the parent: %w", err)
	}
	defer nc.Close()
	if nc.Size() != 3 || nc.FormerRanks()[nc.Rank()] != c.Rank() {
		return fmt.Errorf("shrunk to rank %d of %d, former ranks %v; want 3 ranks, this one formerly %d", nc.Rank(), nc.Size(), nc.FormerRanks(), c.Rank())
	}
	kid2, err := nc.Split(ctx, nc.Rank()/2, nc.Rank())
	if err != nil {
		return fmt.Errorf("Split after the Shrink: %w", err)
	}
	defer kid2.Close()
	for round := range 3 {
		if err := splitExchange(ctx, kid2, 4, round, 40); err != nil {
			return fmt.Errorf("the new child: %w", err)
		}
		if err := splitExchange(ctx, nc, 5, round, 40); err != nil {
			return fmt.Errorf("the shrunk parent: %w", err)
		}
	}
	return nil
}
