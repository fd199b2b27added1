// Package modtest checks that code outside this repository builds against
// the module path, as `go get github.com/a2a-moe/a2a` would give it.
package modtest

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// userProgram is what a newcomer writes after `go get`: an AllToAllV
// through the public API, and a dispatcher on top.
const userProgram = `package main

import (
	"context"
	"fmt"
	"os"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/dispatch"
	"github.com/a2a-moe/a2a/metrics"
	"github.com/a2a-moe/a2a/routing"
)

// Every rank sends rank j a block of j+1 bytes of value 16*rank+j, learns
// what it gets with ExchangeCounts, and checks every byte.
func main() {
	cfg, err := a2a.ConfigFromEnv()
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	c, err := a2a.Join(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	me, n := c.Rank(), c.Size()
	counts := make([]int, n)
	var send []byte
	for j := range n {
		counts[j] = j + 1
		for range j + 1 {
			send = append(send, byte(16*me+j))
		}
	}
	recvCounts, err := c.ExchangeCounts(ctx, counts)
	if err != nil {
		panic(err)
	}
	recv := make([]byte, n*(me+1))
	if err := c.AllToAllV(ctx, send, counts, recv, recvCounts); err != nil {
		panic(err)
	}
	for i, b := range recv {
		if src := i / (me + 1); recvCounts[src] != me+1 || b != byte(16*src+me) {
			fmt.Printf("rank %d: byte %d from rank %d is %d, want %d\n", me, i, src, b, 16*src+me)
			os.Exit(1)
		}
	}
	_ = dispatch.Config{}
	_ = routing.Contiguous
	_ = metrics.Options{}
	fmt.Printf("rank %d of %d verified over %s\n", me, n, c.TransportName())
}
`

// newcomerOut, when set, is where the test leaves the newcomer's binary:
// make test-rdma runs it in the RDMA lab under a2ad run over verbs.
var newcomerOut = flag.String("newcomer-out", "", "copy the built user program here")

// TestBuildOutsideTheRepository makes a module of its own that requires
// github.com/a2a-moe/a2a, replaced by this checkout since the module is not
// published, lets the go command fill in its requirements (-mod=mod, with
// the module cache only: GOPROXY=off), builds and vets it, and runs it as 3
// ranks under a2ad run: each verifies every byte of an AllToAllV.
func TestBuildOutsideTheRepository(t *testing.T) {
	root, dir := buildModule(t, userProgram)
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mod), "github.com/nats-io/nats.go") {
		t.Errorf("go mod tidy did not record a2a's requirements:\n%s", mod)
	}
	prog := filepath.Join(dir, "newcomer")
	a2ad := buildA2ad(t, root, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := exec.CommandContext(ctx, a2ad, "run", "-n", "3", "--", prog)
	out, err := run.CombinedOutput()
	if err != nil || strings.Count(string(out), " verified over ") != 3 {
		t.Fatalf("a2ad run -n 3 -- newcomer: %v\n%s", err, out)
	}
	if *newcomerOut != "" {
		data, err := os.ReadFile(prog)
		if err == nil {
			err = os.WriteFile(*newcomerOut, data, 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// buildModule makes a module of its own in a temporary directory whose
// main.go is program, requiring github.com/a2a-moe/a2a replaced by this
// checkout since the module is not published; it lets the go command fill
// in the requirements (-mod=mod, with the module cache only: GOPROXY=off),
// builds the program as dir/newcomer and vets it. It returns the checkout's
// root and the module's directory.
func buildModule(t *testing.T, program string) (root, dir string) {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	goMod := "module example.com/newcomer\n\ngo 1.26.0\n\nrequire github.com/a2a-moe/a2a v0.0.0\n\nreplace github.com/a2a-moe/a2a => " + root + "\n"
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"go.mod": []byte(goMod), "go.sum": sum, "main.go": []byte(program)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// tidy -e: tidy also looks for the modules of the tests of every
	// dependency (testify, goleak, ...), which a machine that only built
	// a2a has not downloaded; the build and vet that follow need none.
	for _, args := range [][]string{{"mod", "tidy", "-e"}, {"build", "-o", filepath.Join(dir, "newcomer"), "."}, {"vet", "."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s\nmain.go:\n%s", strings.Join(args, " "), err, out, program)
		}
	}
	return root, dir
}

// buildA2ad builds the checkout's a2ad into dir.
func buildA2ad(t *testing.T, root, dir string) string {
	t.Helper()
	a2ad := filepath.Join(dir, "a2ad")
	if out, err := exec.Command("go", "build", "-o", a2ad, filepath.Join(root, "cmd", "a2ad")).CombinedOutput(); err != nil {
		t.Fatalf("building a2ad: %v\n%s", err, out)
	}
	return a2ad
}
