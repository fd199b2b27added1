package main

import (
	"context"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

var dpLine = regexp.MustCompile(`(?m)^  dp: rows per expert AllReduced over (\d+) groups, \d+ rows, equal to the world's gathered loads$`)

// checkDataParallel asserts the output of a --dp run: the header line, one
// verified AllReduce line per step, and the usual verified steps of group 0
// and summary of all ranks.
func checkDataParallel(t *testing.T, out string, ranks, groups, steps int) {
	t.Helper()
	checkOutput(t, out, ranks, steps)
	if !strings.Contains(out, "data parallel: 2 expert-parallel groups of 2 ranks (Comm.Split, sharing one data plane)") {
		t.Errorf("no data-parallel header in:\n%s", out)
	}
	lines := dpLine.FindAllStringSubmatch(out, -1)
	if len(lines) != steps {
		t.Fatalf("%d data-parallel AllReduce lines, want %d:\n%s", len(lines), steps, out)
	}
	for _, l := range lines {
		if l[1] != "2" {
			t.Errorf("AllReduce over %s groups, want %d: %q", l[1], groups, l[0])
		}
	}
}

// TestDemoDataParallel runs --dp 2: two expert-parallel groups of two ranks
// (Comm.Split), each running the layer with its dispatcher on its own
// communicator and verifying every output, and the expert loads
// AllReduced across the groups and checked against the world's. In
// process (goroutine ranks) and as the README runs it (a process per
// rank); a bad --dp is refused.
func TestDemoDataParallel(t *testing.T) {
	small := []string{"-n", "4", "--dp", "2", "--tokens", "24", "--hidden", "16", "--ffn", "16", "--steps", "3"}
	out, errs := runInProcess(t, small...)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v\n%s", r, err, out)
		}
	}
	checkDataParallel(t, out, 4, 2, 3)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, moeBin, append(small, "--microbatches", "2")...)
	cmd.WaitDelay = 5 * time.Second
	pout, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, pout)
	}
	checkDataParallel(t, string(pout), 4, 2, 3)

	for _, bad := range [][]string{{"-n", "4", "--dp", "3"}, {"-n", "4", "--dp", "2", "--counts", "nats"}, {"-n", "4", "--dp", "0"}} {
		if _, err := parseFlags(bad, nil); err == nil || !strings.Contains(err.Error(), "--dp") {
			t.Errorf("%v: %v, want a --dp error", bad, err)
		}
	}
}
