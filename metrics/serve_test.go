package metrics

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// promtool returns the path of promtool (Debian package prometheus), failing
// the test when it is missing: the lint is part of the suite, not optional.
func promtool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/promtool"); err == nil {
		return "/usr/bin/promtool"
	}
	t.Fatal("promtool not found in PATH nor at /usr/bin/promtool: run make deps (Debian package prometheus)")
	return ""
}

// runPromtool runs promtool with args and stdin, failing the test with its
// output unless it exits 0.
func runPromtool(t *testing.T, stdin []byte, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, promtool(t), args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
}

// fedRegistry returns a registry whose Observer has seen every kind of event,
// so every family has at least one series.
func fedRegistry(t *testing.T) *prometheus.Registry {
	t.Helper()
	o, reg := newObserver(t)
	o.OpDone(a2a.OpEvent{Op: "alltoallv", Algo: "pairwise", Size: 4, Duration: time.Millisecond, BytesSent: 10, BytesReceived: 20, LastPeer: 1, LastWait: time.Millisecond})
	o.OpDone(a2a.OpEvent{Op: "alltoallv", Algo: "fullmesh", Size: 4, Err: a2a.ErrTimeout, LastPeer: -1})
	o.CountsExchanged(time.Millisecond, nil)
	o.SetMembership(4)
	o.WatchTransport(func() uint64 { return 1 })
	o.WatchPeerBytes(func() transport.Stats {
		return transport.Stats{BytesSent: []uint64{0, 100}, BytesReceived: []uint64{0, 200}}
	})
	o.ObserveDispatch(time.Millisecond, []int{3, 1}, 1, 1.5)
	o.ObserveCombine(time.Millisecond)
	o.ObserveLoad([]float64{2, 1}, 1.2)
	o.ObserveReplace(2, 100, time.Millisecond)
	// a2ad serve's families, on the same registry so one check covers both.
	if err := RegisterControl(reg, func() []control.GroupView {
		return []control.GroupView{{Group: "g", Epoch: 1, Size: 2, Ranks: []control.RankView{{Rank: 0}, {Rank: 1, Lost: true}}}}
	}); err != nil {
		t.Fatal(err)
	}
	if err := RegisterControlTraffic(reg, moeTraffic()); err != nil {
		t.Fatal(err)
	}
	if err := RegisterControlMoE(reg, moeTraffic()); err != nil {
		t.Fatal(err)
	}
	return reg
}

// scrape returns what Handler serves for reg in the text format.
func scrape(t *testing.T, reg prometheus.Gatherer) []byte {
	t.Helper()
	rec := httptest.NewRecorder()
	Handler(reg).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: status %d: %s", rec.Code, rec.Body.String())
	}
	return rec.Body.Bytes()
}

// TestPromtoolCheckMetrics lints the exposition with the Prometheus project's
// own rules (_total counters, base units, help text, ...).
func TestPromtoolCheckMetrics(t *testing.T) {
	text := scrape(t, fedRegistry(t))
	for _, fam := range []string{"a2a_collective_duration_seconds_bucket", "a2a_moe_dispatched_tokens_total", "a2a_peer_wait_seconds_total", "a2a_rejected_connections_total"} {
		if !bytes.Contains(text, []byte(fam)) {
			t.Errorf("exposition lacks %s", fam)
		}
	}
	runPromtool(t, text, "check", "metrics")
}

// TestPromtoolCatchesBadNames makes sure the lint above can fail: promtool
// rejects a counter without the _total suffix.
func TestPromtoolCatchesBadNames(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, promtool(t), "check", "metrics")
	cmd.Stdin = strings.NewReader("# HELP a2a_sent_bytes Bytes.\n# TYPE a2a_sent_bytes counter\na2a_sent_bytes 1\n")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "_total") {
		t.Errorf("promtool accepted a counter without _total: err=%v out=%s", err, out)
	}
}

// TestPrometheusConfig validates deploy/prometheus/prometheus.yml.
func TestPrometheusConfig(t *testing.T) {
	path, err := filepath.Abs(filepath.Join("..", "deploy", "prometheus", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, nil, "check", "config", path)
}

func TestServe(t *testing.T) {
	reg := fedRegistry(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := Serve(ctx, "127.0.0.1:0", reg)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`a2a_membership_size{group="g",rank="2"} 4`)) {
		t.Errorf("GET /metrics: %d\n%s", resp.StatusCode, body)
	}
	if resp, err := client.Get("http://" + addr + "/other"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /other: %v %v, want 404", resp, err)
	} else {
		resp.Body.Close()
	}

	// A busy port is an error, not a silent second server.
	if _, err := Serve(ctx, addr, reg); err == nil {
		t.Errorf("Serve on the busy %s succeeded", addr)
	}

	// Cancelling ctx closes the listener.
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("%s still accepts connections after cancel", addr)
		}
		time.Sleep(10 * time.Millisecond)
	}

	if _, err := Serve(context.Background(), "127.0.0.1:0", nil); !errors.Is(err, a2a.ErrInvalidArgument) {
		t.Errorf("Serve with a nil Gatherer = %v, want ErrInvalidArgument", err)
	}
	if _, err := Serve(context.Background(), "not an address", reg); err == nil {
		t.Error("Serve on a bad address succeeded")
	}
}

// A context already done when Serve is called must not start a server that
// nothing will stop.
func TestServeCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Serve(ctx, "127.0.0.1:0", prometheus.NewRegistry()); !errors.Is(err, context.Canceled) {
		t.Errorf("Serve with a cancelled ctx = %v, want context.Canceled", err)
	}
}
