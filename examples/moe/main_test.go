package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/transport/shm"
	"github.com/a2a-moe/a2a/internal/natsd"
)

// moeBin is the demo built once for the tests that run it as processes.
var moeBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "moe-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	moeBin = filepath.Join(dir, "moe")
	build := exec.Command("go", "build", "-o", moeBin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the demo:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var discard = slog.New(slog.DiscardHandler)

// runInProcess runs the demo's ranks as goroutines of the test (embedded
// NATS, real loopback sockets) and returns rank 0's output and every rank's
// error.
func runInProcess(t *testing.T, args ...string) (string, []error) {
	t.Helper()
	o, err := parseFlags(append([]string{"--worker"}, args...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := natsd.Start("")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	group := fmt.Sprintf("moe-test-%d", rand.Uint64())
	var out bytes.Buffer
	errs := make([]error, o.ranks)
	var wg sync.WaitGroup
	for r := range o.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := a2a.Config{NATSURL: srv.ClientURL(), Group: group, Rank: r, WorldSize: o.ranks, Secret: "s3cret",
				HeartbeatInterval: 100 * time.Millisecond, PeerTimeout: 2 * time.Second, Timeout: 15 * time.Second}
			w := io.Discard
			if r == 0 {
				w = &out
			}
			errs[r] = runRank(ctx, discard, o, cfg, w)
		}()
	}
	wg.Wait()
	return out.String(), errs
}

var stepLine = regexp.MustCompile(`(?m)^\s*(\d+)\s+(\d+)/(\d+)\s+(\d+)\s+([\d.]+)\s+\S+\s+\S+\s+\S+\s+verified\s+\[([\d ]+)\]$`)

// checkOutput asserts that rank 0 printed every rank's metrics address, one
// verified line per step whose per-expert loads add up to the kept count,
// and the final summary.
func checkOutput(t *testing.T, out string, ranks, steps int) {
	t.Helper()
	for r := range ranks {
		if !regexp.MustCompile(fmt.Sprintf(`(?m)^rank %d metrics http://127\.0\.0\.1:\d+/metrics$`, r)).MatchString(out) {
			t.Errorf("no metrics address of rank %d in:\n%s", r, out)
		}
	}
	lines := stepLine.FindAllStringSubmatch(out, -1)
	if len(lines) != steps {
		t.Fatalf("%d verified step lines, want %d:\n%s", len(lines), steps, out)
	}
	for i, m := range lines {
		var kept, routed, dropped int
		fmt.Sscan(m[2], &kept)
		fmt.Sscan(m[3], &routed)
		fmt.Sscan(m[4], &dropped)
		sum := 0
		for _, f := range strings.Fields(m[6]) {
			var n int
			fmt.Sscan(f, &n)
			sum += n
		}
		if m[1] != fmt.Sprint(i) || sum != kept || kept+dropped != routed {
			t.Errorf("step line %q: loads sum to %d, kept %d, dropped %d, routed %d", m[0], sum, kept, dropped, routed)
		}
	}
	if !strings.Contains(out, fmt.Sprintf("all %d steps verified on %d ranks", steps, ranks)) {
		t.Errorf("no summary in:\n%s", out)
	}
	// The columns are explained, and how to keep the metrics up.
	for _, want := range []string{"\n  imbalance          max/mean of the rows each rank's experts processed", "--hold 1m keeps them up"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}

// TestDemoInProcess runs the demo's rank logic in-process over several
// configurations; each step is verified against the single-process
// reference inside runRank.
func TestDemoInProcess(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ranks int
		args  []string
	}{
		{"defaults-small", 4, []string{"--tokens", "32", "--hidden", "16", "--ffn", "24", "--steps", "3"}},
		{"bf16-nats-zipf-drops", 3, []string{"-n", "3", "--tokens", "40", "--hidden", "8", "--ffn", "8", "--steps", "2",
			"--dtype", "bf16", "--counts", "nats", "--skew", "zipf:1.5", "--capacity", "0.8"}},
		{"microbatches-k3-uneven", 3, []string{"-n", "3", "--experts", "7", "--k", "3", "--tokens", "33", "--hidden", "12",
			"--ffn", "8", "--steps", "2", "--microbatches", "3"}},
		{"rows-alltoallv-microbatches", 3, []string{"-n", "3", "--tokens", "30", "--hidden", "8", "--ffn", "8", "--steps", "2",
			"--microbatches", "2", "--rows", "alltoallv"}},
		{"one-rank", 1, []string{"-n", "1", "--experts", "4", "--tokens", "10", "--hidden", "4", "--ffn", "4", "--steps", "2"}},
		// FP8 rows of more than one scale block, verified within the
		// wire's bound and then against the reference on the FP8 rows.
		{"wire-fp8-bf16-microbatches", 3, []string{"-n", "3", "--tokens", "24", "--hidden", "200", "--ffn", "16", "--steps", "2",
			"--dtype", "bf16", "--wire", "fp8", "--skew", "1", "--microbatches", "2"}},
		// The decode mode: two micro-batches of 128 tokens, both sent
		// before either is awaited, on shared memory and point to point.
		{"decode-microbatches", 4, []string{"--steps", "3", "--microbatches", "2", "--max-tokens", "128"}},
		{"decode-fp8-alltoallv", 3, []string{"-n", "3", "--tokens", "40", "--hidden", "130", "--ffn", "8", "--steps", "3",
			"--wire", "fp8", "--rows", "alltoallv", "--microbatches", "2", "--max-tokens", "20", "--skew", "1"}},
		{"wire-fp8-f32-alltoallv", 3, []string{"-n", "3", "--tokens", "20", "--hidden", "130", "--ffn", "8", "--steps", "2",
			"--wire", "fp8", "--rows", "alltoallv"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errs := runInProcess(t, tc.args...)
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v\n%s", r, err, out)
				}
			}
			steps := 0
			for i, a := range tc.args {
				if a == "--steps" {
					fmt.Sscan(tc.args[i+1], &steps)
				}
			}
			checkOutput(t, out, tc.ranks, steps)
			if slices.Contains(tc.args, "--max-tokens") && !strings.Contains(out, "decode mode (fixed buffers for") {
				t.Errorf("the header does not name the decode mode:\n%s", out)
			}
		})
	}
}

