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
// up to there (and the TLS line after it, when tls; the metrics line before
// it when args turn --metrics on); the serve stops with the
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
	timeout := time.After(15 * time.Second)
	// Up to the credentials line (after the metrics one, when on), and the
	// TLS line after it.
	for n, done := 0, false; !done; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("serve %v exited:\n%s", args, out.String())
			}
			out.WriteString(l + "\n")
			if strings.HasPrefix(l, "a2ad: credentials") {
				n++
			}
			done = n > 0 && (!tls || strings.HasPrefix(l, "a2ad: TLS"))
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

// TestServeTLS starts a2ad serve as it runs beyond loopback, TLS with a CA of
// its own (forced on 127.0.0.1 with --tls): its credentials file holds the CA,
// a client that does not trust it is refused, and `a2ad run --nats URL` with
// no credentials flag finds serve's default file and runs a verified job.
// The next start without TLS takes the CA out of the file again.
func TestServeTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	config := t.TempDir()
	env := []string{"XDG_CONFIG_HOME=" + config, "A2A_SECRET=", "A2A_CREDS="}
	creds := filepath.Join(config, "a2ad", "serve.env")
	addr := freeAddr(t)
	out := startServe(t, env, true, "--listen", addr, "--tls")
	for _, want := range []string{"control plane ready at tls://" + addr, "export A2A_CREDS=" + creds,
		"a2ad run --nats tls://" + addr + ";", "a2ad job new --nats tls://" + addr + " --out job.env",
		"TLS with a CA made for this start, in " + creds} {
		if !strings.Contains(out, want) {
			t.Errorf("serve does not say %q:\n%s", want, out)
		}
	}
	vars, err := credsfile.Read(creds)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode([]byte(vars["A2A_NATS_TLS_CA"]))
	if block == nil {
		t.Fatalf("no CA in the credentials file: %q", vars)
	}
	if ca, err := x509.ParseCertificate(block.Bytes); err != nil || !ca.IsCA {
		t.Fatalf("the file's A2A_NATS_TLS_CA is no CA: %v", err)
	}
	nc, err := nats.Connect("nats://"+addr, nats.UserInfo(vars["A2A_NATS_USER"], vars["A2A_NATS_PASSWORD"]), nats.MaxReconnects(0))
	if err == nil {
		nc.Close()
		t.Fatal("a client that does not trust serve's CA connected")
	}
	run := a2ad(t, ctx, "run", "-n", "2", "--nats", "nats://"+addr, "--", a2adBin, "demo", "--worker", "--steps", "2")
	run.Env = append(os.Environ(), env...)
	if b, err := run.CombinedOutput(); err != nil || !strings.Contains(string(b), "[rank 0] all 2 steps verified on 2 ranks") {
		t.Fatalf("a2ad run --nats with serve's default file: %v\n%s", err, b)
	}

	// Without TLS (another serve, on loopback) the CA leaves the file.
	startServe(t, env, false, "--listen", freeAddr(t))
	if vars, err := credsfile.Read(creds); err != nil || vars["A2A_NATS_TLS_CA"] != "" || vars["A2A_SECRET"] == "" {
		t.Errorf("after a start without TLS: %q %v, want the secret and no CA", vars, err)
	}
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
