package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLiveViewMoE loads a2ad serve's /ui/ in headless chromium at 1400 px
// while four ranks of the MoE demo (a2ad run of examples/moe, FP8 rows,
// skewed router, a re-placement every few steps) report to it: the MoE
// panel shows tokens per expert over time, the rank load with its
// re-placements marked, the drops, step quantiles and the bytes FP8 saved;
// the traffic matrix carries the shared-memory rows as class local; no card
// scrolls sideways; /metrics has the same figures.
func TestLiveViewMoE(t *testing.T) {
	chromium := needChromium(t)
	moe := filepath.Join(binDir, "moe")
	if err := goBuild(moe, "../../examples/moe"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	serve := startUIServe(t, ctx)

	// One host: the rows go through shared memory, the counts through the
	// data plane.
	const n = 4
	group := fmt.Sprintf("moeui%d", os.Getpid())
	run := a2ad(t, ctx, "run", "--nats", "nats://"+serve.natsAddr, "--creds", serve.creds, "--group", group, "-n", strconv.Itoa(n), "--",
		moe, "--worker", "-n", strconv.Itoa(n), "--experts", "16", "--k", "2", "--tokens", "96", "--hidden", "128", "--ffn", "16",
		"--skew", "1.2", "--capacity", "1.0", "--wire", "fp8", "--redundant", "4", "--rebalance-every", "20",
		"--steps", "100000", "--interval", "20ms")
	run.Env = append(os.Environ(), "A2A_REPORT=200ms")
	var out bytes.Buffer
	run.Stdout, run.Stderr = &out, &out
	run.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	run.Cancel = func() error { return syscall.Kill(-run.Process.Pid, syscall.SIGKILL) }
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		syscall.Kill(-run.Process.Pid, syscall.SIGKILL)
		run.Wait()
	}()

	g := waitForMoE(t, ctx, serve.uiURL+"api/groups", group, &out)
	profile := t.TempDir()
	dom := runChromium(t, ctx, chromium, profile, "--window-size=1400,1000", "--dump-dom", serve.uiURL)
	checkMoEPage(t, dom, group, g)
	shot := screenshot(t, ctx, chromium, profile, "a2ad-live-view-moe.png", "1400,2200", serve.uiURL)
	t.Logf("screenshot of the MoE panel: %s", shot)
	checkMoESeries(t, scrape(t, serve.metricsURL), group)
}

