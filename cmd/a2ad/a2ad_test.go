package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/internal/natsd"
)

// a2adBin is the a2ad binary built once for the multi-process tests.
var a2adBin string

// binDir holds the binaries built for the tests; TestMain removes it.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "a2ad-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir, a2adBin = dir, filepath.Join(dir, "a2ad")
	if err := goBuild(a2adBin, "."); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// goBuild builds the package pkg into the binary out, the compiler's
// diagnostics going to stderr.
func goBuild(out, pkg string) error {
	build := exec.Command("go", "build", "-o", out, pkg)
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building %s: %w", pkg, err)
	}
	return nil
}

func a2ad(t *testing.T, ctx context.Context, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(ctx, a2adBin, args...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

func TestBenchJSONAndCheck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, tc := range []struct{ op, dist, algo, timing string }{
		{"alltoallv", "uniform", "pairwise", "barrier"},
		{"alltoallv", "zipf:1.2", "fullmesh", "span"},
		{"alltoallv", "uniform", "ll", "barrier"},
		{"alltoall", "uniform", "", "span"},
	} {
		out, err := a2ad(t, ctx, "bench", "--op", tc.op, "-n", "3", "--algo", tc.algo, "--dist", tc.dist, "--timing", tc.timing,
			"--sizes", "0:4K", "--iters", "20", "--warmup", "2", "--check", "--json").Output()
		if err != nil {
			t.Fatalf("%v: %v\n%s", tc, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != 14 { // 0, 1, 2, 4, ..., 4096
			t.Fatalf("%v: %d rows:\n%s", tc, len(lines), out)
		}
		for _, line := range lines {
			var row map[string]any
			if err := json.Unmarshal([]byte(line), &row); err != nil {
				t.Fatalf("row %q: %v", line, err)
			}
			checkKeys(t, line, row)
			// uint8 by default: count is the bytes a rank sends in all.
			if row["check"] != "ok" || row["wrong"] != 0.0 || row["op"] != tc.op || row["ranks"] != 3.0 ||
				row["type"] != "uint8" || row["redop"] != "none" || row["root"] != -1.0 || row["count"] != 3*row["size"].(float64) {
				t.Errorf("row %q", line)
			}
			if tc.algo == "ll" {
				// Blocks above the LL cutoff travel by frames after the LL round.
				if size := row["size"].(float64); size <= 512 && row["algo"] != "ll" {
					t.Errorf("algo %v at %v B, want ll", row["algo"], size)
				}
			} else if tc.algo != "" && row["algo"] != tc.algo {
				t.Errorf("algo %v, want %s", row["algo"], tc.algo)
			}
			if row["p50_us"].(float64) <= 0 || row["p99_us"].(float64) < row["p50_us"].(float64) || row["avg_us"].(float64) <= 0 {
				t.Errorf("latencies in %q", line)
			}
		}
	}
	if out, err := a2ad(t, ctx, "bench", "--timing", "bogus").CombinedOutput(); err == nil {
		t.Errorf("--timing bogus accepted:\n%s", out)
	}
}

// TestBenchAlgoAll: --algo all runs auto and then every forced algorithm at
// each size, each verified, says in the auto row what auto ran, and closes
// each size with the comparison of auto to the best forced algorithm.
func TestBenchAlgoAll(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := a2ad(t, ctx, "bench", "-n", "3", "--algo", "all", "--sizes", "64,4K", "--iters", "20", "--warmup", "2", "--check", "--json").Output()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var forced []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var row map[string]any
		if err := json.Unmarshal([]byte(line), &row); err != nil {
			t.Fatalf("row %q: %v", line, err)
		}
		if row["check"] != "ok" || row["wrong"] != 0.0 {
			t.Errorf("row %s: not verified", line)
		}
		f, _ := row["forced"].(string)
		forced = append(forced, f)
		if f != "auto" && f != "staged" && f != "ll" && row["algo"] != f {
			t.Errorf("forced %s ran %v", f, row["algo"])
		}
	}
	want := slices.Concat(benchAlgos, benchAlgos)
	if !slices.Equal(forced, want) {
		t.Errorf("rows forced %v, want %v", forced, want)
	}
	text, err := a2ad(t, ctx, "bench", "-n", "2", "--algo", "all", "--sizes", "1K", "--iters", "20", "--warmup", "2").Output()
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	if !regexp.MustCompile(`auto>\w+ `).Match(text) || !regexp.MustCompile(`# size 1024: auto ran \w+, p50 [0-9.]+ us; best forced \w+, p50 [0-9.]+ us; auto/best [0-9.]+`).Match(text) {
		t.Errorf("no auto row or comparison:\n%s", text)
	}
	if out, err := a2ad(t, ctx, "bench", "--op", "allreduce", "--algo", "all").CombinedOutput(); err == nil {
		t.Errorf("--op allreduce --algo all accepted:\n%s", out)
	}
}

// benchKeys are the fields of a --json row.
var benchKeys = []string{"op", "algo", "ranks", "size", "count", "type", "redop", "root", "avg_us", "p50_us", "p99_us",
	"algbw_gbps", "busbw_gbps", "wrong", "check"}

// checkKeys fails unless row, parsed from line, has exactly benchKeys.
func checkKeys(t *testing.T, line string, row map[string]any) {
	t.Helper()
	if len(row) != len(benchKeys) {
		t.Errorf("row %s has %d keys, want exactly %v", line, len(row), benchKeys)
	}
	for _, k := range benchKeys {
		if _, ok := row[k]; !ok {
			t.Errorf("row %s lacks %q", line, k)
		}
	}
}

// TestBenchOverlap: with --overlap every call is an IAllToAllV, the off-CPU
// wait and a Wait; the bytes still check out, and no call is shorter than
// the wait it holds (the wait blocks, rather than returning at once).
func TestBenchOverlap(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := a2ad(t, ctx, "bench", "-n", "2", "--sizes", "8,64K", "--iters", "20", "--warmup", "2",
		"--check", "--overlap", "2ms", "--json").Output()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d rows, want 2:\n%s", len(lines), out)
	}
	for _, line := range lines {
		var row map[string]any
		if err := json.Unmarshal([]byte(line), &row); err != nil {
			t.Fatalf("row %q: %v", line, err)
		}
		if row["check"] != "ok" || row["wrong"] != 0.0 {
			t.Errorf("row %s: not verified", line)
		}
		if p50, _ := row["p50_us"].(float64); p50 < 2000 {
			t.Errorf("row %s: p50 %v us, shorter than the 2 ms off the CPU", line, p50)
		}
	}
}

// TestBenchSettle: --settle makes untimed calls once per launch, before the
// first size, for at least its time, and the sizes are measured as before.
func TestBenchSettle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stdout, stderr, code := exitCode(t, a2ad(t, ctx, "bench", "-n", "2", "--sizes", "8,64", "--iters", "20",
		"--warmup", "2", "--check", "--settle", "200ms"))
	if code != 0 {
		t.Fatalf("exit %d:\n%s\n%s", code, stdout, stderr)
	}
	settles := regexp.MustCompile(`# settle: (\d+) untimed calls of the first size in (\S+) before`).FindAllStringSubmatch(stderr, -1)
	if len(settles) != 1 {
		t.Fatalf("want one # settle: line (once per launch), got %d:\n%s", len(settles), stderr)
	}
	calls, _ := strconv.Atoi(settles[0][1])
	took, err := time.ParseDuration(settles[0][2])
	if err != nil || calls <= 0 || calls%64 != 0 || took < 200*time.Millisecond {
		t.Errorf("settle: %d calls in %v (%v), want a positive multiple of 64 in >= 200ms", calls, took, err)
	}
	var rows int
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		if f := strings.Fields(line); len(f) == 12 && !strings.HasPrefix(line, "#") {
			rows++
			if f[11] != "0" {
				t.Errorf("size %s: #wrong %s, want 0", f[0], f[11])
			}
		}
	}
	if rows != 2 {
		t.Errorf("want 2 rows, got %d:\n%s", rows, stdout)
	}
}

