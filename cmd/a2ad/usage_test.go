package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// exitCode runs cmd and returns its stdout, stderr and exit status.
func exitCode(t *testing.T, cmd *exec.Cmd) (stdout, stderr string, code int) {
	t.Helper()
	var so, se strings.Builder
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return so.String(), se.String(), code
}

// TestHelp: -h and --help of every command exit 0 and print its flags with
// their valid values to stdout, internal flags left out.
func TestHelp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		cmd  string
		want []string
	}{
		{"serve", []string{"-listen", "-metrics", "-nats", "-job-conns", "-job-subs", "-job-rate"}},
		{"run", []string{"-bind", "core", "none", "-world", "-rank-offset"}},
		{"bench", []string{
			"alltoallv | alltoall | allreduce | reducescatter | allgather | broadcast | reduce | gather | scatter | barrier",
			"auto | pairwise | fullmesh | staged | skew | ll",                                                    // algorithms
			"auto (shm on one host, verbs to others where both have an RDMA port, else tcp) | shm | verbs | tcp", // transports
			"uniform | zipf:S | lognormal:SIGMA | hot:F",
			"float32 | float64 | bfloat16 | float16 | int32 | int64 | uint8", // dtypes
			"sum | prod | max | min | avg",                                   // redops
			"  -d string", "  -o string", "  -r int", "#wrong",
			"A2A_STREAMS or 2", "A2A_WINDOW or 32"}},
		{"demo", []string{"-steps", "-max"}},
		{"plan", []string{"pairwise, fullmesh, skew, staged, ll", "uniform | zipf:S", "-streams int", "(default 2)"}},
		{"tune", []string{"-out", "-nats"}},
		{"job", []string{"-group", "-out", "-creds"}},
	} {
		for _, flag := range []string{"-h", "--help"} {
			cmd := a2ad(t, ctx, tc.cmd, flag)
			// Help prints defaults: none may come from a secret.
			cmd.Env = append(os.Environ(), "A2A_SECRET=never-print-this-secret")
			stdout, stderr, code := exitCode(t, cmd)
			if strings.Contains(stdout+stderr, "never-print-this-secret") {
				t.Errorf("a2ad %s %s prints the job secret", tc.cmd, flag)
			}
			if code != 0 || stderr != "" {
				t.Errorf("a2ad %s %s: status %d, stderr %q", tc.cmd, flag, code, stderr)
			}
			for _, want := range append(tc.want, "usage: a2ad "+tc.cmd+" ") {
				if !strings.Contains(stdout, want) {
					t.Errorf("a2ad %s %s lacks %q:\n%s", tc.cmd, flag, want, stdout)
				}
			}
			if strings.Contains(stdout, "worker") || strings.Contains(stdout, "internal") {
				t.Errorf("a2ad %s %s shows an internal flag:\n%s", tc.cmd, flag, stdout)
			}
		}
	}
	// The top level lists every command and every op.
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		stdout, _, code := exitCode(t, a2ad(t, ctx, args...))
		if code != 0 {
			t.Errorf("a2ad %v: status %d", args, code)
		}
		for _, c := range commands() {
			if !strings.Contains(stdout, "a2ad "+c.name+" ") {
				t.Errorf("a2ad %v does not list %s:\n%s", args, c.name, stdout)
			}
		}
		if !strings.Contains(stdout, "bench ops: "+strings.Join(benchOpNames, ", ")+"\n") {
			t.Errorf("a2ad %v does not list the ops:\n%s", args, stdout)
		}
	}
	if stdout, _, code := exitCode(t, a2ad(t, ctx, "help", "bench")); code != 0 || !strings.Contains(stdout, "usage: a2ad bench") {
		t.Errorf("a2ad help bench: status %d:\n%s", code, stdout)
	}
}

// TestUsageErrors: bad command lines exit 2 with one line saying what is
// wrong (the valid values when there is a list) and where the help is.
func TestUsageErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "usage:"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"bench", "--op", "foo"}, `a2ad bench: unknown --op "foo": valid ops are ` + strings.Join(benchOpNames, ", ") + "\n" +
			`Run "a2ad bench -h" for its flags and their valid values.`},
		{[]string{"bench", "--algo", "bogus"}, "auto, pairwise, fullmesh, staged, skew, ll"},
		{[]string{"bench", "--transport", "carrier-pigeon"}, "auto, shm, verbs, tcp"},
		{[]string{"bench", "--no-such-flag"}, "a2ad bench: flag provided but not defined: -no-such-flag\n"},
		{[]string{"plan", "--algo", "bogus"}, "pairwise, fullmesh, skew, staged or ll"},
	} {
		stdout, stderr, code := exitCode(t, a2ad(t, ctx, tc.args...))
		if code != 2 || !strings.Contains(stderr, tc.want) || stdout != "" {
			t.Errorf("a2ad %v: status %d, stderr %q, stdout %q; want status 2 and %q", tc.args, code, stderr, stdout, tc.want)
		}
	}
}

// TestBenchStreamsDefault: the default streams the help promises are the
// ones the benchmark's header reports.
func TestBenchStreamsDefault(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	help, _, _ := exitCode(t, a2ad(t, ctx, "bench", "-h"))
	m := regexp.MustCompile(`A2A_STREAMS or (\d+)`).FindStringSubmatch(help)
	if m == nil {
		t.Fatalf("help does not say the default streams:\n%s", help)
	}
	cmd := a2ad(t, ctx, "bench", "-n", "2", "--sizes", "8", "--iters", "20", "--warmup", "1")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "A2A_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(string(out), " streams="+m[1]+" ") {
		t.Errorf("help says streams default %s, the header:\n%s", m[1], out)
	}
}

// TestCommandListsAgree: the usage, the package doc and the README's list
// of a2ad's commands name every command.
func TestCommandListsAgree(t *testing.T) {
	var usageText strings.Builder
	usage(&usageText)
	doc, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	pkgDoc, _, _ := strings.Cut(string(doc), "package main")
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, item, _ := strings.Cut(string(readme), "- `cmd/a2ad/` —")
	item, _, _ = strings.Cut(item, "\n- ")
	for _, c := range commands() {
		if !strings.Contains(usageText.String(), "a2ad "+c.name+" ") {
			t.Errorf("a2ad's usage does not list %s", c.name)
		}
		if !regexp.MustCompile(`(?m)^//\s+a2ad ` + c.name + `\b`).MatchString(pkgDoc) {
			t.Errorf("cmd/a2ad's package doc does not list %s", c.name)
		}
		if !strings.Contains(item, "`"+c.name+"`") {
			t.Errorf("README.md's cmd/a2ad/ item does not name `%s`", c.name)
		}
	}
}
