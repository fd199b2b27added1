package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/transport/shm"
)

// TestPlanDefaultIsSummary: plan prints one estimate line per candidate and
// no schedule unless --rounds asks for it.
func TestPlanDefaultIsSummary(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := a2ad(t, ctx, "plan").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > 10 || strings.Contains(string(out), "\n    ") || !strings.Contains(string(out), "<- auto") {
		t.Errorf("plan's default output is not the summary (%d lines):\n%s", len(lines), out)
	}
	out, err = a2ad(t, ctx, "plan", "--algo", "pairwise", "--rounds", "-1").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if n := strings.Count(string(out), "\n    round "); n != 7 { // pairwise on 8 ranks
		t.Errorf("plan --rounds -1 printed %d rounds of pairwise on 8 ranks, want 7:\n%s", n, out)
	}
}

// TestPlanMappedClass: --local-class shm-mapped prices local pairs as
// copies from registered buffers (the shm provider's mapped cost, its LL
// slot), cheaper than shm's kernel copies at 1 MiB; a tuned table's
// measured mapped link replaces the built-in one.
func TestPlanMappedClass(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	estimate := func(args ...string) (header, auto string) {
		out, err := a2ad(t, ctx, append([]string{"plan", "-n", "4", "--sizes", "1M"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		for _, l := range lines {
			if strings.HasSuffix(l, "<- auto") {
				auto = strings.Fields(l)[2]
			}
		}
		return lines[0], auto
	}
	h, mapped := estimate("--local-class", "shm-mapped")
	if !strings.Contains(h, "local(shm-mapped) alpha=3.0us beta=20.00GB/s") || !strings.Contains(h, fmt.Sprintf("ll=shm-mapped:%d,", shm.DefaultSlotBytes)) {
		t.Errorf("header %q: want the built-in shm-mapped link and shm's LL slot", h)
	}
	_, plain := estimate()
	if !(parseFloat(t, mapped) < parseFloat(t, plain)) {
		t.Errorf("1 MiB on 4 ranks: shm-mapped %s us, shm %s us; want mapped cheaper", mapped, plain)
	}
	file := filepath.Join(t.TempDir(), "links.json")
	tuned := `{"local":{"Alpha":2e-6,"Beta":2e-10,"Lanes":1},"remote":{"Alpha":1e-5,"Beta":3e-10,"Lanes":1},` +
		`"mapped":{"Alpha":4e-6,"Beta":1e-10,"Lanes":1},"local_class":"shm","remote_class":"tcp","mapped_class":"shm-mapped"}`
	if err := os.WriteFile(file, []byte(tuned), 0o600); err != nil {
		t.Fatal(err)
	}
	if h, _ := estimate("--links", file, "--local-class", "shm-mapped"); !strings.Contains(h, "local(shm-mapped) alpha=4.0us beta=10.00GB/s") {
		t.Errorf("header %q: want the tuned mapped link", h)
	}
}

func parseFloat(t *testing.T, s string) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return f
}