// TestBenchColumns reads the text rows as nccl-tests' are read: an 8-byte
// float32 AllReduce is 2 elements, and #wrong is 0 when checked, N/A when not.
func TestBenchColumns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		args []string
		want []string // size count type redop root, then #wrong
	}{
		{[]string{"--op", "allreduce", "--check"}, []string{"8", "2", "float32", "sum", "-1", "0"}},
		{[]string{"--op", "allreduce", "-d", "float64", "-o", "max"}, []string{"8", "1", "float64", "max", "-1", "N/A"}},
		{[]string{"--op", "reduce", "-d", "int32", "-o", "prod", "-r", "1", "--check"}, []string{"8", "2", "int32", "prod", "1", "0"}},
		{[]string{"--op", "alltoall", "--check"}, []string{"8", "16", "uint8", "none", "-1", "0"}},
		{[]string{"--op", "broadcast", "--dtype", "float16", "--root", "1"}, []string{"8", "4", "float16", "none", "1", "N/A"}},
	} {
		args := append([]string{"bench", "-n", "2", "--sizes", "8", "--iters", "20", "--warmup", "2"}, tc.args...)
		out, err := a2ad(t, ctx, args...).Output()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		var rows [][]string
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if !strings.HasPrefix(line, "#") {
				rows = append(rows, strings.Fields(line))
			}
		}
		if len(rows) != 1 || len(rows[0]) != 12 {
			t.Fatalf("%v: want one row of 12 columns:\n%s", args, out)
		}
		row := rows[0]
		if got := append(row[:5:5], row[11]); !slices.Equal(got, tc.want) {
			t.Errorf("%v: size count type redop root #wrong = %v, want %v\n%s", args, got, tc.want, out)
		}
		if !strings.Contains(string(out), "#wrong\n") {
			t.Errorf("%v: no #wrong column in the header:\n%s", args, out)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--op", "alltoall", "-o", "max"}, "alltoall does not reduce"},
		{[]string{"--op", "allreduce", "-r", "1"}, "allreduce has no root"},
		{[]string{"--op", "broadcast", "-r", "2"}, "--root 2: not a rank of 2"},
		{[]string{"--op", "barrier", "-d", "float32"}, "barrier moves no data"},
		{[]string{"--op", "allreduce", "-d", "complex64"}, "float32 | float64 | bfloat16 | float16 | int32 | int64 | uint8"},
		{[]string{"--op", "allreduce", "-o", "xor"}, "sum | prod | max | min | avg"},
	} {
		_, stderr, code := exitCode(t, a2ad(t, ctx, append([]string{"bench", "-n", "2"}, tc.args...)...))
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: status %d, stderr %q, want 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

// bench --cpuprofile leaves one CPU profile per rank: gzip'ed protobuf, as
// runtime/pprof writes it.
func TestBenchCPUProfile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := filepath.Join(t.TempDir(), "cpu")
	args := []string{"bench", "-n", "2", "--sizes", "8", "--iters", "20", "--warmup", "2", "--cpuprofile", prefix}
	if out, err := a2ad(t, ctx, args...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
	for r := range 2 {
		b, err := os.ReadFile(fmt.Sprintf("%s.rank%d", prefix, r))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("rank %d: %d bytes, not a gzip'ed profile", r, len(b))
		}
	}
}

