package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/internal/natsd"
)

// TestLiveViewWideMoE: a layer of 200 experts on ranks with long host
// names, reported through a real control plane, draws in headless chromium
// at 1400 px with the experts in bands (at most 64 rows) and no card
// scrolling sideways.
func TestLiveViewWideMoE(t *testing.T) {
	chromium := needChromium(t)
	ranks := natsd.NewUser("wide", control.Subjects("wide"))
	cp, err := startControlPlane(slog.New(slog.DiscardHandler), cpConfig{Listen: "127.0.0.1:0", Users: []natsd.User{ranks}})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n, experts = 2, 200
	mems := make([]*control.Member, n)
	errs := make(chan error, n)
	for r := range n {
		nc, err := nats.Connect(cp.URL, append(ranks.Options(), nats.CustomInboxPrefix(control.InboxPrefix("wide")))...)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		go func() {
			var err error
			mems[r], err = control.Join(ctx, nc, control.JoinConfig{Group: "wide", Rank: r, WorldSize: n,
				Info:              control.NodeInfo{Host: fmt.Sprintf("gpu-node-%d.a-rather-long-cluster-domain.example.internal/boot-%032d", r, r)},
				HeartbeatInterval: 100 * time.Millisecond, PeerTimeout: 10 * time.Second})
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range mems {
		defer m.Leave()
	}
	tl := newMoETimeline(cp.svc)
	tokens := make([]uint64, experts)
	for seq := range uint64(3) {
		for e := range tokens {
			tokens[e] += uint64(e) * 10 // expert e runs hotter than e-1
		}
		for r, m := range mems {
			if err := m.Report(&control.Report{Seq: seq + 1, Period: time.Second, Elapsed: time.Duration(seq+1) * time.Second,
				Since: time.Duration(seq) * time.Second, Sent: make([]uint64, n), Wait: make([]time.Duration, n), Last: make([]uint64, n),
				MoE: &control.MoEReport{Dispatches: seq + 1, Tokens: tokens, RankRows: []uint64{seq * 100, seq * uint64(100+r)}}}); err != nil {
				t.Fatal(err)
			}
		}
		// Every rank's report is in before the sample.
		deadline := time.Now().Add(5 * time.Second)
		for {
			tv, ok := cp.svc.Traffic("wide")
			if ok && tv.Ranks[0].MoE != nil && tv.Ranks[1].MoE != nil && tv.Ranks[0].MoE.Dispatches == seq+1 && tv.Ranks[1].MoE.Dispatches == seq+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("report %d never arrived: %+v", seq+1, tv)
			}
			time.Sleep(10 * time.Millisecond)
		}
		tl.sample(time.Now())
	}
	srv := httptest.NewServer(uiHandler(cp.svc, tl))
	defer srv.Close()
	dom := runChromium(t, ctx, chromium, t.TempDir(), "--window-size=1400,1000", "--dump-dom", srv.URL+"/ui/")
	if !strings.Contains(dom, `data-moe="wide"`) {
		t.Fatalf("no MoE panel; status %q", regexp.MustCompile(`<p id="status"[^>]*>[^<]*`).FindString(dom))
	}
	tag := regexp.MustCompile(`<svg [^>]*data-heatmap="tokens"[^>]*>`).FindString(dom)
	if !strings.Contains(tag, `data-rows="50"`) || !strings.Contains(tag, `data-band="4"`) || strings.Contains(tag, `data-lit="0"`) {
		t.Errorf("tokens heatmap %s: want 50 bands of 4 experts, lit", tag)
	}
	shot := screenshot(t, ctx, chromium, t.TempDir(), "a2ad-live-view-wide-moe.png", "1400,1400", srv.URL+"/ui/")
	t.Logf("screenshot of 200 experts: %s", shot)
	if strings.Contains(dom, `data-overflows="true"`) || !strings.Contains(dom, `data-overflows="false"`) {
		t.Errorf("a card scrolls sideways at 1400 px, or none was measured: %s",
			regexp.MustCompile(`<div class="card[^"]*"[^>]*data-overflows="true"[^>]*>.{0,80}`).FindString(dom))
	}
}
