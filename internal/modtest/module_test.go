// Package modtest checks that code outside this repository builds against
// the module path, as `go get github.com/a2a-moe/a2a` would give it.
package modtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// userProgram is what a newcomer writes after `go get`: an AllToAllV
// through the public API, and a dispatcher on top.
const userProgram = `package main

import (
	"context"
	"fmt"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/dispatch"
	"github.com/a2a-moe/a2a/metrics"
	"github.com/a2a-moe/a2a/routing"
)

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
	send := make([]byte, 4*c.Size())
	counts := make([]int, c.Size())
	for i := range counts {
		counts[i] = 4
	}
	recvCounts, err := c.ExchangeCounts(ctx, counts)
	if err != nil {
		panic(err)
	}
	recv := make([]byte, 4*c.Size())
	if err := c.AllToAllV(ctx, send, counts, recv, recvCounts); err != nil {
		panic(err)
	}
	_ = dispatch.Config{}
	_ = routing.Contiguous
	_ = metrics.Options{}
	fmt.Println(c.Rank(), recv[0])
}
`

// TestBuildOutsideTheRepository makes a module of its own that requires
// github.com/a2a-moe/a2a, replaced by this checkout since the module is not
// published, lets the go command fill in its requirements (-mod=mod, with
// the module cache only: GOPROXY=off), and builds and vets it.
func TestBuildOutsideTheRepository(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	goMod := "module example.com/newcomer\n\ngo 1.26.0\n\nrequire github.com/a2a-moe/a2a v0.0.0\n\nreplace github.com/a2a-moe/a2a => " + root + "\n"
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"go.mod": []byte(goMod), "go.sum": sum, "main.go": []byte(userProgram)} {
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
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mod), "github.com/nats-io/nats.go") {
		t.Errorf("go mod tidy did not record a2a's requirements:\n%s", mod)
	}
	if _, err := os.Stat(filepath.Join(dir, "newcomer")); err != nil {
		t.Error(err)
	}
}