func TestRunPrefixesAndNamesTheFailedRank(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := a2ad(t, ctx, "run", "-n", "3", "--", "sh", "-c",
		`echo "hello from $A2A_RANK of $A2A_WORLD_SIZE"; if [ "$A2A_RANK" = 2 ]; then sleep 0.5; exit 3; fi; sleep 20`)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	if err == nil {
		t.Fatal("a2ad run succeeded although rank 2 failed")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the other ranks were not stopped: run took %v", d)
	}
	for r := range 3 {
		if want := fmt.Sprintf("[rank %d] hello from %d of 3", r, r); !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
	if !strings.Contains(stderr.String(), "rank 2 failed: exit status 3") {
		t.Errorf("stderr does not name rank 2:\n%s", stderr.String())
	}
}

// TestInterrupted sends SIGINT or SIGTERM to a running job's launcher, as
// Ctrl-C or a scheduler does: it must say the job was interrupted (no rank
// "failed") and exit with the shell's status for the signal.
func TestInterrupted(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sig   syscall.Signal
		args  []string
		ready string // stdout line once the ranks run
	}{
		{"run SIGINT", syscall.SIGINT, []string{"run", "-n", "2", "--", "sh", "-c", "echo up; exec sleep 20"}, "[rank 1] up"},
		{"run SIGTERM", syscall.SIGTERM, []string{"run", "-n", "2", "--", "sh", "-c", "echo up; exec sleep 20"}, "[rank 1] up"},
		{"bench SIGINT", syscall.SIGINT, []string{"bench", "-n", "2", "--sizes", "64K", "--iters", "10000000", "--budget", "1h"}, "# a2ad bench"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := a2ad(t, ctx, tc.args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			so, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(so)
			for up := false; !up; {
				if !sc.Scan() {
					cmd.Wait()
					t.Fatalf("no %q on stdout; stderr:\n%s", tc.ready, stderr.String())
				}
				up = strings.HasPrefix(sc.Text(), tc.ready)
			}
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			for sc.Scan() {
			}
			err = cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 128+int(tc.sig) {
				t.Errorf("exit: %v, want status %d\n%s", err, 128+int(tc.sig), stderr.String())
			}
			want := fmt.Sprintf("a2ad %s: interrupted by %s\n", tc.args[0], unix.SignalName(tc.sig))
			if !strings.Contains(stderr.String(), want) || strings.Contains(stderr.String(), "failed") {
				t.Errorf("stderr:\n%s\nwant %q and no failure", stderr.String(), want)
			}
		})
	}
}