// TestDemoDetectsWrongOutput: one rank alters one output element; every rank
// fails the step, the altered one with the element's details.
func TestDemoDetectsWrongOutput(t *testing.T) {
	out, errs := runInProcess(t, "-n", "3", "--tokens", "16", "--hidden", "8", "--ffn", "8", "--steps", "2", "--corrupt-rank", "2")
	for r, err := range errs {
		want := "verification failed on ranks [2]"
		if r == 2 {
			want = "1 output elements differ from the reference, first: token 0 element 0"
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("rank %d: %v, want an error mentioning %q", r, err, want)
		}
	}
	if !strings.Contains(out, "FAILED on ranks [2]") || strings.Contains(out, "all 2 steps verified") {
		t.Errorf("rank 0's output does not report the failure:\n%s", out)
	}
}

// TestDemoProcesses runs the built demo as the README does: a launcher
// process, an embedded control plane and one process per rank. A verified
// run exits 0; a corrupted one exits non-zero naming the failed rank.
func TestDemoProcesses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	small := []string{"-n", "3", "--tokens", "24", "--hidden", "16", "--ffn", "16", "--steps", "2", "--microbatches", "2"}
	cmd := exec.CommandContext(ctx, moeBin, small...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	checkOutput(t, string(out), 3, 2)
	if !regexp.MustCompile(`(?m)^moe: 3 local ranks, embedded NATS control plane at nats://127\.0\.0\.1:\d+$`).Match(out) {
		t.Errorf("the header does not name the embedded control plane:\n%s", out)
	}

	cmd = exec.CommandContext(ctx, moeBin, append(small, "--corrupt-rank", "1")...)
	cmd.WaitDelay = 5 * time.Second
	out, err = cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("corrupted demo: %v, want a non-zero exit\n%s", err, out)
	}
	if !strings.Contains(string(out), "[rank 1] moe: step 0: verification failed") {
		t.Errorf("corrupted demo output does not name rank 1:\n%s", out)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		t.Errorf("demo killed by %v, want a clean exit status", ws.Signal())
	}
}

// TestDemoExternalNATS runs the demo with --nats: its ranks join through
// that server, and the header names it rather than an embedded one.
func TestDemoExternalNATS(t *testing.T) {
	srv, err := natsd.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, moeBin, "-n", "2", "--tokens", "16", "--hidden", "8", "--ffn", "8", "--steps", "1",
		"--nats", srv.ClientURL())
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	checkOutput(t, string(out), 2, 1)
	want := fmt.Sprintf("moe: 2 local ranks, NATS control plane at %s (--nats)\n", srv.ClientURL())
	if !strings.HasPrefix(string(out), want) || strings.Contains(string(out), "embedded") {
		t.Errorf("output does not start with %q:\n%s", want, out)
	}
	if v, err := srv.Varz(nil); err != nil {
		t.Error(err)
	} else if v.TotalConnections < 2 {
		t.Errorf("the server saw %d connections, want one per rank at least", v.TotalConnections)
	}
}

