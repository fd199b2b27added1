package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The live view's browser tests share these: finding chromium, starting a
// serve whose /ui/ and /metrics they read, keeping a screenshot, and
// scraping /metrics.

// needChromium returns the headless browser's path, failing the test
// without it: the project installs it (scripts/deps.sh).
func needChromium(t *testing.T) string {
	t.Helper()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not found: the live view's test needs a headless browser; scripts/deps.sh (make deps) installs Debian's chromium")
	}
	return chromium
}

// uiServe is an `a2ad serve` with its metrics listener: the NATS address
// ranks join at, its credentials file, and the URLs it announced.
type uiServe struct {
	natsAddr, creds   string
	uiURL, metricsURL string
}

// startUIServe starts `a2ad serve` on a free loopback port with metrics and
// the live view, and stops it (SIGTERM) when the test ends, after the
// test's own deferred calls have stopped its ranks. Its context outlives
// ctx's cancel (a deferred call that runs first) by a grace period, so that
// serve stops by its signal, not by a kill.
func startUIServe(t *testing.T, ctx context.Context) uiServe {
	t.Helper()
	s := uiServe{natsAddr: freeAddr(t), creds: filepath.Join(t.TempDir(), "serve.env")}
	sctx, stop := context.WithoutCancel(ctx), func() {}
	if deadline, ok := ctx.Deadline(); ok {
		sctx, stop = context.WithDeadline(sctx, deadline.Add(10*time.Second))
	}
	serve := a2ad(t, sctx, "serve", "--listen", s.natsAddr, "--metrics", "127.0.0.1:0", "--creds", s.creds)
	so, _ := serve.StdoutPipe()
	if err := serve.Start(); err != nil {
		stop()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		serve.Process.Signal(syscall.SIGTERM)
		serve.Wait()
		stop()
	})
	sc := bufio.NewScanner(so)
	for s.uiURL == "" && sc.Scan() {
		line := sc.Text()
		if u, ok := strings.CutPrefix(line, "a2ad: metrics at "); ok {
			s.metricsURL = u
		}
		if u, ok := strings.CutPrefix(line, "a2ad: live view at "); ok {
			s.uiURL = u
		}
	}
	if s.uiURL == "" || s.metricsURL == "" {
		t.Fatalf("serve did not announce its metrics and live view (metrics %q)", s.metricsURL)
	}
	go io.Copy(io.Discard, so)
	return s
}

// screenshot has chromium draw url at size ("W,H") into name, under
// $A2A_TEST_ARTIFACTS (else the test's temporary directory), and checks
// that a picture came out.
func screenshot(t *testing.T, ctx context.Context, chromium, profile, name, size, url string) string {
	t.Helper()
	dir := os.Getenv("A2A_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, name)
	runChromium(t, ctx, chromium, profile, "--screenshot="+shot, "--window-size="+size, "--hide-scrollbars", url)
	png, err := os.ReadFile(shot)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) || len(png) < 10000 {
		t.Fatalf("screenshot %s: %d bytes, %v", shot, len(png), err)
	}
	return shot
}

// scrape returns the body of a GET of url (serve's /metrics).
func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}
