package a2a

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// llKillEnv, in the environment of this test binary, names the case of
// TestLLRoundKill9 the process runs as one rank of the group instead of
// the test.
const llKillEnv = "A2A_TEST_LL_KILL"

// llKillCalls is how many calls every rank makes before rank 1 kills itself.
const llKillCalls = 50

// llKillCase is a loop of calls that runs a resolved LL round on shm: call
// makes call k and checks its result; after checks, on rank 0 once its call
// after the kill failed, that the calls took the path under test (shm: the
// LL round can run there, with 2 CPUs or more).
type llKillCase struct {
	name  string
	setup func(c *Comm) (call func(ctx context.Context, k int) error, after func(shm bool) error, err error)
}

var llKillCases = []llKillCase{
	{"persistent", func(c *Comm) (func(context.Context, int) error, func(bool) error, error) {
		u, err := newDirectUse(c, 8)
		if err != nil {
			return nil, nil, err
		}
		call := func(ctx context.Context, k int) error {
			u.fill(k)
			if err := u.p.Start(ctx); err != nil {
				return err
			}
			if err := u.p.Wait(ctx); err != nil {
				return fmt.Errorf("use %d: %w", k, err)
			}
			return u.check(k)
		}
		after := func(shm bool) error {
			if (u.p.ll != nil) != shm {
				return fmt.Errorf("resolved LL round: %v, want %v", u.p.ll != nil, shm)
			}
			if u.p.direct != llKillCalls+1 {
				return fmt.Errorf("%d of %d uses ran in a direct turn, want all", u.p.direct, llKillCalls+1)
			}
			return nil
		}
		return call, after, nil
	}},
	{"blocking", func(c *Comm) (func(context.Context, int) error, func(bool) error, error) {
		u := newBlockUse(c, 8)
		call := func(ctx context.Context, k int) error { return u.call(ctx, k, 0, false) }
		after := func(shm bool) error {
			want := uint64(0)
			if shm {
				want = llKillCalls // the first call only notes the buffers; the killed one ran it too
			}
			if c.plan.llRounds != want {
				return fmt.Errorf("%d calls ran the LL round, want %d", c.plan.llRounds, want)
			}
			return nil
		}
		return call, after, nil
	}},
}

// TestLLRoundKill9 runs 2 rank processes that loop calls running a resolved
// LL round (a persistent AllToAllV in direct turns, blocking AllToAllV calls
// over fixed buffers); then rank 1 kills itself with SIGKILL while rank 0
// waits in its next call, which must fail with ErrPeerLost naming rank 1
// within the heartbeat timeout, not hang. Over TCP and shm.
func TestLLRoundKill9(t *testing.T) {
	if name := os.Getenv(llKillEnv); name != "" {
		if err := llKillRun(name); err != nil {
			fmt.Println("ll-kill:", err)
			os.Exit(1)
		}
		fmt.Println("ll-kill: ok")
		os.Exit(0)
	}
	url := startNATS(t)
	for _, tc := range llKillCases {
		for _, tr := range []string{"tcp", "shm"} {
			t.Run(tc.name+"/"+tr, func(t *testing.T) {
				group := fmt.Sprintf("llkill-%s-%s-%d", tc.name, tr, time.Now().UnixNano())
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				outs, errs := runRankProcs(ctx, "TestLLRoundKill9", llKillEnv+"="+tc.name, url, group, tr, 2)
				if !killedBySIGKILL(errs[1]) {
					t.Errorf("rank 1: %v, want killed by SIGKILL\n%s", errs[1], outs[1])
				}
				if errs[0] != nil || !strings.Contains(outs[0], "ll-kill: ok") {
					t.Errorf("rank 0: %v\n%s", errs[0], outs[0])
				}
			})
		}
	}
}

// llKillRun is one rank of TestLLRoundKill9's case name.
func llKillRun(name string) error {
	i := slices.IndexFunc(llKillCases, func(tc llKillCase) bool { return tc.name == name })
	if i < 0 {
		return fmt.Errorf("no case %q", name)
	}
	c, ctx, cancel, err := joinRankProc()
	if err != nil {
		return err
	}
	defer cancel()
	defer c.Close()
	call, after, err := llKillCases[i].setup(c)
	if err != nil {
		return err
	}
	for k := range llKillCalls {
		if err := call(ctx, k); err != nil {
			return err
		}
	}
	if c.Rank() == 1 {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	start := time.Now()
	if err := call(ctx, llKillCalls); !errors.Is(err, ErrPeerLost) || !namesRank(err, 1) {
		return fmt.Errorf("call after rank 1 was killed: %v, want ErrPeerLost naming rank 1", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		return fmt.Errorf("the call failed after %v", d)
	}
	return after(c.cfg.Transport == "shm" && runtime.NumCPU() >= 2)
}