// TestFlags rejects bad command lines with a message naming the flag.
func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--skew", "zipf:-1"}, "--skew"},
		{[]string{"--skew", "hot"}, "--skew"},
		{[]string{"--dtype", "int32"}, "--dtype"},
		{[]string{"--counts", "carrier-pigeon"}, "--counts"},
		{[]string{"--rows", "sneakernet"}, "--rows"},
		{[]string{"--wire", "fp4"}, "--wire"},
		{[]string{"--wire", "fp8", "--counts", "nats"}, "--wire fp8: needs --counts inband"},
		{[]string{"-n", "0"}, "-n 0"},
		{[]string{"--k", "17"}, "--k 17"},
		{[]string{"--microbatches", "0"}, "--microbatches"},
		{[]string{"--metrics-port", "70000"}, "--metrics-port"},
		{[]string{"--max-tokens", "100"}, "--max-tokens 100: micro-batches of 256 tokens"},
		{[]string{"--max-tokens", "128", "--microbatches", "3"}, "--max-tokens 128: want >= 0; the decode mode needs"},
		{[]string{"--max-tokens", "-1"}, "--max-tokens -1"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--redundant", "4"}, "--redundant 4 --rebalance-every 0"},
		{[]string{"--rebalance-every", "2", "--redundant", "3"}, "--redundant 3: experts 16 plus"},
	} {
		if _, err := parseFlags(tc.args, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error mentioning %q", tc.args, err, tc.want)
		}
	}
	o, err := parseFlags([]string{"--skew", "zipf:1.2", "--dtype", "bf16", "--counts", "nats"}, io.Discard)
	if err != nil || o.skew != 1.2 || o.dtype.String() != "bfloat16" || o.counts.String() != "nats" || o.ranks != 4 || o.experts != 16 || o.k != 2 {
		t.Errorf("parsed %+v, %v", o, err)
	}
}

// TestDemoKilledRank kills one rank process with SIGKILL in the middle of a
// run (rows travel through shared memory between these ranks): the others
// must notice, the demo must exit non-zero within the peer timeout's reach,
// and no rank process nor /dev/shm segment may outlive it.
func TestDemoKilledRank(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	shmBefore := shmSegments(t)
	cmd := exec.CommandContext(ctx, moeBin, "-n", "3", "--tokens", "64", "--hidden", "32", "--ffn", "16",
		"--steps", "100000", "--interval", "5ms")
	cmd.WaitDelay = 5 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	running := make(chan struct{})
	var out strings.Builder
	go func() {
		sc := bufio.NewScanner(stdout)
		once := false
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if !once && strings.Contains(sc.Text(), "verified") {
				once = true
				close(running)
			}
		}
	}()
	select {
	case <-running:
	case <-ctx.Done():
		t.Fatalf("no verified step before the deadline\n%s", stderr.String())
	}
	ranks := children(t, cmd.Process.Pid)
	if len(ranks) != 3 {
		t.Fatalf("launcher has %d children %v, want 3 rank processes", len(ranks), ranks)
	}
	killed := time.Now()
	if err := syscall.Kill(ranks[1], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() <= 0 {
		t.Fatalf("demo with a killed rank: %v, want a non-zero exit\nstdout:\n%s\nstderr:\n%s", err, out.String(), stderr.String())
	}
	if d := time.Since(killed); d > 20*time.Second {
		t.Errorf("demo took %v to exit after the kill", d)
	}
	t.Logf("killed rank 1 (pid %d): demo exited %d after %v; stderr:\n%s", ranks[1], ee.ExitCode(), time.Since(killed).Round(time.Millisecond), stderr.String())
	for _, pid := range ranks {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("rank process %d outlived the demo", pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	checkNoSegmentLeft(t, shmBefore)
}

// children lists the child processes of pid, whichever of its threads
// started them (the kernel lists children per thread).
func children(t *testing.T, pid int) []int {
	t.Helper()
	files, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread exited
		}
		for _, field := range strings.Fields(string(b)) {
			p, err := strconv.Atoi(field)
			if err != nil {
				t.Fatal(err)
			}
			pids = append(pids, p)
		}
	}
	slices.Sort(pids)
	return pids
}

