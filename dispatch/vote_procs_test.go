package dispatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/routing"
)

// voteWorkerEnv makes the test binary run as one rank of
// TestReplaceKilledInVote instead of running the tests: its value is
// "URL GROUP RANK SIZE LOST AFTER".
const voteWorkerEnv = "DISPATCH_VOTE_WORKER"

func TestMain(m *testing.M) {
	for env, worker := range map[string]func(string) error{voteWorkerEnv: voteWorker, lateWorkerEnv: lateWorker} {
		if spec := os.Getenv(env); spec != "" {
			if err := worker(spec); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
	os.Exit(m.Run())
}

// votePlacements are the placements of TestReplaceKilledInVote: the
// contiguous one of replaceLayer over 4 ranks, and one with replicas.
func votePlacements() (pl0, pl1 *routing.Placement) {
	pl0, _ = routing.Contiguous(replaceLayer.experts, 4)
	pl1, _ = routing.FromSlots(replaceLayer.experts, 4, []int{0, 1, 7, 0, 2, 3, 0, 4, 5, 1, 6, 7})
	return pl0, pl1
}

// TestReplaceKilledInVote runs four rank processes (this test binary) that
// re-place the experts, and kills one of them with SIGKILL in Replace's vote
// after it sent its vote to none, some or all of its peers (rank 0 hosts the
// group's coordinator, and dies with it). Every survivor must end Replace
// switched, its next step failing with ErrPeerLost, or with ErrPeerLost and
// not switched; shrink the group; settle on the same placement as every
// other survivor; and run a verified step on a dispatcher built on that
// placement's Shrink.
func TestReplaceKilledInVote(t *testing.T) {
	url := startNATS(t)
	_, pl1 := votePlacements()
	mixed := 0
	for _, tc := range []struct{ lost, after int }{{1, 0}, {1, 1}, {1, 2}, {1, 3}, {2, 1}, {3, 2}, {0, 1}, {0, 2}} {
		t.Run(fmt.Sprintf("rank %d after %d votes", tc.lost, tc.after), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			group := "vote" + strconv.FormatInt(time.Now().UnixNano(), 36)
			cmds := make([]*exec.Cmd, 4)
			outs := make([]bytes.Buffer, 4)
			errOuts := make([]bytes.Buffer, 4)
			for r := range cmds {
				cmds[r] = exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
				cmds[r].Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d 4 %d %d", voteWorkerEnv, url, group, r, tc.lost, tc.after))
				cmds[r].Stdout, cmds[r].Stderr = &outs[r], &errOuts[r]
				cmds[r].WaitDelay = 5 * time.Second
				if err := cmds[r].Start(); err != nil {
					t.Fatal(err)
				}
			}
			settled, switched := map[string]int{}, 0
			for r, cmd := range cmds {
				err := cmd.Wait()
				var exit *exec.ExitError
				if r == tc.lost {
					if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
						t.Errorf("rank %d, to be killed in its vote: %v\n%s", r, err, errOuts[r].String())
					}
					continue
				}
				if err != nil {
					t.Errorf("survivor %d: %v\n%s", r, err, errOuts[r].String())
					continue
				}
				var sw bool
				var hash string
				if _, err := fmt.Sscanf(outs[r].String(), "switched %t settled %s", &sw, &hash); err != nil {
					t.Errorf("survivor %d's report %q: %v", r, outs[r].String(), err)
				}
				settled[hash]++
				if sw {
					switched++
				}
			}
			if len(settled) != 1 {
				t.Errorf("the survivors settled on %d placements (fingerprint: survivors): %v", len(settled), settled)
			}
			if switched > 0 && switched < 3 {
				mixed++
			}
			if switched > 0 && settled[strconv.FormatUint(placementHash(pl1), 16)] != 3 {
				t.Errorf("%d survivors switched, yet not all settled on the new placement: %v", switched, settled)
			}
		})
	}
	t.Logf("%d runs left some survivors switched and others not before Settle", mixed)
}

// voteWorker is one rank of TestReplaceKilledInVote (see voteWorkerEnv).
// It prints whether its Replace switched and the fingerprint of the
// placement it settled on.
func voteWorker(spec string) error {
	f := strings.Fields(spec)
	if len(f) != 6 {
		return fmt.Errorf("%s=%q: want 6 fields", voteWorkerEnv, spec)
	}
	var n [4]int
	for i := range n {
		n[i], _ = strconv.Atoi(f[2+i])
	}
	rank, size, lost, after := n[0], n[1], n[2], n[3]
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	c, err := a2a.Join(ctx, a2a.Config{NATSURL: f[0], Group: f[1], Rank: rank, WorldSize: size, Secret: "s3cret", Logger: discard,
		HeartbeatInterval: 100 * time.Millisecond, PeerTimeout: time.Second, Timeout: 20 * time.Second})
	if err != nil {
		return err
	}
	defer c.Close()
	l := replaceLayer
	pl0, pl1 := votePlacements()
	store := newParamStore(pl0, rank)
	d, err := New(ctx, c, replaceConfig(l, pl0))
	if err != nil {
		return err
	}
	if err := replicaStep(d, l, rank, 0, store); err != nil {
		return err
	}
	if rank == lost {
		d.replicas.voteSent = func(sent int) {
			if sent == after {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
	}
	err = d.Replace(ctx, pl1, store)
	switched := err == nil
	if switched {
		if d.Placement() != pl1 {
			return fmt.Errorf("Replace succeeded without switching")
		}
		if err = replicaStep(d, l, rank, 1, store); err == nil {
			return fmt.Errorf("a step after the loss succeeded")
		}
	} else if d.Placement() != pl0 {
		return fmt.Errorf("Replace failed (%v) and switched", err)
	}
	if !errors.Is(err, a2a.ErrPeerLost) {
		return fmt.Errorf("switched %v: %v, want ErrPeerLost", switched, err)
	}
	d.Close()
	c2, err := c.Shrink(ctx)
	if err != nil {
		return err
	}
	defer c2.Close()
	if err := d.Settle(ctx, c2); err != nil {
		return err
	}
	spl, err := d.Placement().Shrink(c2.FormerRanks())
	if err != nil {
		return err
	}
	d2, err := New(ctx, c2, replaceConfig(l, spl))
	if err != nil {
		return fmt.Errorf("the dispatcher after the shrink: %w", err)
	}
	defer d2.Close()
	if err := replicaStep(d2, l, c2.Rank(), 2, newParamStore(spl, c2.Rank())); err != nil {
		return fmt.Errorf("the step after the shrink: %w", err)
	}
	fmt.Printf("switched %t settled %x\n", switched, placementHash(d.Placement()))
	return nil
}
