package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// prometheusBin returns the Prometheus server binary (Debian package
// prometheus), failing the test when it is missing.
func prometheusBin(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("prometheus"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/prometheus"); err == nil {
		return "/usr/bin/prometheus"
	}
	t.Fatal("prometheus not found in PATH nor at /usr/bin/prometheus: run make deps (Debian package prometheus)")
	return ""
}

// startProcess starts cmd in its own process group and makes sure the whole
// group is gone when the test ends: SIGTERM, then SIGKILL after a grace
// period. The demo's ranks also die with their launcher (Pdeathsig).
func startProcess(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
}

// TestPrometheusScrapesDemo runs the demo's 4 ranks (processes, as make demo
// does) and a real Prometheus server scraping each rank's /metrics every
// 200ms, then asks Prometheus's query API for the MoE and collective series.
func TestPrometheusScrapesDemo(t *testing.T) {
	prom := prometheusBin(t)
	const ranks = 4

	// The demo runs a few steps, then holds its metrics up until the test
	// stops it.
	demo := exec.Command(moeBin, "-n", strconv.Itoa(ranks), "--tokens", "64", "--hidden", "16", "--ffn", "16",
		"--steps", "10", "--interval", "100ms", "--hold", "60s", "--skew", "1", "--capacity", "1")
	stdout, err := demo.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	demo.Stderr = &prefixWriter{t: t, prefix: "demo: "}
	startProcess(t, demo)
	targets := make(chan []string, 1)
	go func() {
		re := regexp.MustCompile(`^rank (\d+) metrics http://([^/]+)/metrics$`)
		var found []string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				found = append(found, strconv.Quote(m[2]))
				if len(found) == ranks {
					targets <- found
				}
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	var addrs []string
	select {
	case addrs = <-targets:
	case <-time.After(15 * time.Second):
		t.Fatal("the demo did not print its ranks' metrics addresses")
	}

	dir := t.TempDir()
	config := fmt.Sprintf(`global:
  scrape_interval: 200ms
  scrape_timeout: 150ms
scrape_configs:
  - job_name: moe
    static_configs:
      - targets: [%s]
`, strings.Join(addrs, ", "))
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	promAddr := freeAddr(t)
	startProcess(t, exec.Command(prom, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr, "--log.level=warn"))

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	// Every rank scraped successfully at least twice.
	eventually(t, ctx, promAddr, `count(count_over_time(up{job="moe"}[1m]) >= 2 and up{job="moe"} == 1)`, func(v float64) bool { return v == ranks })
	for _, q := range []struct {
		query string
		want  func(float64) bool
		what  string
	}{
		// Every rank dispatched tokens and its experts' counters add up.
		{`count(count by (rank) (a2a_moe_dispatched_tokens_total > 0))`, eq(ranks), "ranks with dispatched tokens"},
		{`sum(a2a_moe_dispatched_tokens_total)`, gt(0), "dispatched tokens"},
		{`count(a2a_moe_dispatched_tokens_total)`, eq(ranks * 16), "(rank, expert) token series"},
		{`sum(a2a_moe_dropped_tokens_total)`, gt(0), "dropped tokens (capacity 1 with skewed routing)"},
		{`min(a2a_moe_dispatch_duration_seconds_count)`, eq(10), "dispatches per rank"},
		{`min(a2a_moe_combine_duration_seconds_count)`, eq(10), "combines per rank"},
		{`max(a2a_moe_load_imbalance_ratio)`, gt(1), "load imbalance"},
		{`min(sum by (rank) (a2a_collective_duration_seconds_count))`, gt(20), "collectives per rank"},
		{`min(sum by (rank) (a2a_sent_bytes_total))`, gt(0), "bytes sent per rank"},
		{`min(sum by (rank) (a2a_received_bytes_total))`, gt(0), "bytes received per rank"},
		{`min(a2a_membership_size)`, eq(ranks), "membership size"},
	} {
		eventually(t, ctx, promAddr, q.query, q.want)
	}
}

func eq(x float64) func(float64) bool { return func(v float64) bool { return v == x } }
func gt(x float64) func(float64) bool { return func(v float64) bool { return v > x } }

// eventually polls Prometheus's instant query API until query's single
// value satisfies ok, failing the test at ctx's deadline with the last value.
func eventually(t *testing.T, ctx context.Context, addr, query string, ok func(float64) bool) {
	t.Helper()
	last := "no answer"
	for {
		v, err := promQuery(ctx, addr, query)
		switch {
		case err != nil:
			last = err.Error()
		case ok(v):
			return
		default:
			last = fmt.Sprint(v)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Prometheus query %s: %s", query, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// promQuery runs an instant query whose result is one sample.
func promQuery(ctx context.Context, addr, query string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/api/v1/query?query="+url.QueryEscape(query), nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, fmt.Errorf("decoding the answer: %w", err)
	}
	if body.Status != "success" {
		return 0, fmt.Errorf("status %q: %s", body.Status, body.Error)
	}
	if len(body.Data.Result) != 1 {
		return 0, fmt.Errorf("%d samples, want 1", len(body.Data.Result))
	}
	s, _ := body.Data.Result[0].Value[1].(string)
	return strconv.ParseFloat(s, 64)
}

// freeAddr returns a loopback address with a port free at the time of the call.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// prefixWriter logs a child's stderr through the test.
type prefixWriter struct {
	t      *testing.T
	prefix string
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.t.Log(w.prefix + line)
	}
	return len(p), nil
}
