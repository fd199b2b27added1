package dispatch

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/internal/nap"
	"github.com/a2a-moe/a2a/routing"
)

// lateWorkerEnv makes the test binary run as one rank of
// BenchmarkDecodeLatePeer: its value is "URL GROUP RANK STEPS".
const lateWorkerEnv = "DISPATCH_LATE_WORKER"

// lateBy is how late rank 1 starts each step of BenchmarkDecodeLatePeer:
// past rank 0's spin and millisecond of yielding, so rank 0 waits in naps.
const lateBy = 3 * time.Millisecond

// BenchmarkDecodeLatePeer: how soon a decode step's waiter sees a peer that
// comes late, in two rank processes on one host (each process idle but for
// its rank, as in a deployment: a waiter in time.Sleep would wake in the
// runtime poller's whole milliseconds). Rank 1 starts each step 3 ms after
// rank 0, its thread blocked as while it waits for its device; its own
// step then waits for rank 0's combine outputs, which rank 0 computes once
// its waiter has seen rank 1's rows. The metric is the p50 of rank 1's step.
func BenchmarkDecodeLatePeer(b *testing.B) {
	url, group := startNATS(b), "late"+strconv.FormatInt(time.Now().UnixNano(), 36)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	steps := max(b.N, 20)
	cmds := make([]*exec.Cmd, 2)
	outs, errOuts := make([]bytes.Buffer, 2), make([]bytes.Buffer, 2)
	for r := range cmds {
		cmds[r] = exec.CommandContext(ctx, os.Args[0], "-test.run=^$", "-test.bench=^$")
		cmds[r].Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d %d", lateWorkerEnv, url, group, r, steps))
		cmds[r].Stdout, cmds[r].Stderr = &outs[r], &errOuts[r]
		cmds[r].WaitDelay = 5 * time.Second
		if err := cmds[r].Start(); err != nil {
			b.Fatal(err)
		}
	}
	for r, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			b.Fatalf("rank %d: %v\n%s", r, err, errOuts[r].String())
		}
	}
	p50, err := strconv.ParseFloat(strings.TrimSpace(outs[1].String()), 64)
	if err != nil {
		b.Fatalf("rank 1 printed %q: %v", outs[1].String(), err)
	}
	b.ReportMetric(p50, "late-peer-step_p50_us")
}

// lateWorker is one rank of BenchmarkDecodeLatePeer. Rank 1 prints the p50
// of its steps, in microseconds.
func lateWorker(spec string) error {
	f := strings.Fields(spec)
	if len(f) != 4 {
		return fmt.Errorf("%s=%q: want 4 fields", lateWorkerEnv, spec)
	}
	rank, _ := strconv.Atoi(f[2])
	steps, _ := strconv.Atoi(f[3])
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	c, err := a2a.Join(ctx, a2a.Config{NATSURL: f[0], Group: f[1], Rank: rank, WorldSize: 2, Logger: discard,
		HeartbeatInterval: time.Second, PeerTimeout: 10 * time.Second, Report: -1})
	if err != nil {
		return err
	}
	defer c.Close()
	const experts, k, tokens, hidden = 8, 2, 4, 256
	dt := reduce.BFloat16
	d, err := New(ctx, c, Config{Experts: experts, K: k, Hidden: hidden, DType: dt, MaxTokens: tokens, Logger: discard})
	if err != nil {
		return err
	}
	defer d.Close()
	br := &benchRank{tokens: make([]byte, tokens*hidden*dt.Size()), out: make([]byte, tokens*hidden*dt.Size()), logits: make([]float32, tokens*experts)}
	if err := routing.SkewedLogits(rand.New(rand.NewPCG(7, uint64(rank))), tokens, experts, 0, br.logits); err != nil {
		return err
	}
	in := make([]*benchRank, 2)
	in[rank] = br
	ds := make([]*Dispatcher, 2)
	ds[rank] = d
	step := moeStep(ds, in, routing.Gate{Experts: experts, K: k})
	for range 3 {
		if err := step(rank); err != nil {
			return err
		}
	}
	times := make([]time.Duration, 0, steps)
	for range steps {
		if rank == 1 {
			nap.For(lateBy)
		}
		t0 := time.Now()
		if err := step(rank); err != nil {
			return err
		}
		times = append(times, time.Since(t0))
	}
	if rank == 1 {
		slices.Sort(times)
		fmt.Println(float64(times[len(times)/2].Nanoseconds()) / 1e3)
	}
	return nil
}
