package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestTestbedMoEDecodeFP8 runs the MoE demo's ranks on the test bed (2
// hosts x 2, 200 us one-way) in the decode mode with FP8 rows and two
// micro-batches: issue 19's new modes across hosts, where the decode
// mode's blocks between hosts travel by persistent point-to-point requests
// and those inside a host through its shared memory. Every step must
// verify on every rank (each output element within the FP8 bound of the
// single-process reference), the decode mode must be the one that ran,
// and the run must leave nothing behind.
func TestTestbedMoEDecodeFP8(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := []string{"-H", "2", "-L", "2", "--delay", "200us", "--run", "--", "", "--worker",
		"--experts", "8", "--k", "2", "--hidden", "512", "--tokens", "48", "--microbatches", "2", "--max-tokens", "24",
		"--wire", "fp8", "--steps", "3"}
	cmd := testbedCmd(t, ctx) // builds moeBin
	args[8] = moeBin
	cmd.Args = append(cmd.Args, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("scripts/testbed.sh --run moe: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	assertTestbedClean(t, cmd.Process.Pid)
	out := stdout.String()
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^\[rank 0\] moe: 4 ranks, 8 experts .*top-2`),
		regexp.MustCompile(`(?m)^\[rank 0\] moe: .*, decode mode \(fixed buffers for 24 tokens, split send/receive\)$`),
		regexp.MustCompile(`(?m)^\[rank 0\] data plane shm\+tcp; rows: .*, dispatched as fp8$`),
		regexp.MustCompile(`(?m)^\[rank 0\] all 3 steps verified on 4 ranks$`),
	} {
		if !want.MatchString(out) {
			t.Errorf("no line matching %q on stdout:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "testbed: PASS hosts=2 ranks/host=2") {
		t.Errorf("no PASS summary:\n%s", out)
	}
}
