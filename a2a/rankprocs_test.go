package a2a

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// runRankProcs runs n copies of this test binary as the ranks of one group,
// each running only test with env (NAME=VALUE) set, joined through the
// NATS server at url over transport; it returns each rank's combined
// output and exit error once all have ended, or ctx kills them.
func runRankProcs(ctx context.Context, test, env, url, group, transport string, n int) (outs []string, errs []error) {
	outs, errs = make([]string, n), make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$")
		cmd.Env = append(os.Environ(), env, "A2A_NATS_URL="+url, "A2A_GROUP="+group, "A2A_RANK="+strconv.Itoa(r),
			"A2A_WORLD_SIZE="+strconv.Itoa(n), "A2A_SECRET=s3cret", "A2A_TRANSPORT="+transport)
		cmd.WaitDelay = 5 * time.Second
		wg.Go(func() {
			out, err := cmd.CombinedOutput()
			outs[r], errs[r] = string(out), err
		})
	}
	wg.Wait()
	return outs, errs
}

// killedBySIGKILL reports whether a rank process's exit error says SIGKILL
// ended it.
func killedBySIGKILL(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
}

// joinRankProc joins the group of a rank process runRankProcs started, from
// its environment, with heartbeats and timeouts short enough that a killed
// peer is noticed within a test; ctx is bounded, and cancel and Close are
// the caller's.
func joinRankProc() (*Comm, context.Context, context.CancelFunc, error) {
	cfg, err := ConfigFromEnv()
	if err != nil {
		return nil, nil, nil, err
	}
	cfg.HeartbeatInterval, cfg.PeerTimeout, cfg.Timeout, cfg.Logger = 100*time.Millisecond, time.Second, 20*time.Second, discard
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	c, err := Join(ctx, cfg)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return c, ctx, cancel, nil
}
