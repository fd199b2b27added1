package modtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// readmeHarness is the program around the README's MoE block: it joins the
// group, gives the block what its prose says it has (ctx, c, T token rows x
// of H float32, the router's T x E logits, an expert), and checks the
// combined rows. The expert doubles its rows and the gate's weights sum to 1
// per token with no capacity limit, so every combined row is twice its
// token's row.
const readmeHarness = `package main

import (
	"context"
	"fmt"
	"math"
	"os"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/dispatch"
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
	const T, E, H = 12, 4, 8
	x, logits := make([]float32, T*H), make([]float32, T*E)
	for i := range x {
		x[i] = float32(100*c.Rank() + i)
	}
	for i := range logits {
		logits[i] = float32((7*i + 3*c.Rank()) % 5)
	}
	double := func(e int, in, out []float32) {
		for i, v := range in {
			out[i] = 2 * v
		}
	}
	y, err := layer(ctx, c, x, logits, T, E, H, double)
	if err != nil {
		panic(err)
	}
	for i, v := range y {
		if want := 2 * x[i]; math.Abs(float64(v-want)) > 1e-5*math.Abs(float64(want)) {
			fmt.Printf("rank %d: element %d is %v, want %v\n", c.Rank(), i, v, want)
			os.Exit(1)
		}
	}
	fmt.Printf("rank %d: README MoE step verified\n", c.Rank())
}

func layer(ctx context.Context, c *a2a.Comm, x, logits []float32, T, E, H int, expert func(e int, in, out []float32)) ([]float32, error) {
%s
	return y, err
}
`

// TestReadmeMoEBlock runs the README's MoE block, as written, in a module of
// its own (as a newcomer would paste it) on 2 ranks under a2ad run.
func TestReadmeMoEBlock(t *testing.T) {
	block := readmeBlock(t, "dispatch.New(")
	var body strings.Builder
	for line := range strings.Lines(block) {
		body.WriteString("\t" + line)
	}
	root, dir := buildModule(t, strings.Replace(readmeHarness, "%s", strings.TrimRight(body.String(), "\n"), 1))
	a2ad := buildA2ad(t, root, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, a2ad, "run", "-n", "2", "--", filepath.Join(dir, "newcomer")).CombinedOutput()
	if err != nil || strings.Count(string(out), "README MoE step verified") != 2 {
		t.Fatalf("a2ad run -n 2 -- the README's MoE block: %v\n%s", err, out)
	}
}

// readmeBlock returns the one ```go block of README.md that contains marker.
func readmeBlock(t *testing.T, marker string) string {
	t.Helper()
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	parts := strings.Split(string(data), "```go\n")
	for _, p := range parts[1:] {
		block, _, ok := strings.Cut(p, "```")
		if ok && strings.Contains(block, marker) {
			found = append(found, block)
		}
	}
	if len(found) != 1 {
		t.Fatalf("README.md has %d ```go blocks containing %q, want 1", len(found), marker)
	}
	return found[0]
}