// TestKillRankDuringAllToAllV kills one rank process with SIGKILL in the middle
// of an AllToAllV loop: every survivor must fail with ErrPeerLost within 3 s.
func TestKillRankDuringAllToAllV(t *testing.T) {
	ranks := natsd.NewUser("killtest", control.Subjects("killtest"))
	cp, err := startControlPlane(slog.New(slog.DiscardHandler), cpConfig{Listen: "127.0.0.1:0", Secret: []byte("k"),
		Users: []natsd.User{ranks}})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	const n = 3
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmds := make([]*exec.Cmd, n)
	stderrs := make([]*bytes.Buffer, n)
	exited := make(chan int, n)
	for r := range n {
		cmd := a2ad(t, ctx, "bench", "--worker", "--sizes", "256K", "--iters", "10000000", "--budget", "1h", "--warmup", "1")
		cmd.Env = append(os.Environ(), "A2A_NATS_URL="+cp.URL, "A2A_GROUP=killtest", "A2A_SECRET=k",
			"A2A_RANK="+strconv.Itoa(r), "A2A_WORLD_SIZE="+strconv.Itoa(n))
		cmd.Env = append(cmd.Env, ranks.Env()...)
		stderrs[r] = &bytes.Buffer{}
		cmd.Stderr = stderrs[r]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[r] = cmd
		go func() { cmd.Wait(); exited <- r }()
	}
	defer func() {
		for _, c := range cmds {
			c.Process.Kill()
		}
	}()
	time.Sleep(1500 * time.Millisecond) // joined and deep in the timed loop
	select {
	case r := <-exited:
		t.Fatalf("rank %d exited before the kill: %s", r, stderrs[r])
	default:
	}
	killed := time.Now()
	if err := cmds[1].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for range n {
		select {
		case r := <-exited:
			if r == 1 {
				continue
			}
			took := time.Since(killed)
			if took > 3*time.Second {
				t.Errorf("rank %d took %v to notice", r, took)
			}
			if cmds[r].ProcessState.ExitCode() == 0 {
				t.Errorf("rank %d exited 0", r)
			}
			if !strings.Contains(stderrs[r].String(), "peer lost") {
				t.Errorf("rank %d stderr does not report the lost peer:\n%s", r, stderrs[r])
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("survivors still running 5s after the kill")
		}
	}
}

// TestRunKilledRank: `a2ad run` exits non-zero naming a rank killed with -9.
func TestRunKilledRank(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	group := fmt.Sprintf("runkill%d", os.Getpid())
	cmd := a2ad(t, ctx, "run", "-n", "3", "--group", group, "--", a2adBin, "bench", "--worker",
		"--sizes", "64K", "--iters", "10000000", "--budget", "1h", "--warmup", "1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var victim int
	deadline := time.Now().Add(10 * time.Second)
	for victim == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		victim = findRank(group, 1)
	}
	if victim == 0 {
		cmd.Process.Kill()
		t.Fatal("rank 1 process not found")
	}
	time.Sleep(time.Second)
	syscall.Kill(victim, syscall.SIGKILL)
	err := cmd.Wait()
	if err == nil {
		t.Fatal("a2ad run exited 0 after a rank was killed")
	}
	if !strings.Contains(stderr.String(), "rank 1 failed: killed by signal killed") {
		t.Errorf("stderr does not name the killed rank:\n%s", stderr.String())
	}
	if pid := findRank(group, 0); pid != 0 {
		t.Errorf("rank 0 (pid %d) still running after a2ad run exited", pid)
	}
}

// findRank returns the pid of the process with A2A_GROUP=group and A2A_RANK=rank.
func findRank(group string, rank int) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		vars := bytes.Split(env, []byte{0})
		var g, r bool
		for _, v := range vars {
			g = g || string(v) == "A2A_GROUP="+group
			r = r || string(v) == "A2A_RANK="+strconv.Itoa(rank)
		}
		if g && r {
			if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && !bytes.Contains(stat, []byte(") Z")) {
				return pid
			}
		}
	}
	return 0
}

