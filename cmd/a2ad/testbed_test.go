package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The MoE demo is built only when a test bed runs: every other test of this
// package, and every run without root, would pay for it in vain.
var (
	moeOnce  sync.Once
	moeBin   string
	moeBuild error
)

// testbedCmd prepares scripts/testbed.sh with a2adBin and moeBin; cancelling ctx
// sends SIGTERM so the script still tears its namespaces down.
func testbedCmd(t *testing.T, ctx context.Context, args ...string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	moeOnce.Do(func() {
		moeBin = filepath.Join(binDir, "moe")
		moeBuild = goBuild(moeBin, "../../examples/moe")
	})
	if moeBuild != nil {
		t.Fatal(moeBuild)
	}
	script, err := filepath.Abs(filepath.Join("..", "..", "scripts", "testbed.sh"))
	if err != nil {
		t.Fatal(err)
	}
	// The binaries first: after --run's "--" every argument is the program's.
	cmd := exec.CommandContext(ctx, script, append([]string{"--a2ad", a2adBin, "--moe", moeBin}, args...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	return cmd
}

// TestTestbed runs the multi-host test bed (2 network namespaces of 2 ranks each,
// correctness only, the MoE demo's ranks included) and checks that it passed
// and left nothing behind. Its a2ad serve listens beyond loopback, so serves
// TLS with a CA of its own, which the ranks of both hosts trust through its
// credentials file.
func TestTestbed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := testbedCmd(t, ctx, "-H", "2", "-L", "2", "--check-only", "--algos", "pairwise,fullmesh,nosuchalgo")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("scripts/testbed.sh -H 2 -L 2 --check-only failed (%v): network namespaces, veth or the a2ad job did not work as root:\n%s", err, out.String())
	}
	assertTestbedClean(t, cmd.Process.Pid)
	if !strings.Contains(out.String(), "testbed: PASS") || !strings.Contains(out.String(), "checked=[pairwise,fullmesh,alltoall,moe]") ||
		!strings.Contains(out.String(), "rejected=[nosuchalgo]") {
		t.Errorf("no PASS summary with every check and the unknown algorithm skipped:\n%s", out.String())
	}
	// Rank 0's rows: sizes 0, 1, 1K and 64K for each of the three checks, all verified
	// (#wrong, the last of 12 columns, 0), run by 4 ranks in all.
	okRows := 0
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(line)
		if len(f) == 12 && f[11] == "0" {
			okRows++
		}
	}
	if okRows != 12 {
		t.Errorf("%d rows with #wrong 0, want 12:\n%s", okRows, out.String())
	}
	if !strings.Contains(out.String(), "TLS with serve's own CA") {
		t.Errorf("the control plane did not serve TLS with a CA of its own:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "4 ranks") {
		t.Errorf("the job did not span both hosts:\n%s", out.String())
	}
}

// TestTestbedTeardownOnSIGTERM stops the test bed while its namespaces and control
// plane are up: the script must exit 143 and leave no namespace or process.
func TestTestbedTeardownOnSIGTERM(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := testbedCmd(t, ctx, "-H", "2", "-L", "2", "--bench-sizes", "64K")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	sc := bufio.NewScanner(stdout)
	up := false
	for !up && sc.Scan() {
		up = strings.Contains(sc.Text(), "control plane at")
	}
	if !up {
		cmd.Wait()
		t.Fatalf("the control plane never came up:\n%s", stderr.String())
	}
	if ns := testbedNamespaces(t, pid); len(ns) != 3 {
		t.Errorf("namespaces of the running test bed: %v, want 2 hosts and a bridge", ns)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() { // drain so the script never blocks on a full pipe
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 128+int(syscall.SIGTERM) {
		t.Errorf("exit after SIGTERM: %v, want status 143\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "interrupted by SIGTERM") {
		t.Errorf("stderr does not report the interruption:\n%s", stderr.String())
	}
	assertTestbedClean(t, pid)
}

// testbedNamespaces lists the network namespaces of the test bed run by pid.
func testbedNamespaces(t *testing.T, pid int) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	var ns []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], fmt.Sprintf("a2a-tb-%d-", pid)) {
			ns = append(ns, f[0])
		}
	}
	return ns
}

// assertTestbedClean fails unless the run of pid left no namespace and no a2ad process
// (a2adBin is private to this test binary, so any such process is the run's).
func assertTestbedClean(t *testing.T, pid int) {
	t.Helper()
	var procs []string
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		procs = procs[:0]
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == a2adBin {
				procs = append(procs, e.Name())
			}
		}
		if len(procs) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(procs) > 0 {
		t.Errorf("a2ad processes left behind: pids %v", procs)
	}
	if ns := testbedNamespaces(t, pid); len(ns) > 0 {
		t.Errorf("namespaces left behind: %v", ns)
	}
}
