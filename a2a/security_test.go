package a2a

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/internal/natsd"
)

// floodRuns repeats TestControlFlood: `make flood` runs it 10 times.
var floodRuns = flag.Int("flood-runs", 1, "how many times TestControlFlood runs its job under attack")

// jobServer is the control plane a2ad run embeds: a server that lets in the
// job's user (limited to its group's subjects) and the service's, and a
// coordinator service that shares the job's secret.
type jobServer struct {
	url    string
	ranks  natsd.User
	svc    *control.Service
	group  string
	secret string
}

func startJobServer(t testing.TB, group, secret string) *jobServer {
	t.Helper()
	ranks := natsd.NewUser(group, control.Subjects(group))
	svcUser := natsd.NewUser("svc", nil)
	srv, err := natsd.StartServer(natsd.Config{Users: []natsd.User{ranks, svcUser}})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.ClientURL(), append(svcUser.Options(), nats.InProcessServer(srv))...)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := control.NewService(nc, []byte(secret), discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close(); nc.Close(); srv.Shutdown(); srv.WaitForShutdown() })
	return &jobServer{url: srv.ClientURL(), ranks: ranks, svc: svc, group: group, secret: secret}
}

// join joins n ranks of the job with its credentials.
func (js *jobServer) join(t testing.TB, n int) []*Comm {
	return group(t, js.url, n, func(c *Config) {
		c.Group, c.Secret = js.group, js.secret
		c.NATSUser, c.NATSPassword = js.ranks.Name, js.ranks.Password
		// The flood costs CPU on a shared 2-core machine: a rank is not
		// lost unless silent for long.
		c.PeerTimeout = 5 * time.Second
	})
}

// TestJoinCredentials: without credentials, with a wrong password, or with
// the credentials of another group, Join fails at once with ErrAuth; with the
// job's it works.
func TestJoinCredentials(t *testing.T) {
	js := startJobServer(t, "authjob", "k")
	other := natsd.NewUser("other", control.Subjects("otherjob"))
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"none", func(*Config) {}},
		{"wrong password", func(c *Config) { c.NATSUser, c.NATSPassword = js.ranks.Name, "guess" }},
		{"password in the URL", func(c *Config) { c.NATSURL = strings.Replace(js.url, "//", "//"+js.ranks.Name+":guess@", 1) }},
		{"token", func(c *Config) { c.NATSToken = "guess" }},
		{"another group's user", func(c *Config) { c.NATSUser, c.NATSPassword = other.Name, other.Password }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{NATSURL: js.url, Group: "authjob", Rank: 0, WorldSize: 2, Secret: "k", Logger: discard}
			tc.mod(&cfg)
			start := time.Now()
			c, err := Join(context.Background(), cfg)
			if err == nil {
				c.Close()
				t.Fatal("joined")
			}
			if !errors.Is(err, ErrAuth) || time.Since(start) > 5*time.Second {
				t.Fatalf("after %v: %v, want ErrAuth at once", time.Since(start), err)
			}
			if strings.Contains(err.Error(), "guess") {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
	comms := js.join(t, 2)
	mustAll(t, onAll(comms, func(c *Comm) error {
		_, err := c.ExchangeCounts(context.Background(), []int{1, 2})
		return err
	}))
	// Conflicting settings are the caller's mistake.
	_, err := Join(context.Background(), Config{NATSURL: js.url, Group: "authjob", WorldSize: 1, NATSToken: "a", NATSUser: "b", NATSPassword: "c"})
	if !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("token and user: %v, want ErrInvalidArgument", err)
	}
}

// joinRefused joins with cfg, fails the test unless Join fails with ErrAuth,
// and returns that error.
func joinRefused(t *testing.T, cfg Config) error {
	t.Helper()
	c, err := Join(context.Background(), cfg)
	if err == nil {
		c.Close()
		t.Fatal("joined")
	}
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("%v, want ErrAuth", err)
	}
	return err
}

// testPKI makes a CA and certificates it signs, PEM files in dir.
type testPKI struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "a2a test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if p.ca, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	p.caKey, p.serial = key, 1
	p.write(t, "ca.pem", "CERTIFICATE", der)
	return p
}

func (p *testPKI) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issue returns the certificate and key files of a leaf for 127.0.0.1.
func (p *testPKI) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &k.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return p.write(t, name+".pem", "CERTIFICATE", der), p.write(t, name+".key", "EC PRIVATE KEY", kder)
}

