package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPlanMoE runs a2ad plan --moe on Zipf 1.2 loads of 64 experts, 8
// ranks, 8 redundant slots (issue 20's case): the balanced placement's
// max/mean rank load is at most 1.10 against well over 4 for the contiguous
// one, every rank lists 9 experts, and the hottest expert has replicas.
func TestPlanMoE(t *testing.T) {
	var loads []string
	for e := range 64 {
		loads = append(loads, strconv.FormatFloat(1000/math.Pow(float64(e+1), 1.2), 'f', 2, 64))
	}
	file := filepath.Join(t.TempDir(), "loads")
	if err := os.WriteFile(file, []byte(strings.Join(loads, ", ")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := a2ad(t, ctx, "plan", "--moe", file, "-n", "8", "--redundant", "8").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	m := regexp.MustCompile(`(?m)^max/mean rank load: contiguous ([\d.]+), balanced ([\d.]+)$`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no imbalance line in:\n%s", out)
	}
	before, _ := strconv.ParseFloat(string(m[1]), 64)
	after, _ := strconv.ParseFloat(string(m[2]), 64)
	if before < 4 || after > 1.10 {
		t.Errorf("imbalance contiguous %v, balanced %v: want > 4 and <= 1.10\n%s", before, after, out)
	}
	ranks := regexp.MustCompile(`(?m)^rank \d: load \S+, experts((?: \d+(?:/\d)?){9})$`).FindAll(out, -1)
	if len(ranks) != 8 || !bytes.Contains(out, []byte(" 0/")) {
		t.Errorf("%d rank lines of 9 experts, want 8, and replicas of expert 0:\n%s", len(ranks), out)
	}
	out, err = a2ad(t, ctx, "plan", "--moe", file, "-n", "8", "--redundant", "3").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--redundant 3") {
		t.Errorf("67 slots on 8 ranks: %v, want an error naming --redundant\n%s", err, out)
	}
}

// TestReadLoadsFromMetrics reads the loads a rank's /metrics exports, in
// any order among other families, and a plain list.
func TestReadLoadsFromMetrics(t *testing.T) {
	metrics := `# HELP a2a_moe_expert_load Estimated rows
# TYPE a2a_moe_expert_load gauge
a2a_moe_expert_load{expert="2",group="g",rank="0"} 30
a2a_moe_expert_load{expert="0",group="g",rank="0"} 10.5
a2a_moe_dispatched_tokens_total{expert="1",group="g",rank="0"} 99
a2a_moe_expert_load{expert="1",group="g",rank="0"} 20
`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, metrics) }))
	defer srv.Close()
	for _, tc := range []struct{ source, want string }{
		{srv.URL + "/metrics", "[10.5 20 30]"},
	} {
		got, err := readLoads(context.Background(), tc.source)
		if err != nil || fmt.Sprint(got) != tc.want {
			t.Errorf("%s: %v, %v, want %s", tc.source, got, err, tc.want)
		}
	}
	if got, err := parseLoads("1 2\n3,4"); err != nil || fmt.Sprint(got) != "[1 2 3 4]" {
		t.Errorf("plain list: %v, %v", got, err)
	}
	if _, err := parseLoads("1 two 3"); err == nil {
		t.Error("a word among the loads was accepted")
	}
}