// TestServeAndRun: a2ad serve is the control plane of a job that a2ad run
// starts with --nats; the demo's ranks verify their exchanges.
func TestServeAndRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	creds := filepath.Join(t.TempDir(), "serve.env")
	serve := a2ad(t, ctx, "serve", "--listen", addr, "--metrics", "127.0.0.1:0", "--creds", creds)
	so, _ := serve.StdoutPipe()
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer serve.Process.Kill()
	sc := bufio.NewScanner(so)
	var metricsURL string
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "a2ad: metrics at ") {
		t.Fatalf("serve said %q", sc.Text())
	}
	metricsURL = strings.TrimPrefix(sc.Text(), "a2ad: metrics at ")
	if !sc.Scan() || !strings.Contains(sc.Text(), "control plane ready") {
		t.Fatalf("serve said %q", sc.Text())
	}
	if !sc.Scan() || !strings.Contains(sc.Text(), "credentials generated in "+creds) {
		t.Fatalf("serve said %q", sc.Text())
	}
	if st, err := os.Stat(creds); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("credentials file: %v, %v", st, err)
	}
	// A stranger without the credentials is refused.
	if nc, err := nats.Connect("nats://"+addr, nats.MaxReconnects(0)); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("a client without credentials: %v, want an authorization violation", err)
	}
	out, err := a2ad(t, ctx, "run", "-n", "3", "--nats", "nats://"+addr, "--creds", creds, "--", a2adBin, "demo", "--worker", "--steps", "3").CombinedOutput()
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "[rank 0] all 3 steps verified on 3 ranks") {
		t.Errorf("demo output:\n%s", out)
	}
	resp, err := http.Get(metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The job has left: the service forgets finished groups.
	if !strings.Contains(string(body), "a2a_control_groups 0") || !strings.Contains(string(body), "process_cpu_seconds_total") {
		t.Errorf("control-plane metrics after the job:\n%.2000s", body)
	}
	serve.Process.Signal(syscall.SIGTERM)
	if err := serve.Wait(); err != nil {
		t.Errorf("serve exit: %v", err)
	}
}

func TestPlan(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	out, err := a2ad(t, ctx, "plan", "-n", "1024", "--sizes", "64K", "--dist", "zipf:1", "--rounds", "1").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if d := time.Since(start); d > 5*time.Second { // the bound is 1 s; leave room for a loaded CI machine
		t.Errorf("planning 1024 ranks took %v", d)
	}
	for _, want := range []string{"auto picks", "pairwise  estimated", "fullmesh  estimated", "rounds, "} {
		if !strings.Contains(string(out), want) {
			t.Errorf("plan output lacks %q:\n%s", want, out)
		}
	}
	if _, err := a2ad(t, ctx, "plan", "--algo", "bogus").CombinedOutput(); err == nil {
		t.Error("unknown algorithm accepted")
	}
	// No candidate beats the lower bound, on one host or across hosts
	// (where every candidate pays the remote link).
	for _, hosts := range []string{"1", "4"} {
		out, err := a2ad(t, ctx, "plan", "-n", "8", "--hosts", hosts, "--sizes", "64K", "--dist", "zipf:1.5", "--rounds", "0").CombinedOutput()
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		estimates := map[string]float64{}
		bound := -1.0
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) > 2 && f[1] == "estimated":
				estimates[f[0]], _ = strconv.ParseFloat(f[2], 64)
			case len(f) > 2 && f[0] == "lower" && f[1] == "bound":
				bound, _ = strconv.ParseFloat(f[2], 64)
			}
		}
		if bound <= 0 || len(estimates) < 3 {
			t.Fatalf("hosts %s: no lower bound or too few estimates:\n%s", hosts, out)
		}
		for a, est := range estimates {
			if est < bound {
				t.Errorf("hosts %s: %s estimated %.1f us, below the lower bound %.1f us", hosts, a, est, bound)
			}
		}
		// Auto picks the lowest estimate printed (ll runs only when forced).
		picked := ""
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasSuffix(line, "<- auto") {
				picked = strings.Fields(line)[0]
			}
		}
		for a, est := range estimates {
			if a != "ll" && est < estimates[picked] {
				t.Errorf("hosts %s: auto picked %q (%.1f us) over %s (%.1f us)", hosts, picked, estimates[picked], a, est)
			}
		}
	}
}