// TestNATSTLS: a loopback server with a certificate from a CA the test makes,
// requiring client certificates of that CA. Ranks that trust the CA and
// present a certificate join and exchange counts; without the CA, or without
// a client certificate, Join fails with ErrAuth.
func TestNATSTLS(t *testing.T) {
	pki := newPKI(t)
	srvCert, srvKey := pki.issue(t, "server", x509.ExtKeyUsageServerAuth)
	cliCert, cliKey := pki.issue(t, "client", x509.ExtKeyUsageClientAuth)
	user := natsd.NewUser("tls", nil)
	srv, err := natsd.StartServer(natsd.Config{Users: []natsd.User{user}, TLSCert: srvCert, TLSKey: srvKey,
		TLSCA: filepath.Join(pki.dir, "ca.pem")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	url := srv.ClientURL()
	if !strings.HasPrefix(url, "tls://") {
		t.Fatalf("server URL %s", url)
	}
	base := func(c *Config) {
		c.NATSUser, c.NATSPassword = user.Name, user.Password
		c.NATSTLSCA = filepath.Join(pki.dir, "ca.pem")
		c.NATSTLSCert, c.NATSTLSKey = cliCert, cliKey
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"no CA", func(c *Config) { c.NATSTLSCA = "" }},
		{"no client certificate", func(c *Config) { c.NATSTLSCert, c.NATSTLSKey = "", "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{NATSURL: url, Group: "tlsjob", Rank: 0, WorldSize: 2, Logger: discard}
			base(&cfg)
			tc.mod(&cfg)
			joinRefused(t, cfg)
		})
	}
	comms := group(t, url, 2, base)
	mustAll(t, onAll(comms, func(c *Comm) error {
		got, err := c.ExchangeCounts(context.Background(), []int{10 + c.Rank(), 20 + c.Rank()})
		if err == nil && (got[0] != 10+c.Rank()*10 || got[1] != 11+c.Rank()*10) {
			err = fmt.Errorf("counts %v", got)
		}
		return err
	}))
	// Beyond loopback a server refuses to start without TLS.
	if _, err := natsd.StartServer(natsd.Config{Listen: "0.0.0.0:0", Users: []natsd.User{user}}); !errors.Is(err, natsd.ErrInsecure) {
		t.Errorf("0.0.0.0 without TLS: %v, want natsd.ErrInsecure", err)
	}
}

// attacker holds the job's NATS credentials but not its secret. It listens to
// every subject of the group and, for every message it sees, re-publishes
// copies with 1-3 flipped bits, replays old messages (of this formation and of
// earlier ones), answers requests with junk and with replayed replies, and
// publishes aborts: forged ones, and authentic messages moved to the abort
// subject.
type attacker struct {
	nc    *nats.Conn
	group string
	rng   *mrand.Rand
	mu    sync.Mutex
	past  []*nats.Msg // ring of copies of seen messages
	next  int
	sent  atomic.Int64 // since the last budget
	total atomic.Int64
	limit int64
	stop  chan struct{}
	done  chan struct{}
	in    chan *nats.Msg
}

func startAttacker(t *testing.T, js *jobServer, limit int64) *attacker {
	t.Helper()
	// NoEcho: it does not hear (and flood again) its own messages.
	nc, err := nats.Connect(js.url, append(js.ranks.Options(), nats.CustomInboxPrefix(control.InboxPrefix(js.group)),
		nats.NoEcho(), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))...)
	if err != nil {
		t.Fatal(err)
	}
	a := &attacker{nc: nc, group: js.group, rng: mrand.New(mrand.NewPCG(7, 11)), past: make([]*nats.Msg, 0, 512),
		limit: limit, stop: make(chan struct{}), done: make(chan struct{}), in: make(chan *nats.Msg, 4096)}
	for _, subj := range control.Subjects(js.group) {
		if _, err := nc.ChanSubscribe(subj, a.in); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	go a.run()
	return a
}

func (a *attacker) close() { close(a.stop); <-a.done; a.nc.Close() }

// budget lets the attacker send limit more messages.
func (a *attacker) budget() { a.sent.Store(0) }

func (a *attacker) pub(subj, reply string, data []byte) {
	if a.sent.Load() >= a.limit {
		return
	}
	a.sent.Add(1)
	a.total.Add(1)
	if reply != "" {
		_ = a.nc.PublishRequest(subj, reply, data)
	} else {
		_ = a.nc.Publish(subj, data)
	}
}

func (a *attacker) run() {
	defer close(a.done)
	abort := "a2a." + a.group + ".abort"
	for {
		select {
		case <-a.stop:
			return
		case m := <-a.in:
			if len(m.Data) == 0 || m.Header != nil {
				continue // the server's status messages
			}
			cp := &nats.Msg{Subject: m.Subject, Reply: m.Reply, Data: bytes.Clone(m.Data)}
			if len(a.past) < cap(a.past) {
				a.past = append(a.past, cp)
			} else {
				a.past[a.next] = cp
				a.next = (a.next + 1) % len(a.past)
			}
			// Flipped copies of half the messages.
			if a.rng.IntN(2) == 0 {
				f := bytes.Clone(m.Data)
				for range 1 + a.rng.IntN(3) {
					i := a.rng.IntN(len(f) * 8)
					f[i/8] ^= 1 << (i % 8)
				}
				a.pub(m.Subject, m.Reply, f)
			}
			// A replay of an old message, wherever it went.
			old := a.past[a.rng.IntN(len(a.past))]
			a.pub(old.Subject, old.Reply, old.Data)
			// Junk answers to a request: random bytes, a flipped copy of
			// the request, and an old reply to the same inbox.
			if m.Reply != "" {
				junk := make([]byte, 8+a.rng.IntN(120))
				for i := range junk {
					junk[i] = byte(a.rng.Uint32())
				}
				a.pub(m.Reply, "", junk)
				a.pub(m.Reply, "", m.Data)
				for _, o := range a.past {
					if o.Subject == m.Reply && !bytes.Equal(o.Data, m.Data) {
						a.pub(m.Reply, "", o.Data)
						break
					}
				}
			}
			// Forged aborts: an authentic message moved to the abort
			// subject, and one with its sender and sequence changed.
			if a.rng.IntN(4) == 0 {
				a.pub(abort, "", m.Data)
				f := bytes.Clone(m.Data)
				if len(f) > 21 {
					binary.LittleEndian.PutUint64(f[13:], binary.LittleEndian.Uint64(f[13:])+1000)
				}
				a.pub(abort, "", f)
			}
		}
	}
}

// verifiedLoop runs ExchangeCounts + AllToAllV + AllReduce for iters
// iterations on every rank and checks every count and byte.
func verifiedLoop(comms []*Comm, iters int) error {
	n := len(comms)
	errs := onAll(comms, func(c *Comm) error {
		r := c.Rank()
		ctx := context.Background()
		cnt := func(i, src, dst int) int { return (i*7+src*13+dst*29)%97 + 1 }
		send := make([]byte, 0, 97*n)
		recv := make([]byte, 97*n)
		sc, rc := make([]int, n), make([]int, n)
		ar, out := make([]byte, 8*4), make([]byte, 8*4)
		for i := range iters {
			send = send[:0]
			for j := range n {
				sc[j] = cnt(i, r, j)
				for k := range sc[j] {
					send = append(send, pat(r, j, k+i))
				}
			}
			got, err := c.ExchangeCounts(ctx, sc)
			if err != nil {
				return fmt.Errorf("iteration %d: ExchangeCounts: %w", i, err)
			}
			for j := range n {
				if got[j] != cnt(i, j, r) {
					return fmt.Errorf("iteration %d: count from rank %d is %d, want %d", i, j, got[j], cnt(i, j, r))
				}
				rc[j] = got[j]
			}
			if err := c.AllToAllV(ctx, send, sc, recv, rc); err != nil {
				return fmt.Errorf("iteration %d: AllToAllV: %w", i, err)
			}
			off := 0
			for j := range n {
				for k := range rc[j] {
					if recv[off+k] != pat(j, r, k+i) {
						return fmt.Errorf("iteration %d: byte %d from rank %d wrong", i, k, j)
					}
				}
				off += rc[j]
			}
			for k := range 4 {
				binary.LittleEndian.PutUint64(ar[8*k:], uint64(i*1000+r*10+k))
			}
			if err := c.AllReduce(ctx, ar, out, Int64, Sum); err != nil {
				return fmt.Errorf("iteration %d: AllReduce: %w", i, err)
			}
			for k := range 4 {
				want := uint64(n*(i*1000+k) + 10*n*(n-1)/2)
				if got := binary.LittleEndian.Uint64(out[8*k:]); got != want {
					return fmt.Errorf("iteration %d: AllReduce word %d = %d, want %d", i, k, got, want)
				}
			}
		}
		return nil
	})
	return errors.Join(errs...)
}

// TestControlFlood: a client with the job's NATS credentials but not its
// secret floods the group's subjects (flipped copies, replays of this and an
// earlier formation, junk and replayed replies, forged aborts) while 4 ranks
// run a verified loop of ExchangeCounts + AllToAllV + AllReduce, twice (two
// formations of the group). Every count and byte must be right, no rank may
// abort, and the ranks and the coordinator must have counted rejects, which
// package metrics exports as a2a_control_rejected_messages_total.
// -flood-runs repeats it (make flood: 10).
func TestControlFlood(t *testing.T) {
	for run := range *floodRuns {
		start := time.Now()
		js := startJobServer(t, fmt.Sprintf("flood%d", run), "flood-secret")
		a := startAttacker(t, js, 20000)
		var rejects control.Rejects
		for formation := range 2 {
			a.budget()
			comms := js.join(t, 4)
			if err := verifiedLoop(comms, 150); err != nil {
				a.close()
				t.Fatalf("run %d, formation %d: %v", run, formation, err)
			}
			for _, c := range comms {
				r := c.ControlRejects()
				for i := range r {
					rejects[i] += r[i]
				}
			}
			for _, c := range comms {
				c.Close()
			}
		}
		a.close()
		svc := js.svc.Rejects()
		t.Logf("run %d: %v; attacker sent %d; ranks rejected %v (auth, replay, epoch, sender, malformed), the service %v",
			run, time.Since(start).Round(time.Millisecond), a.total.Load(), rejects, svc)
		if rejects.Total() == 0 || svc.Total() == 0 || rejects[control.RejectAuth] == 0 {
			t.Errorf("run %d: rejects: ranks %v, service %v; want some", run, rejects, svc)
		}
	}
}

// TestExternalNATSAccounts runs Debian's nats-server with accounts and
// per-user subject permissions, as a shared cluster would: each job's user
// may use only control.Subjects of its group. A job runs with its user (rank
// 0 hosting the coordinator); a job given another group's user fails Join at
// once with ErrAuth; a user of another account sees none of its traffic.
func TestExternalNATSAccounts(t *testing.T) {
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		t.Fatal("nats-server binary not found: run `make deps` (installs Debian's nats-server)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	perms := func(group string) string {
		q := func(ss []string) string { return `["` + strings.Join(ss, `", "`) + `"]` }
		s := q(control.Subjects(group))
		return fmt.Sprintf("{publish: {allow: %s}, subscribe: {allow: %s}}", s, s)
	}
	conf := fmt.Sprintf(`listen: "127.0.0.1:%d"
accounts: {
  JOBS: { users: [
    {user: ga, password: pa, permissions: %s},
    {user: gb, password: pb, permissions: %s}
  ]}
  OTHER: { users: [ {user: other, password: po} ] }
}
`, port, perms("ga"), perms("gb"))
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	var spy *nats.Conn
	for i := 0; ; i++ {
		if spy, err = nats.Connect(url, nats.UserInfo("other", "po")); err == nil {
			break
		}
		if i > 100 {
			t.Fatalf("nats-server did not start: %v\n%s", err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer spy.Close()
	var seen atomic.Int64
	if _, err := spy.Subscribe(">", func(*nats.Msg) { seen.Add(1) }); err != nil {
		t.Fatal(err)
	}
	spy.Flush()

	cfg := func(user, pass string) func(*Config) {
		return func(c *Config) { c.Group, c.NATSUser, c.NATSPassword = "ga", user, pass }
	}
	start := time.Now()
	_, err = Join(context.Background(), Config{NATSURL: url, Group: "ga", Rank: 0, WorldSize: 2, Logger: discard,
		NATSUser: "gb", NATSPassword: "pb"})
	if !errors.Is(err, ErrAuth) || time.Since(start) > 5*time.Second {
		t.Fatalf("group ga with gb's user: %v after %v, want ErrAuth at once", err, time.Since(start))
	}
	comms := group(t, url, 3, cfg("ga", "pa"))
	if err := verifiedLoop(comms, 20); err != nil {
		t.Fatal(err)
	}
	if n := seen.Load(); n != 0 {
		t.Errorf("a user of another account saw %d messages of the job", n)
	}
}

// TestJoinUnreachable: a control plane that does not answer is ErrTimeout
// naming the URL, at once; a URL that does not parse or names no host is
// ErrInvalidArgument. Neither is reported as the other.
func TestJoinUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "nats://" + l.Addr().String() // nothing listens once closed
	l.Close()
	for _, tc := range []struct {
		url  string
		kind error
		want string
	}{
		{closed, ErrTimeout, "control plane " + closed + " unreachable: no NATS server answered there"},
		{"nats://[::1", ErrInvalidArgument, "does not parse"},
		{"nats://no-such-host.invalid:4222", ErrInvalidArgument, "no such host"},
	} {
		cfg := Config{NATSURL: tc.url, Group: "unreachable", WorldSize: 1, Rank: 0}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		start := time.Now()
		c, err := Join(ctx, cfg)
		cancel()
		if c != nil {
			c.Close()
		}
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %v saying %q", tc.url, err, tc.kind, tc.want)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("%s: Join took %v", tc.url, d)
		}
	}
}