// waitForMoE polls the live view's API until group's MoE panel has
// history, a re-placement, drops, FP8 savings and shared-memory traffic.
func waitForMoE(t *testing.T, ctx context.Context, api, group string, out *bytes.Buffer) uiGroup {
	t.Helper()
	var last string
	for ctx.Err() == nil {
		g, raw, ok := moeGroup(api, group)
		last = raw
		if ok && moeReady(g) {
			return g
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("group %s's MoE panel never filled; last state: %.3000s\nranks: %.2000s", group, last, out.String())
	return uiGroup{}
}

func moeGroup(api, group string) (uiGroup, string, bool) {
	resp, err := http.Get(api)
	if err != nil {
		return uiGroup{}, err.Error(), false
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var st uiState
	if err := json.Unmarshal(raw, &st); err != nil {
		return uiGroup{}, string(raw), false
	}
	for _, g := range st.Groups {
		if g.Group == group {
			return g, string(raw), g.MoE != nil && g.Traffic != nil
		}
	}
	return uiGroup{}, string(raw), false
}

// moeReady: every figure the page is checked for is there.
func moeReady(g uiGroup) bool {
	m := g.MoE
	local := uint64(0)
	for _, row := range g.Traffic.Local {
		for _, v := range row {
			local += v
		}
	}
	saved := uint64(0)
	for _, w := range m.Wire {
		if w.Format == "fp8" {
			saved = w.Saved
		}
	}
	return len(m.Ages) >= 5 && len(m.ReplaceAges) > 0 && m.Dropped > 0 && saved > 0 && local > 0 &&
		m.Dispatch.Steps > 0 && m.Combine.Steps > 0 && m.Experts == 16
}

var (
	svgTag  = regexp.MustCompile(`<svg [^>]*>`)
	markTag = regexp.MustCompile(`<line [^>]*class="replace-mark"[^>]*data-count="[1-9][0-9]*"[^>]*>`)
)

// checkMoEPage checks the dumped DOM of the page against g, the state the
// API showed just before.
func checkMoEPage(t *testing.T, dom, group string, g uiGroup) {
	t.Helper()
	if !strings.Contains(dom, `data-moe="`+group+`"`) {
		status := regexp.MustCompile(`<p id="status"[^>]*>[^<]*`).FindString(dom)
		t.Fatalf("the page has no MoE panel for %s; status %q, cards %q", group, status,
			regexp.MustCompile(`<h3>[^<]*`).FindAllString(dom, -1))
	}
	charts := map[string]map[string]string{}
	for _, tag := range svgTag.FindAllString(dom, -1) {
		a := map[string]string{}
		for _, m := range attr.FindAllStringSubmatch(tag, -1) {
			a[m[1]] = m[2]
		}
		if k := a["data-heatmap"] + a["data-timeline"]; k != "" {
			charts[k] = a
		}
	}
	if c := charts["tokens"]; c == nil || c["data-rows"] != "16" || atoi(c["data-lit"]) == 0 {
		t.Errorf("tokens heatmap %v: want 16 experts, cells lit", c)
	}
	if c := charts["load"]; c == nil || c["data-rows"] != "4" || atoi(c["data-lit"]) == 0 {
		t.Errorf("load heatmap %v: want 4 ranks, cells lit", c)
	}
	if c := charts["imbalance"]; c == nil || atoi(c["data-samples"]) < 5 {
		t.Errorf("imbalance timeline %v: want samples", c)
	}
	if len(markTag.FindAllString(dom, -1)) == 0 {
		t.Error("the imbalance timeline marks no re-placement")
	}
	for _, re := range []string{`data-dropped="[1-9][0-9]*"`, `data-wire="fp8" data-saved="[1-9][0-9]*"`,
		`data-step="dispatch" data-steps="[1-9][0-9]*" data-p50="[0-9.e-]+" data-p99="[0-9.e-]+"`,
		`data-step="combine" data-steps="[1-9]`, `data-local-total="[1-9][0-9]*"`} {
		if !regexp.MustCompile(re).MatchString(dom) {
			t.Errorf("the page lacks %s", re)
		}
	}
	// The shared-memory rows are in the traffic matrix, class local.
	local := 0
	for _, tag := range cellTag.FindAllString(dom, -1) {
		if m := regexp.MustCompile(`data-local="([0-9]+)"`).FindStringSubmatch(tag); m != nil && atoi(m[1]) > 0 {
			local++
		}
	}
	if local == 0 {
		t.Error("no cell of the traffic matrix has local bytes")
	}
	// At 1400 px no card scrolls sideways (app.js marks those that do).
	if strings.Contains(dom, `data-overflows="true"`) {
		t.Errorf("a card scrolls sideways at 1400 px: %s", regexp.MustCompile(`<div class="card[^"]*"[^>]*data-overflows="true"[^>]*>.{0,80}`).FindString(dom))
	}
	if !strings.Contains(dom, `data-overflows="false"`) {
		t.Error("the page did not measure its cards")
	}
}

func atoi(s string) int {
	v, _ := strconv.Atoi(s)
	return v
}

// checkMoESeries: /metrics has the MoE figures /ui/ draws.
func checkMoESeries(t *testing.T, body, group string) {
	t.Helper()
	q := regexp.QuoteMeta(group)
	for _, re := range []string{
		`a2a_control_moe_tokens_total\{expert="3",group="` + q + `"\} [1-9]`,
		`a2a_control_moe_rank_rows_total\{group="` + q + `",rank="0"\} [1-9]`,
		`a2a_control_moe_dropped_total\{group="` + q + `"\} [1-9]`,
		`a2a_control_moe_dispatch_duration_seconds_count\{group="` + q + `"\} [1-9]`,
		`a2a_control_moe_combine_duration_seconds_count\{group="` + q + `"\} [1-9]`,
		`a2a_control_moe_wire_saved_bytes_total\{format="fp8",group="` + q + `"\} [1-9]`,
		`a2a_control_moe_replacements_total\{group="` + q + `"\} [1-9]`,
		`a2a_control_traffic_local_bytes_total\{from="0",group="` + q + `",to="1"\} [1-9]`,
	} {
		if !regexp.MustCompile(`(?m)^` + re).MatchString(body) {
			t.Errorf("/metrics lacks %s", re)
		}
	}
}
