package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/internal/natsd"
)

// TestLiveView loads a2ad serve's /ui/ in headless chromium while four
// ranks run a benchmark against the serve's control plane: the traffic and
// wait matrices have one cell per pair of ranks, every pair of distinct ranks
// shows traffic, and a screenshot is kept (under $A2A_TEST_ARTIFACTS, else
// the test's temporary directory).
func TestLiveView(t *testing.T) {
	chromium := needChromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	serve := startUIServe(t, ctx)
	// The ranks log in with serve's credentials file, as a launcher passes it.
	login := []string{"A2A_CREDS=" + serve.creds}

	const n = 4
	group := fmt.Sprintf("ui%d", os.Getpid())
	ranks := make([]*exec.Cmd, n)
	for r := range n {
		// Skewed traffic so the heatmap has contrast; reports every 200ms
		// so the view fills quickly.
		cmd := a2ad(t, ctx, "bench", "--worker", "--sizes", "16K", "--dist", "zipf:1.5", "--iters", "100000000",
			"--budget", "1h", "--warmup", "1")
		cmd.Env = append(append(os.Environ(), login...), "A2A_NATS_URL=nats://"+serve.natsAddr, "A2A_GROUP="+group, "A2A_REPORT=200ms",
			"A2A_RANK="+strconv.Itoa(r), "A2A_WORLD_SIZE="+strconv.Itoa(n))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ranks[r] = cmd
	}
	defer func() {
		for _, c := range ranks {
			c.Process.Kill()
			c.Wait()
		}
	}()

	// Load the page once the API shows every pair busy, so the browser's
	// view has something to show.
	waitForTraffic(t, ctx, serve.uiURL+"api/groups", group, n)
	profile := t.TempDir()
	dom := runChromium(t, ctx, chromium, profile, "--dump-dom", serve.uiURL)
	checkMatrix(t, dom, "traffic", n, true)
	checkMatrix(t, dom, "wait", n, false)
	for _, want := range []string{`data-group="` + group + `"`, `data-op="alltoallv"`, `data-state="alive"`} {
		if !strings.Contains(dom, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	shot := screenshot(t, ctx, chromium, profile, "a2ad-live-view.png", "1280,1000", serve.uiURL)
	t.Logf("screenshot of the live view: %s", shot)

	// /metrics shares the listener.
	body := scrape(t, serve.metricsURL)
	if !strings.Contains(body, fmt.Sprintf(`a2a_control_members{group=%q} 4`, group)) {
		t.Errorf("/metrics beside /ui/ lacks the group's members:\n%.1500s", body)
	}
	checkTrafficSeries(t, body, group, n)
}

// checkTrafficSeries asserts that /metrics has the matrices /ui/ draws: a
// sent-bytes and a wait series for every pair of ranks of group, with
// bytes between every pair of distinct ranks.
func checkTrafficSeries(t *testing.T, body, group string, n int) {
	t.Helper()
	for from := range n {
		for to := range n {
			labels := fmt.Sprintf(`{from="%d",group=%q,to="%d"} `, from, group, to)
			sent := metricValue(body, "a2a_control_traffic_sent_bytes_total"+labels)
			if sent < 0 || (from != to && sent == 0) {
				t.Errorf("/metrics: a2a_control_traffic_sent_bytes_total%s is %v, want bytes", labels, sent)
			}
			if metricValue(body, "a2a_control_traffic_wait_seconds_total"+labels) < 0 {
				t.Errorf("/metrics lacks a2a_control_traffic_wait_seconds_total%s", labels)
			}
		}
	}
	ops := regexp.MustCompile(`(?m)^a2a_control_traffic_operations_total\{algo="[a-z]+",group="` + regexp.QuoteMeta(group) + `",op="alltoallv"\} [1-9]`)
	if !ops.MatchString(body) {
		t.Errorf("/metrics lacks the group's alltoallv calls:\n%.3000s", body)
	}
}

// metricValue is the value of the series that starts line of a text
// exposition, -1 when there is none.
func metricValue(body, series string) float64 {
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(line, series); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// freeAddr returns a loopback address with a free port.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitForTraffic polls the live view's API until group reports traffic
// between every pair of distinct ranks.
func waitForTraffic(t *testing.T, ctx context.Context, api, group string, n int) {
	t.Helper()
	var last string
	for ctx.Err() == nil {
		busy, state := pairsBusy(api, group, n)
		if busy {
			return
		}
		last = state
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("group %s never showed traffic between every pair of ranks; last state: %.2000s", group, last)
}

func pairsBusy(api, group string, n int) (bool, string) {
	resp, err := http.Get(api)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var st uiState
	if err := json.Unmarshal(raw, &st); err != nil {
		return false, string(raw)
	}
	for _, g := range st.Groups {
		if g.Group != group || g.Traffic == nil || len(g.Traffic.SentRate) != n {
			continue
		}
		for i := range n {
			for j := range n {
				if i != j && g.Traffic.SentRate[i][j] <= 0 {
					return false, string(raw)
				}
			}
		}
		return true, string(raw)
	}
	return false, string(raw)
}

// runChromium runs headless chromium on url with a throwaway profile and
// returns what it printed. The virtual time budget lets the page's script
// fetch and draw before the DOM is dumped or the screenshot taken.
func runChromium(t *testing.T, ctx context.Context, chromium, profile string, args ...string) string {
	t.Helper()
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage",
		"--user-data-dir=" + profile, "--virtual-time-budget=5000"}, args...)
	cmd := exec.CommandContext(ctx, chromium, all...)
	// Its helper processes go with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // stragglers, if any
	if err != nil {
		t.Fatalf("chromium %v: %v\n%.3000s", args, err, stderr.String())
	}
	return stdout.String()
}

var (
	cellTag = regexp.MustCompile(`<td [^>]*class="cell[^"]*"[^>]*>`)
	attr    = regexp.MustCompile(`([a-z-]+)="([^"]*)"`)
)

// checkMatrix finds the cells of one matrix in the dumped DOM: exactly one
// per ordered pair of n ranks, and, if busy, traffic on every pair of
// distinct ranks since the group formed and a live rate on some (a rank
// that stalls for a report period under load reads idle for that period).
func checkMatrix(t *testing.T, dom, kind string, n int, busy bool) {
	t.Helper()
	seen := map[[2]int]bool{}
	live := 0
	for _, tag := range cellTag.FindAllString(dom, -1) {
		a := map[string]string{}
		for _, m := range attr.FindAllStringSubmatch(tag, -1) {
			a[m[1]] = m[2]
		}
		if a["data-matrix"] != kind {
			continue
		}
		from, err1 := strconv.Atoi(a["data-from"])
		to, err2 := strconv.Atoi(a["data-to"])
		if err1 != nil || err2 != nil || from < 0 || from >= n || to < 0 || to >= n || seen[[2]int{from, to}] {
			t.Errorf("%s cell %s: bad or repeated pair", kind, tag)
			continue
		}
		seen[[2]int{from, to}] = true
		if !busy || from == to {
			continue
		}
		rate, _ := strconv.ParseFloat(a["data-value"], 64)
		total, _ := strconv.ParseUint(a["data-bytes"], 10, 64)
		if total == 0 {
			t.Errorf("%s cell %d->%d: %s bytes: want traffic", kind, from, to, a["data-bytes"])
		}
		if rate > 0 {
			live++
		}
	}
	if len(seen) != n*n {
		t.Errorf("%s matrix: %d cells, want %d (one per pair of %d ranks)", kind, len(seen), n*n, n)
	}
	if busy && live == 0 {
		t.Errorf("%s matrix: no pair has a live rate", kind)
	}
}

// TestLiveViewStates: /ui/api/groups names every rank's state (alive, left,
// lost) and carries the traffic its ranks reported, and /ui/ serves the page.
func TestLiveViewStates(t *testing.T) {
	ranks := natsd.NewUser("states", control.Subjects("states"))
	cp, err := startControlPlane(slog.New(slog.DiscardHandler), cpConfig{Listen: "127.0.0.1:0", Users: []natsd.User{ranks}})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Rank 2 is declared lost after 300ms of silence; the others would
	// wait 10s before calling it lost themselves, so the group stays.
	const n = 3
	conns := make([]*nats.Conn, n)
	mems := make([]*control.Member, n)
	errs := make(chan error, n)
	for r := range n {
		if conns[r], err = nats.Connect(cp.URL, append(ranks.Options(), nats.CustomInboxPrefix(control.InboxPrefix("states")))...); err != nil {
			t.Fatal(err)
		}
		defer conns[r].Close()
		timeout := 10 * time.Second
		if r == 2 {
			timeout = 300 * time.Millisecond
		}
		go func() {
			var err error
			mems[r], err = control.Join(ctx, conns[r], control.JoinConfig{Group: "states", Rank: r, WorldSize: n,
				Info: control.NodeInfo{Host: fmt.Sprintf("h%d", r/2)}, HeartbeatInterval: 100 * time.Millisecond, PeerTimeout: timeout})
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	defer mems[0].Leave()
	if err := mems[0].Report(&control.Report{Seq: 1, Period: time.Second, Elapsed: time.Second,
		Sent: []uint64{0, 2000, 4000}, Wait: []time.Duration{0, 0, time.Second / 2}, Last: []uint64{0, 0, 3},
		Ops: []control.OpCount{{Op: "alltoallv", Algo: "pairwise", Count: 3}}}); err != nil {
		t.Fatal(err)
	}
	mems[1].Leave()
	conns[2].Close()

	srv := httptest.NewServer(uiHandler(cp.svc, nil))
	defer srv.Close()
	var g uiGroup
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := getState(t, srv.URL+"/ui/api/groups")
		if len(st.Groups) == 1 && len(st.Groups[0].Ranks) == n && st.Groups[0].Traffic != nil &&
			st.Groups[0].Ranks[1].State == "left" && st.Groups[0].Ranks[2].State == "lost" {
			g = st.Groups[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("states never showed alive, left, lost: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if g.Group != "states" || g.Size != n || g.Forming || g.Ranks[0].State != "alive" || len(g.Hosts) != 2 || g.Ranks[2].Host != 1 {
		t.Errorf("group %+v", g)
	}
	if g.Ranks[0].ReportAge < 0 || g.Ranks[1].ReportAge != -1 {
		t.Errorf("report ages %v, %v: want rank 0's only", g.Ranks[0].ReportAge, g.Ranks[1].ReportAge)
	}
	tr := g.Traffic
	if tr.Sent[0][2] != 4000 || tr.SentRate[0][1] != 2000 || tr.WaitShare[0][2] != 0.5 || tr.Last[0][2] != 3 || tr.Sent[1][0] != 0 {
		t.Errorf("traffic %+v", tr)
	}
	if len(tr.Ops) != 1 || tr.Ops[0] != (uiOp{Op: "alltoallv", Algo: "pairwise", Calls: 3}) {
		t.Errorf("ops %+v", tr.Ops)
	}

	for path, want := range map[string]string{"/ui/": "<title>a2a live view</title>", "/ui/app.js": "api/groups", "/ui/style.css": ".matrix"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("%s: status %d, lacks %q", path, resp.StatusCode, want)
		}
	}
}

func getState(t *testing.T, url string) uiState {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st uiState
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}