func TestBenchCollectives(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const n = 3
	for _, tc := range []struct {
		op          string
		args        []string
		typ, redop  string
		root        float64
		size, count [2]float64 // of the two rows, sizes 12 and 4K
	}{
		{"allreduce", nil, "float32", "sum", -1, [2]float64{12, 4096}, [2]float64{3, 1024}},
		{"allreduce", []string{"-d", "bfloat16", "-o", "avg"}, "bfloat16", "avg", -1, [2]float64{12, 4096}, [2]float64{6, 2048}},
		{"allreduce", []string{"-d", "uint8", "-o", "prod"}, "uint8", "prod", -1, [2]float64{12, 4096}, [2]float64{12, 4096}},
		{"reducescatter", nil, "float32", "sum", -1, [2]float64{12, 4092}, [2]float64{3, 1023}},
		{"reducescatter", []string{"-d", "int64", "-o", "min"}, "int64", "min", -1, [2]float64{0, 4080}, [2]float64{0, 510}},
		{"allgather", nil, "uint8", "none", -1, [2]float64{12, 4096}, [2]float64{n * 12, n * 4096}},
		{"broadcast", []string{"-r", "2"}, "uint8", "none", 2, [2]float64{12, 4096}, [2]float64{12, 4096}},
		{"reduce", []string{"-r", "1", "-d", "float16", "-o", "max"}, "float16", "max", 1, [2]float64{12, 4096}, [2]float64{6, 2048}},
		{"gather", []string{"-d", "int32"}, "int32", "none", 0, [2]float64{12, 4096}, [2]float64{n * 3, n * 1024}},
		{"scatter", []string{"-r", "1"}, "uint8", "none", 1, [2]float64{12, 4096}, [2]float64{n * 12, n * 4096}},
		{"barrier", nil, "none", "none", -1, [2]float64{0, 0}, [2]float64{0, 0}},
	} {
		args := append([]string{"bench", "--op", tc.op, "-n", "3", "--sizes", "12,4K", "--iters", "20", "--warmup", "2", "--check", "--json"}, tc.args...)
		out, err := a2ad(t, ctx, args...).Output()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != 2 {
			t.Fatalf("%v: %d rows:\n%s", args, len(lines), out)
		}
		for i, line := range lines {
			var row map[string]any
			if err := json.Unmarshal([]byte(line), &row); err != nil {
				t.Fatalf("%v row %q: %v", args, line, err)
			}
			checkKeys(t, line, row)
			if row["check"] != "ok" || row["wrong"] != 0.0 || row["op"] != tc.op || row["type"] != tc.typ || row["redop"] != tc.redop ||
				row["root"] != tc.root || row["size"] != tc.size[i] || row["count"] != tc.count[i] {
				t.Errorf("%v row %s", args, line)
			}
			if algbw := row["algbw_gbps"].(float64); algbw > 0 && math.Abs(row["busbw_gbps"].(float64)/algbw-busFactor(tc.op, n)) > 1e-9 {
				t.Errorf("%v row %s: busbw/algbw is not %v", args, line, busFactor(tc.op, n))
			}
		}
	}
}

