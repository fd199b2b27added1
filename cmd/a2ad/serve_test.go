package main

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/internal/credsfile"
	"github.com/a2a-moe/a2a/internal/natsd"
)

// startServe starts `a2ad serve args...` with env added to this process's
// environment, waits for its credentials line and returns what it printed
// up to there (and the TLS line after it, when tls); the serve stops with the
// test, by SIGTERM, and must exit 0 then.
func startServe(t *testing.T, env []string, tls bool, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	serve := a2ad(t, ctx, append([]string{"serve", "--metrics", ""}, args...)...)
	serve.Env = append(os.Environ(), env...)
	so, err := serve.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	serve.Stderr = serve.Stdout
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer cancel()
		serve.Process.Signal(syscall.SIGTERM)
		if err := serve.Wait(); err != nil {
			t.Errorf("serve exit: %v", err)
		}
	})
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(so)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var out strings.Builder
	want := 2 // ready, credentials
	if tls {
		want++
	}
	timeout := time.After(15 * time.Second)
	for n := 0; n < want; n++ {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("serve %v exited:\n%s", args, out.String())
			}
			out.WriteString(l + "\n")
		case <-timeout:
			t.Fatalf("serve %v not ready after 15s (hung?):\n%s", args, out.String())
		}
	}
	go func() {
		for range lines {
		}
	}()
	return out.String()
}

// TestServeOwnCertificate: a2ad serve with --tls-cert starts (its own
// in-process client once hung on the TLS greeting) and lets in a client that
// trusts the certificate's CA.
func TestServeOwnCertificate(t *testing.T) {
	dir := t.TempDir()
	gen, err := natsd.GenerateTLS([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(gen.Certificate.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"cert.pem": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: gen.Certificate.Certificate[0]}),
		"key.pem":  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		"ca.pem":   gen.CAPEM,
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	creds := filepath.Join(dir, "serve.env")
	addr := freeAddr(t)
	startServe(t, []string{"A2A_SECRET=", "A2A_CREDS="}, false, "--listen", addr, "--creds", creds,
		"--tls-cert", filepath.Join(dir, "cert.pem"), "--tls-key", filepath.Join(dir, "key.pem"))
	vars, err := credsfile.Read(creds)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect("nats://"+addr, nats.UserInfo(vars["A2A_NATS_USER"], vars["A2A_NATS_PASSWORD"]),
		nats.RootCAs(filepath.Join(dir, "ca.pem")), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("a client trusting the CA: %v", err)
	}
	nc.Close()
}
