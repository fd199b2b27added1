package main

import (
	"context"
	"strings"
	"testing"
	"time"
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