// shmSegments lists the shared-memory transport's segments in its default
// directory, where the demo's ranks create them.
func shmSegments(t *testing.T) map[string]bool {
	t.Helper()
	ents, err := os.ReadDir(shm.DefaultDir)
	if err != nil {
		t.Fatal(err)
	}
	names := make(map[string]bool)
	for _, e := range ents {
		// "a2a-" starts every segment's name; the shm package keeps its
		// constant unexported.
		if strings.HasPrefix(e.Name(), "a2a-") {
			names[e.Name()] = true
		}
	}
	return names
}

// checkNoSegmentLeft fails t if a segment that was not in before is still in
// the directory once the demo has ended. Other packages' tests run at the same
// time and make segments of their own, which they remove within moments; a
// segment the demo leaked never goes. So a new segment counts only if it
// outlives a grace period, and only one that existed when the demo ended.
func checkNoSegmentLeft(t *testing.T, before map[string]bool) {
	t.Helper()
	var left []string
	for name := range shmSegments(t) {
		if !before[name] {
			left = append(left, name)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(left) > 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		now := shmSegments(t)
		left = slices.DeleteFunc(left, func(name string) bool { return !now[name] })
	}
	if len(left) > 0 {
		t.Errorf("a2a segments left in %s after the demo: %v", shm.DefaultDir, left)
	}
}

// TestDemoShrink kills one rank with SIGKILL mid-run (--kill-rank): the
// survivors must shrink the group, re-place its experts, redo the step and
// finish every step verified, the metrics must count the shrink, and
// neither a process nor a /dev/shm segment may outlive the demo. Rows go
// through shared memory or, as between hosts, through AllToAllV.
func TestDemoShrink(t *testing.T) {
	for _, rows := range []string{"auto", "alltoallv"} {
		t.Run(rows, func(t *testing.T) {
			runKilledDemo(t, 6, []string{
				"step 2: lost a rank; shrunk to 3 ranks (former ranks [0 1 3])",
				"metrics: a2a_shrinks_total 1, a2a_membership_size 3",
				"all 6 steps verified on 3 ranks",
			}, "-n", "4", "--tokens", "64", "--hidden", "32", "--ffn", "16",
				"--steps", "6", "--kill-rank", "2", "--kill-step", "2", "--rows", rows)
		})
	}
}

// TestDemoShrinkRelay kills a relay rank (each rank relays for its local
// index on the other hosts) with SIGKILL mid-run on 4 fake hosts of 2
// ranks, the layer on the relay path: every survivor fails the step with
// ErrPeerLost within 3 s of its start (the demo exits otherwise), shrinks
// to 7 ranks (hosts of 1 and 2 ranks: the flat path from there on) and
// finishes every step verified.
func TestDemoShrinkRelay(t *testing.T) {
	out := runKilledDemo(t, 6, []string{
		"rows: one crossing per host",
		"step 2: lost a rank; shrunk to 7 ranks (former ranks [0 1 3 4 5 6 7])",
		"all 6 steps verified on 7 ranks",
	}, "-n", "8", "--hosts", "4", "--hierarchy", "on", "--experts", "32", "--k", "4", "--tokens", "48",
		"--hidden", "32", "--ffn", "16", "--steps", "6", "--kill-rank", "2", "--kill-step", "2")
	m := regexp.MustCompile(`every survivor failed with ErrPeerLost within (\S+) of the step's start`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no failure time in:\n%s", out)
	}
	if d, err := time.ParseDuration(m[1]); err != nil || d > 3*time.Second {
		t.Errorf("the survivors failed the step after %s (%v), want within 3s", m[1], err)
	}
}

// runKilledDemo runs the demo with args, in which rank 2 kills itself, and
// checks that it carried on: exit 0, stdout holding want and steps verified
// step lines, the launcher reporting the killed rank, no /dev/shm segment
// left. It returns stdout.
func runKilledDemo(t *testing.T, steps int, want []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	shmBefore := shmSegments(t)
	cmd := exec.CommandContext(ctx, moeBin, args...)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("demo with a killed rank: %v, want it to carry on\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("stdout lacks %q:\n%s", w, out)
		}
	}
	if n := strings.Count(out, " verified  ["); n != steps {
		t.Errorf("%d verified step lines, want %d:\n%s", n, steps, out)
	}
	if !strings.Contains(stderr.String(), "rank 2 killed by signal killed") {
		t.Errorf("the launcher did not report the killed rank:\n%s", stderr.String())
	}
	checkNoSegmentLeft(t, shmBefore)
	return out
}

