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

// directKillEnv, in the environment of this test binary, makes
// TestPersistentDirectKill9 one rank of the group instead of the test.
const directKillEnv = "A2A_TEST_DIRECT_KILL_RANK"

// TestPersistentDirectKill9 runs 2 rank processes that reuse a persistent
// AllToAllV in direct turns; then rank 1 kills itself with SIGKILL while
// rank 0 waits in its next use, which must fail with ErrPeerLost naming
// rank 1 within the heartbeat timeout, not hang. Over TCP and shm.
func TestPersistentDirectKill9(t *testing.T) {
	if os.Getenv(directKillEnv) != "" {
		if err := directKillRun(); err != nil {
			fmt.Println("direct-kill:", err)
			os.Exit(1)
		}
		fmt.Println("direct-kill: ok")
		os.Exit(0)
	}
	url := startNATS(t)
	for _, tr := range []string{"tcp", "shm"} {
		t.Run(tr, func(t *testing.T) {
			group := fmt.Sprintf("dkill-%s-%d", tr, time.Now().UnixNano())
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			outs, errs := make([]string, 2), make([]error, 2)
			var wg sync.WaitGroup
			for r := range 2 {
				cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestPersistentDirectKill9$")
				cmd.Env = append(os.Environ(), directKillEnv+"="+strconv.Itoa(r), "A2A_NATS_URL="+url, "A2A_GROUP="+group,
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
			if errs[0] != nil || !strings.Contains(outs[0], "direct-kill: ok") {
				t.Errorf("rank 0: %v\n%s", errs[0], outs[0])
			}
		})
	}
}

func directKillRun() error {
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
	u, err := newDirectUse(c, 8)
	if err != nil {
		return err
	}
	const uses = 50
	for k := range uses {
		u.fill(k)
		if err := u.p.Start(ctx); err != nil {
			return err
		}
		if err := u.p.Wait(ctx); err != nil {
			return fmt.Errorf("use %d: %w", k, err)
		}
		if err := u.check(k); err != nil {
			return err
		}
	}
	if c.Rank() == 1 {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	start := time.Now()
	if err := u.p.Start(ctx); err != nil {
		return err
	}
	if err := u.p.Wait(ctx); !errors.Is(err, ErrPeerLost) || !namesRank(err, 1) {
		return fmt.Errorf("use after rank 1 was killed: %v, want ErrPeerLost naming rank 1", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		return fmt.Errorf("the use failed after %v", d)
	}
	if want := cfg.Transport == "shm" && runtime.NumCPU() >= 2; (u.p.ll != nil) != want {
		return fmt.Errorf("resolved LL round: %v, want %v", u.p.ll != nil, want)
	}
	if u.p.direct != uses+1 {
		return fmt.Errorf("%d of %d uses ran in a direct turn, want all", u.p.direct, uses+1)
	}
	return nil
}
