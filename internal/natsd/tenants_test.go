package natsd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestTenants: accounts added to a running server isolate their users from
// each other and from the global one, a subscriber of ">" in one account
// sees nothing of another's traffic, each account's limits hold, and a
// removed account's users log in no more.
func TestTenants(t *testing.T) {
	admin := NewUser("admin", nil)
	ts, err := StartTenants(Config{Users: []User{admin}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ts.Shutdown(); ts.WaitForShutdown() }()
	connect := func(u User, opts ...nats.Option) (*nats.Conn, error) {
		return nats.Connect(ts.ClientURL(), append(u.Options(), append(opts, nats.MaxReconnects(0))...)...)
	}
	ua, ub := NewUser("a", nil), NewUser("b", nil)
	if err := ts.AddAccount(Account{Name: "job-a", Users: []User{ua}}); err != nil {
		t.Fatal(err)
	}
	a, err := connect(ua) // connected before b's account exists: the reload leaves it alone
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := ts.AddAccount(Account{Name: "job-b", Users: []User{ub}, Limits: Limits{Conns: 2, Subs: 3, Payload: 1024}}); err != nil {
		t.Fatal(err)
	}
	if err := ts.AddAccount(Account{Name: "bad.name"}); err == nil {
		t.Error("an account named bad.name was added")
	}
	spy, err := connect(ub)
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Close()
	seen, err := spy.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.SubscribeSync("a2a.ga.*")
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(a.Flush(), spy.Flush()); err != nil {
		t.Fatal(err)
	}
	for _, nc := range []*nats.Conn{a, spy} {
		if err := nc.Publish("a2a.ga.hb", []byte(nc.Opts.User)); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := got.NextMsg(2 * time.Second); err != nil || string(m.Data) != "a" {
		t.Fatalf("account a's subscriber got %v, %v: want a's own message", m, err)
	}
	if m, err := got.NextMsg(200 * time.Millisecond); err == nil {
		t.Errorf("account a's subscriber got %q from another account", m.Data)
	}
	if m, err := seen.NextMsg(200 * time.Millisecond); err != nil || string(m.Data) != "b" {
		t.Errorf("b's subscriber of > got %v, %v: want its own message only", m, err)
	}
	if m, err := seen.NextMsg(200 * time.Millisecond); err == nil {
		t.Errorf("b's subscriber of > saw %q on %s of another account", m.Data, m.Subject)
	}

	// b's limits: 1 KiB messages, 2 connections, 3 subscriptions each.
	// The server tells the client its account's payload limit, which
	// nats.go then enforces itself; the server would cut it off.
	if err := spy.Publish("x", make([]byte, 2048)); !errors.Is(err, nats.ErrMaxPayload) {
		t.Errorf("a 2 KiB message in an account of 1 KiB: %v", err)
	}
	errs := make(chan error, 8)
	subs, err := connect(ub, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatalf("b's second connection: %v", err)
	}
	defer subs.Close()
	if third, err := connect(ub); err == nil {
		third.Close()
		t.Error("b's third connection was let in, over its limit of 2")
	}
	for i := range 4 {
		if _, err := subs.SubscribeSync("s." + string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
	}
	_ = subs.Flush()
	select {
	case err := <-errs:
		if !strings.Contains(strings.ToLower(err.Error()), "maximum subscriptions") {
			t.Errorf("the 4th subscription of 3: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Error("the 4th subscription of a connection allowed 3 was taken")
	}

	// Removed, b logs in no more; a and the global user stay.
	ts.RemoveAccount("job-b")
	if nc, err := connect(ub); err == nil {
		nc.Close()
		t.Error("a user of a removed account logged in")
	}
	if !a.IsConnected() {
		t.Error("a lost its connection when b's account was removed")
	}
	if nc, err := connect(admin); err != nil {
		t.Errorf("the global user: %v", err)
	} else {
		nc.Close()
	}
	if err := ts.AddAccount(Account{Name: "job-c", Users: []User{ua}}); err == nil {
		t.Error("a's user was added again, to another account")
	}
	if nc, err := connect(User{Name: "a", Password: "wrong"}); err == nil {
		nc.Close()
		t.Error("a wrong password was let in")
	}
}

// TestTenantsAddWhileConnecting: accounts added while clients connect over
// TLS, a handshake wide enough for a reload to catch them before their
// CONNECT, refuse none of them.
func TestTenantsAddWhileConnecting(t *testing.T) {
	gen, err := GenerateTLS([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	admin := NewUser("admin", nil)
	ts, err := StartTenants(Config{Users: []User{admin}, Certificate: &gen.Certificate})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ts.Shutdown(); ts.WaitForShutdown() }()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, gen.CAPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var refused atomic.Int64
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				nc, err := nats.Connect(ts.ClientURL(), append(admin.Options(), nats.RootCAs(ca), nats.MaxReconnects(0))...)
				if err != nil {
					refused.Add(1)
					t.Errorf("connecting while accounts are added: %v", err)
					return
				}
				nc.Close()
			}
		})
	}
	for i := range 50 {
		if err := ts.AddAccount(Account{Name: fmt.Sprintf("job-%d", i), Users: []User{NewUser(fmt.Sprintf("u%d", i), nil)},
			Limits: Limits{Conns: 4}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
}
