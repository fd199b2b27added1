package doctest

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The blocks run only when asked (make test-docs): they build and run the
// demo, go test and the like, which go test ./... running every package at
// once on 2 cores would slow down for the others. The pages' form is checked
// always (TestPages).
var runDocs = flag.Bool("docs", false, "run the documented commands (make test-docs)")

// root is the repository root, where the pages' commands run.
const root = "../.."

// blockTimeout bounds one script (a sh block, a console command): the
// longest, make demo, takes about 15 s.
const blockTimeout = 3 * time.Minute

// TestPages checks the form of every page: each fence has a language, each
// doc-test comment parses and says why a block is skipped, a block run by a
// test names a test that exists, console blocks start with a command, and
// every entry of Known names a command of a page.
func TestPages(t *testing.T) {
	blocks := allBlocks(t)
	byID := map[string]Block{}
	for _, b := range blocks {
		byID[b.ID()] = b
		if b.Mark.Kind != Run && !b.IsCommand() {
			t.Errorf("%s:%d: a doc-test comment before a %s block, which is not run anyway", b.Page, b.Line, b.Lang)
		}
		switch b.Mark.Kind {
		case RunBy:
			if !testExists(t, b.Mark.Pkg, b.Mark.Test) {
				t.Errorf("%s:%d: run by %s %s: no such test", b.Page, b.Line, b.Mark.Pkg, b.Mark.Test)
			}
		case Skip:
			if b.Mark.Cmd != "" && !slices.ContainsFunc(commandsOf(b), b.skips) {
				t.Errorf("%s:%d: skip %q: no such command in the block", b.Page, b.Line, b.Mark.Cmd)
			}
		}
		if b.Lang == "console" {
			if _, err := b.Steps(); err != nil {
				t.Error(err)
			}
		}
	}
	for _, k := range Known {
		b, ok := byID[k.Block]
		if !ok || !slices.ContainsFunc(commandsOf(b), func(cmd string) bool { return Bare(cmd) == k.Cmd }) {
			t.Errorf("Known: %s has no command %q: remove or update the entry", k.Block, k.Cmd)
		}
	}
}

// commandsOf returns the command lines of a sh, bash or console block, all of
// them, skipped or not.
func commandsOf(b Block) []string {
	if b.Lang == "console" {
		steps, _ := b.Steps()
		var cmds []string
		for _, s := range steps {
			cmds = append(cmds, s.Cmd)
		}
		return cmds
	}
	b.Mark = Mark{}
	return b.Commands()
}

// testExists reports whether package dir (from the repository root) has a
// test function named name.
func testExists(t *testing.T, dir, name string) bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, dir, "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(src, []byte("\nfunc "+name+"(t *testing.T) {")) {
			return true
		}
	}
	return false
}

// allBlocks parses every page.
func allBlocks(t *testing.T) []Block {
	t.Helper()
	pages, err := Pages(root)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []Block
	for _, p := range pages {
		bs, err := Parse(root, p)
		if err != nil {
			t.Error(err)
		}
		blocks = append(blocks, bs...)
	}
	return blocks
}

// TestDocs runs every command block of the pages that no doc-test comment
// skips or gives to a test of its own, one after the other, in the
// repository root as a user in a checkout would. Each command must exit with
// status 0 and print the output its page shows, and leave no process behind.
func TestDocs(t *testing.T) {
	if !*runDocs {
		t.Skip("the documented commands run in make test-docs (go test ./internal/doctest -args -docs)")
	}
	env := docEnv(t)
	for _, b := range allBlocks(t) {
		if !b.IsCommand() || b.Mark.Kind == RunBy || (b.Mark.Kind == Skip && b.Mark.Cmd == "") {
			continue
		}
		t.Run(b.ID(), func(t *testing.T) {
			start := time.Now()
			if b.Lang == "console" {
				runConsole(t, env, b)
			} else {
				runShell(t, env, b)
			}
			t.Logf("%s:%d: %.1fs", b.Page, b.Line, time.Since(start).Seconds())
		})
	}
}