// TestTuneAndPlanWithLinks: `a2ad tune` measures a link table that loads
// back, and `a2ad plan --links` prices every candidate with it, staged too.
func TestTuneAndPlanWithLinks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	file := filepath.Join(t.TempDir(), "links.json")
	if out, err := a2ad(t, ctx, "tune", "-n", "3", "--out", file).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	links, err := algo.LoadLinks(file)
	if err != nil {
		t.Fatal(err)
	}
	if links == a2a.BuiltinLinks().Table("shm", "tcp") {
		t.Errorf("tune wrote the built-in table %+v", links)
	}
	out, err := a2ad(t, ctx, "plan", "-n", "8", "--hosts", "2", "--sizes", "1K", "--rounds", "0", "--links", file).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "staged") && strings.Contains(line, " - ") {
			t.Errorf("staged not priced: %s", line)
		}
	}
	if !strings.Contains(string(out), "staged    estimated") {
		t.Errorf("no staged estimate:\n%s", out)
	}
	if out, err := a2ad(t, ctx, "plan", "--links", filepath.Join(t.TempDir(), "missing.json")).CombinedOutput(); err == nil {
		t.Errorf("missing link table accepted:\n%s", out)
	}
}

// TestRunCredentials: a2ad run's embedded control plane lets in only its
// job. The ranks get the NATS password in their environment and it is on no
// process's command line; a stranger (a rank's own program without those
// variables) is refused with "not authorized".
func TestRunCredentials(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	script := `echo "pw=$A2A_NATS_PASSWORD"
for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' <"$f" 2>/dev/null; echo; done >"$DIR/cmdlines.$A2A_RANK"
A2A_NATS_USER= A2A_NATS_PASSWORD= A2A_WORLD_SIZE=1 A2A_RANK=0 A2A_GROUP=stranger "$A2AD" demo --worker --steps 1 2>&1 | head -1
`
	cmd := a2ad(t, ctx, "run", "-n", "2", "--", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "DIR="+dir, "A2AD="+a2adBin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	var pw string
	for _, line := range strings.Split(string(out), "\n") {
		if _, p, ok := strings.Cut(line, "pw="); ok {
			if pw != "" && p != pw {
				t.Errorf("ranks got different passwords")
			}
			pw = p
		}
	}
	if len(pw) < 16 {
		t.Fatalf("the ranks got no NATS password in their environment:\n%s", out)
	}
	if strings.Count(string(out), "not authorized") != 2 {
		t.Errorf("a client without the credentials was not refused by both ranks' server:\n%s", out)
	}
	for r := range 2 {
		lines, err := os.ReadFile(filepath.Join(dir, "cmdlines."+strconv.Itoa(r)))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(lines), "a2ad run -n 2") {
			t.Fatalf("rank %d did not see the launcher's command line:\n%s", r, lines)
		}
		if strings.Contains(string(lines), pw) {
			t.Errorf("the NATS password is on a command line:\n%s", lines)
		}
	}
}

// TestBenchAlloc: bench uses registered buffers (AllocBuffer) unless told
// --alloc heap, says which in its header, and both forms verify.
func TestBenchAlloc(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, " alloc=huge "},
		{[]string{"--alloc", "heap"}, " alloc=heap "},
		{[]string{"--alloc", "huge"}, " alloc=huge "},
	} {
		args := append([]string{"bench", "-n", "2", "--op", "alltoall", "--sizes", "256K", "--iters", "10", "--warmup", "2", "--check"}, tc.args...)
		out, err := a2ad(t, ctx, args...).Output()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if !strings.HasPrefix(lines[0], "# a2ad bench ") || !strings.Contains(lines[0], tc.want) {
			t.Errorf("%v: header %q does not say%q", tc.args, lines[0], tc.want)
		}
		row := strings.Fields(lines[len(lines)-1])
		if len(row) != 12 || row[11] != "0" {
			t.Errorf("%v: want a verified row (#wrong 0), got %q", tc.args, lines[len(lines)-1])
		}
	}
	_, stderr, code := exitCode(t, a2ad(t, ctx, "bench", "-n", "2", "--alloc", "mmap"))
	if code != 2 || !strings.Contains(stderr, "huge or heap") {
		t.Errorf("--alloc mmap: status %d, stderr %q, want 2 and the choices", code, stderr)
	}
}
