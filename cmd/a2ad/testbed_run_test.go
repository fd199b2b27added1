package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/internal/doctest"
)

// rankProgram writes a user's rank program for scripts/testbed.sh --run: a
// shell script that prints the A2A_* variables it got (the secret only as
// set or not), writes a line to stderr, and then runs cmd/a2acheck (a
// verified AllToAllV job joined through a2a.ConfigFromEnv) with its
// arguments.
func rankProgram(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	check := filepath.Join(dir, "a2acheck")
	if err := goBuild(check, "../a2acheck"); err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(dir, "rank.sh")
	script := `#!/bin/sh
echo "env rank=$A2A_RANK world=$A2A_WORLD_SIZE local=$A2A_LOCAL_RANK/$A2A_LOCAL_SIZE host=$A2A_HOST group=$A2A_GROUP nats=$A2A_NATS_URL listen=$A2A_LISTEN secret=${A2A_SECRET:+set}"
echo "to stderr" >&2
exec ` + check + ` "$@"
`
	if err := os.WriteFile(prog, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return prog
}

// TestTestbedRun runs a user's program as the ranks of 2 hosts x 2 with
// scripts/testbed.sh --run: every rank must get the A2A_* variables a2ad run
// sets (its rank, the world of both hosts, its local rank, one group, the
// control plane over TLS, the secret) and its host's A2A_HOST and
// A2A_LISTEN, its stdout and stderr must come out on the script's, each line
// prefixed [rank k], and the run must pass and leave nothing behind.
func TestTestbedRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := testbedCmd(t, ctx, "-H", "2", "-L", "2", "--run", "--", rankProgram(t), "--rounds", "3")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("scripts/testbed.sh --run: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	assertTestbedClean(t, cmd.Process.Pid)
	out, errOut := stdout.String(), stderr.String()
	groups := map[string]bool{}
	for k := range 4 {
		env := regexp.MustCompile(fmt.Sprintf(`(?m)^\[rank %d\] env rank=%d world=4 local=%d/2 host=host%d group=(\S+) nats=tls://10\.77\.\d+\.1:4222 listen=10\.77\.\d+\.%d:0 secret=set$`,
			k, k, k%2, k/2, k/2+1)).FindStringSubmatch(out)
		if env == nil {
			t.Errorf("rank %d: no line with its A2A_* variables on stdout:\n%s", k, out)
		} else {
			groups[env[1]] = true
		}
		if !regexp.MustCompile(fmt.Sprintf(`(?m)^\[rank %d\] a2acheck: rank %d of 4 .* ok$`, k, k)).MatchString(out) {
			t.Errorf("rank %d: no verified a2acheck line on stdout:\n%s", k, out)
		}
		if line := fmt.Sprintf("[rank %d] to stderr\n", k); !strings.Contains(errOut, line) || strings.Contains(out, line) {
			t.Errorf("rank %d: its stderr line is not on stderr alone:\nstdout:\n%s\nstderr:\n%s", k, out, errOut)
		}
	}
	if len(groups) != 1 {
		t.Errorf("the ranks are in groups %v, want one", groups)
	}
	if !strings.Contains(out, "testbed: PASS hosts=2 ranks/host=2") {
		t.Errorf("no PASS summary:\n%s", out)
	}
}

// TestTestbedRunFails runs the same program with one rank sending a wrong
// byte (a2acheck --corrupt 1): the rank that receives it fails, and the
// script must exit 1, say so, show that rank's error with its prefix and
// leave nothing behind. A --run without a program is a usage error (2).
func TestTestbedRunFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := testbedCmd(t, ctx, "-H", "2", "-L", "2", "--run", "--", rankProgram(t), "--rounds", "3", "--corrupt", "1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("scripts/testbed.sh --run with a failing rank: %v, want exit status 1\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	assertTestbedClean(t, cmd.Process.Pid)
	if !strings.Contains(stdout.String(), "testbed: FAIL run: failed: host") {
		t.Errorf("no FAIL summary naming the hosts:\n%s", stdout.String())
	}
	if !regexp.MustCompile(`(?m)^\[rank \d\] a2acheck: .*byte \d+ of \d+ from rank 1 is 0x[0-9a-f]+, want 0x[0-9a-f]+$`).MatchString(stderr.String()) {
		t.Errorf("no prefixed a2acheck error about rank 1's byte on stderr:\n%s", stderr.String())
	}

	usage := testbedCmd(t, ctx, "-H", "2", "--run")
	out, err := usage.CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "--run needs a program") {
		t.Errorf("--run without a program: %v, want exit status 2 saying a program is needed:\n%s", err, out)
	}
}

// multihostDoc is the page whose test bed block TestTestbedRunDoc runs.
const multihostDoc = "docs/MULTIHOST.md"

// TestTestbedRunDoc runs docs/MULTIHOST.md's test bed block as the page
// shows it, with this checkout's binaries: make build is what testbedCmd's
// builds stand for, sudo is not needed as root, and bin/moe is the moe
// built here. Every line the page shows after the command must be in its
// output, in order (doctest.MatchOutput).
func TestTestbedRunDoc(t *testing.T) {
	blocks, err := doctest.Parse(filepath.Join("..", ".."), multihostDoc)
	if err != nil {
		t.Fatal(err)
	}
	blocks = slices.DeleteFunc(blocks, func(b doctest.Block) bool {
		return b.Mark.Kind != doctest.RunBy || b.Mark.Pkg != "cmd/a2ad" || b.Mark.Test != "TestTestbedRunDoc"
	})
	if len(blocks) != 1 {
		t.Fatalf("%s: %d blocks run by cmd/a2ad TestTestbedRunDoc, want 1", multihostDoc, len(blocks))
	}
	steps, err := blocks[0].Steps()
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, step := range steps {
		line := doctest.Bare(step.Cmd)
		if line == "make build" {
			continue
		}
		rest, ok := strings.CutPrefix(strings.TrimPrefix(line, "sudo "), "scripts/testbed.sh ")
		if !ok {
			t.Fatalf("%s: %q: want make build or scripts/testbed.sh", blocks[0].ID(), line)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		cmd := testbedCmd(t, ctx) // builds moeBin
		for _, a := range strings.Fields(rest) {
			if a == "bin/moe" {
				a = moeBin
			}
			cmd.Args = append(cmd.Args, a)
		}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		cancel()
		if err != nil {
			t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", line, err, stdout.String(), stderr.String())
		}
		assertTestbedClean(t, cmd.Process.Pid)
		if missing, ok := doctest.MatchOutput(step.Output, stdout.String()); !ok {
			t.Errorf("%s: the page shows %q, not in the output:\n%s", line, missing, stdout.String())
		}
		ran++
	}
	if ran != 1 {
		t.Errorf("%s: ran %d test bed lines, want 1", blocks[0].ID(), ran)
	}
}
