package a2a

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// blockKillEnv, in the environment of this test binary, makes
// TestBlockingLLRoundKill9 one rank of the group instead of the test.
const blockKillEnv = "A2A_TEST_BLOCK_KILL_RANK"

// TestBlockingLLRoundKill9 runs 2 rank processes that loop blocking
// AllToAllV calls over fixed buffers (on shm, the cached LL round); then
// rank 1 kills itself with SIGKILL while rank 0 waits in its next call,
// which must fail with ErrPeerLost naming rank 1 within the heartbeat
// timeout, not hang. Over TCP and shm.
func TestBlockingLLRoundKill9(t *testing.T) {
	if os.Getenv(blockKillEnv) != "" {
		if err := blockKillRun(); err != nil {
			fmt.Println("block-kill:", err)
			os.Exit(1)
		}
		fmt.Println("block-kill: ok")
		os.Exit(0)
	}
	url := startNATS(t)
	for _, tr := range []string{"tcp", "shm"} {
		t.Run(tr, func(t *testing.T) {
			group := fmt.Sprintf("bkill-%s-%d", tr, time.Now().UnixNano())
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			outs, errs := make([]string, 2), make([]error, 2)
			var wg sync.WaitGroup
			for r := range 2 {
				cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBlockingLLRoundKill9$")
				cmd.Env = append(os.Environ(), blockKillEnv+"="+strconv.Itoa(r), "A2A_NATS_URL="+url, "A2A_GROUP="+group,
					"A2A_RANK="+strconv.Itoa(r), "A2A_WORLD_SIZE=2", "A2A_SECRET=s3cret", "A2A_TRANSPORT="+tr)
				cmd.WaitDelay = 5 * time.Second
				wg.Go(func() {
					out, err := cmd.CombinedOutput()
					outs[r], errs[r] = string(out), err
				})
			}
			wg.Wait()
			var ee *exec.ExitError
			if !errors.As(errs[1], &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Errorf("rank 1: %v, want killed by SIGKILL\n%s", errs[1], outs[1])
			}
			if errs[0] != nil || !strings.Contains(outs[0], "block-kill: ok") {
				t.Errorf("rank 0: %v\n%s", errs[0], outs[0])
			}
		})
	}
}

func blockKillRun() error {
	cfg, err := ConfigFromEnv()
	if err != nil {
		return err
	}
	cfg.HeartbeatInterval, cfg.PeerTimeout, cfg.Timeout, cfg.Logger = 100*time.Millisecond, time.Second, 20*time.Second, discard
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	c, err := Join(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	u := newBlockUse(c, 8)
	const calls = 50
	for k := range calls {
		if err := u.call(ctx, k, 0, false); err != nil {
			return err
		}
	}
	if c.Rank() == 1 {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	start := time.Now()
	if err := u.call(ctx, calls, 0, false); !errors.Is(err, ErrPeerLost) || !namesRank(err, 1) {
		return fmt.Errorf("call after rank 1 was killed: %v, want ErrPeerLost naming rank 1", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		return fmt.Errorf("the call failed after %v", d)
	}
	want := uint64(0)
	if cfg.Transport == "shm" && runtime.NumCPU() >= 2 {
		want = calls // the first call only notes the buffers; the killed one ran it too
	}
	if c.plan.llRounds != want {
		return fmt.Errorf("%d calls ran the LL round, want %d", c.plan.llRounds, want)
	}
	return nil
}