// docEnv is the environment of the pages' commands: a home directory of their
// own, the binaries a page calls by name (moe, a2ad, ...) built from this
// checkout first on PATH, and no A2A_* variable of the caller's. Go's caches
// and settings stay the caller's, which the new home would otherwise move
// (and, without a network, leave go unable to build).
func docEnv(t *testing.T) []string {
	t.Helper()
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+string(filepath.Separator), "./cmd/...", "./examples/moe")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the commands: %v\n%s", err, out)
	}
	goVars := []string{"GOCACHE", "GOMODCACHE", "GOPATH", "GOENV"}
	goenv, err := exec.Command("go", append([]string{"env"}, goVars...)...).Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	vals := strings.Split(strings.TrimSpace(string(goenv)), "\n")
	if len(vals) != len(goVars) {
		t.Fatalf("go env: %q", goenv)
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "A2A_") || strings.HasPrefix(kv, "HOME=") || strings.HasPrefix(kv, "PATH=")
	})
	env = append(env, "HOME="+t.TempDir(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	for i, v := range goVars {
		env = append(env, v+"="+vals[i])
	}
	return env
}

// Marks that a wrapped broken line prints, to tell how it went.
const (
	brokenFailed = "doc-test: broken line failed: "
	brokenPassed = "doc-test: broken line passed: "
)

// runShell runs a sh or bash block as one bash script, so that its exports
// reach its later lines; a line of Known runs wrapped, so that its failure
// is seen but does not stop the script.
func runShell(t *testing.T, env []string, b Block) {
	var lines []string
	known := map[int]Broken{}
	for i, cmd := range b.Commands() {
		br, ok := KnownBroken(b.ID(), cmd)
		if !ok {
			lines = append(lines, cmd)
			continue
		}
		known[i] = br
		lines = append(lines, fmt.Sprintf("if %s\nthen echo '%s%d'; else echo '%s%d'; fi", cmd, brokenPassed, i, brokenFailed, i))
	}
	script := "set -eo pipefail\n" + strings.Join(lines, "\n")
	out, err := runBash(t, env, script)
	if err != nil {
		t.Fatalf("%s:%d: %v\n--- script\n%s\n--- output\n%s", b.Page, b.Line, err, script, out)
	}
	for i, br := range known {
		switch {
		case strings.Contains(out, fmt.Sprintf("%s%d\n", brokenPassed, i)):
			t.Errorf("%s: %q passes now: remove its entry from doctest.Known (%s)", br.Block, br.Cmd, br.Reason)
		case strings.Contains(out, fmt.Sprintf("%s%d\n", brokenFailed, i)):
			t.Logf("%s: %q fails, as known: %s", br.Block, br.Cmd, br.Reason)
		default:
			t.Errorf("%s: %q did not run", br.Block, br.Cmd)
		}
	}
}

// runConsole runs each "$ " command of a console block and checks that the
// lines the page shows after it are in its output, in order.
func runConsole(t *testing.T, env []string, b Block) {
	steps, err := b.Steps()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		out, err := runBash(t, env, "set -eo pipefail\n"+s.Cmd)
		if br, ok := KnownBroken(b.ID(), s.Cmd); ok {
			if err == nil {
				t.Errorf("%s: %q passes now: remove its entry from doctest.Known (%s)", br.Block, br.Cmd, br.Reason)
			} else {
				t.Logf("%s: %q fails, as known: %s", br.Block, br.Cmd, br.Reason)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s:%d: $ %s: %v\n%s", b.Page, b.Line, s.Cmd, err, out)
		}
		if line, ok := MatchOutput(s.Output, out); !ok {
			t.Errorf("%s:%d: $ %s: the output has no line like %q (after the lines before it):\n%s", b.Page, b.Line, s.Cmd, line, out)
		}
	}
}

// runBash runs script with bash in the repository root, in a process group of
// its own, and returns its output. What the script leaves running is an
// error, and is killed with the group.
func runBash(t *testing.T, env []string, script string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), blockTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir, cmd.Env = root, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("not done after %v: %w", blockTimeout, err)
	}
	if cmd.Process != nil && !groupGone(cmd.Process.Pid) {
		t.Errorf("%q left processes running (killed now)", script)
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	return out.String(), err
}

// groupGone reports whether process group pgid is empty, giving the
// processes that were ending with their parent a moment to be reaped.
func groupGone(pgid int) bool {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if syscall.Kill(-pgid, 0) != nil {
			return true
		}
	}
	return false
}