// TestDemoRebalance runs the skewed layer with redundant slots and a
// re-placement every 3 steps (--rebalance-every): the experts' weights move
// between ranks (each rank computes only with the weights it holds), every
// step verifies, and the imbalance column falls after the re-placement.
func TestDemoRebalance(t *testing.T) {
	out, errs := runInProcess(t, "-n", "4", "--experts", "16", "--k", "2", "--tokens", "96", "--hidden", "16", "--ffn", "16",
		"--skew", "1.2", "--capacity", "0", "--redundant", "4", "--rebalance-every", "3", "--steps", "7")
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v\n%s", r, err, out)
		}
	}
	checkOutput(t, out, 4, 7)
	re := regexp.MustCompile(`(?m)^step 3: experts re-placed \(5 per rank, 4 replicas\): (\d+) slots changed, (\d+) expert copies, \S+ of weights moved in \S+; estimated imbalance ([\d.]+) -> ([\d.]+)$`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no re-placement at step 3 in:\n%s", out)
	}
	var copies int
	var estBefore, estAfter float64
	fmt.Sscan(m[2], &copies)
	fmt.Sscan(m[3], &estBefore)
	fmt.Sscan(m[4], &estAfter)
	if copies == 0 || !(estAfter < estBefore) {
		t.Errorf("re-placement line %q: want copies and a lower estimate", m[0])
	}
	var before, after float64
	for _, l := range stepLine.FindAllStringSubmatch(out, -1) {
		var step int
		var imb float64
		fmt.Sscan(l[1], &step)
		fmt.Sscan(l[5], &imb)
		if step < 3 {
			before = max(before, imb)
		} else {
			after = max(after, imb)
		}
	}
	if !regexp.MustCompile(`(?m)^step time, slowest rank \(dispatch, experts, combine\): median \S+ over 2 steps before the re-placement at step 3, \S+ over 3 after \([+-]\d+%\)$`).MatchString(out) {
		t.Errorf("no step time summary in:\n%s", out)
	}
	cpu := regexp.MustCompile(`(?m)^CPU time in the step: busiest rank \(the step with a core per rank\) median (\S+) before, (\S+) after \([+-]\d+%\); all ranks (\S+) before, (\S+) after; cores the ranks used ([\d.]+) before, ([\d.]+) after$`).FindStringSubmatch(out)
	if cpu == nil {
		t.Errorf("no CPU time summary in:\n%s", out)
	} else {
		for _, s := range cpu[1:5] {
			if d, err := time.ParseDuration(s); err != nil || d <= 0 {
				t.Errorf("CPU time %q in %q: want a positive duration", s, cpu[0])
			}
		}
	}
	mre := regexp.MustCompile(`(?m)^metrics: a2a_moe_replacements_total 1, a2a_moe_replace_bytes_total (\d+) \(rank 0\), a2a_moe_rank_imbalance ([\d.]+)$`)
	if mm := mre.FindStringSubmatch(out); mm == nil {
		t.Errorf("no metrics line counting one re-placement in:\n%s", out)
	} else if imb, _ := strconv.ParseFloat(mm[2], 64); imb >= estBefore {
		t.Errorf("a2a_moe_rank_imbalance %v, want below the estimate before the re-placement, %v", imb, estBefore)
	}
	if !(after < before) || after > 1.3 {
		t.Errorf("imbalance up to %.2f before the re-placement, up to %.2f after: want it to fall, to 1.3 at most\n%s", before, after, out)
	}
}

// TestDemoKilledInReplace kills a rank process with SIGKILL inside the first
// re-placement, after the weights moved and before its vote: the survivors'
// Replace fails with ErrPeerLost and leaves them on the old placement (a
// survivor that had switched would make the new dispatcher's agreement fail
// with ErrMismatch), they shrink the group and finish every step verified.
func TestDemoKilledInReplace(t *testing.T) {
	out := runKilledDemo(t, 5, []string{
		"step 2: lost a rank; shrunk to 3 ranks (former ranks [0 1 3])",
		"all 5 steps verified on 3 ranks",
	}, "-n", "4", "--experts", "16", "--tokens", "64", "--hidden", "16", "--ffn", "16",
		"--skew", "1.2", "--capacity", "0", "--redundant", "4", "--rebalance-every", "2", "--steps", "5",
		"--kill-rank", "2", "--kill-in-replace")
	if strings.Contains(out, ": experts re-placed (") || !strings.Contains(out, "a2a_moe_replacements_total 0,") {
		t.Errorf("a re-placement completed although a rank died in it:\n%s", out)
	}
}
