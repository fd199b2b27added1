package control

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"
)

// env is one test's NATS world: an embedded server, the connections made on
// it and the members joined through it, all torn down at cleanup.
type env struct {
	t   testing.TB
	srv *server.Server

	mu    sync.Mutex
	conns []*nats.Conn
	mems  []*Member
	svcs  []*Service
}

func newEnv(t testing.TB) *env {
	t.Helper()
	checkGoroutines(t)
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(5 * time.Second) {
		t.Fatal("nats server not ready")
	}
	e := &env{t: t, srv: srv}
	t.Cleanup(e.close)
	return e
}

func (e *env) close() {
	e.mu.Lock()
	mems, svcs, conns := e.mems, e.svcs, e.conns
	e.mu.Unlock()
	for _, m := range mems {
		_ = m.Leave()
	}
	for _, s := range svcs {
		_ = s.Close()
	}
	for _, nc := range conns {
		nc.Close()
	}
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

func (e *env) conn() *nats.Conn {
	e.t.Helper()
	nc, err := nats.Connect(e.srv.ClientURL(), nats.MaxReconnects(0))
	if err != nil {
		e.t.Fatal(err)
	}
	e.mu.Lock()
	e.conns = append(e.conns, nc)
	e.mu.Unlock()
	return nc
}

// service starts a daemon-style coordinator on its own connection.
func (e *env) service() *Service {
	e.t.Helper()
	s, err := NewService(e.conn(), nil, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	e.mu.Lock()
	e.svcs = append(e.svcs, s)
	e.mu.Unlock()
	return s
}

// join joins every config concurrently, each on its own connection.
func (e *env) join(ctx context.Context, cfgs []JoinConfig) ([]*Member, []error, []*nats.Conn) {
	e.t.Helper()
	mems := make([]*Member, len(cfgs))
	errs := make([]error, len(cfgs))
	conns := make([]*nats.Conn, len(cfgs))
	for i := range cfgs {
		conns[i] = e.conn()
	}
	var wg sync.WaitGroup
	for i := range cfgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mems[i], errs[i] = Join(ctx, conns[i], cfgs[i])
		}()
	}
	wg.Wait()
	e.mu.Lock()
	for _, m := range mems {
		if m != nil {
			e.mems = append(e.mems, m)
		}
	}
	e.mu.Unlock()
	return mems, errs, conns
}

// mustJoin joins and fails the test on any error.
func (e *env) mustJoin(cfgs []JoinConfig) []*Member {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mems, errs, _ := e.join(ctx, cfgs)
	for i, err := range errs {
		if err != nil {
			e.t.Fatalf("join %d: %v", i, err)
		}
	}
	return mems
}

// configs builds WorldSize configs for the given requested ranks.
func configs(group string, ranks []int, mod func(i int, c *JoinConfig)) []JoinConfig {
	cfgs := make([]JoinConfig, len(ranks))
	for i, r := range ranks {
		cfgs[i] = JoinConfig{Group: group, Rank: r, WorldSize: len(ranks), Info: NodeInfo{
			Host: fmt.Sprintf("host%d", i), PID: 1000 + i, Streams: 2,
			Transports: map[string][]byte{"tcp": fmt.Appendf(nil, "127.0.0.1:%d", 20000+i), "shm": {byte(i)}},
		}}
		if mod != nil {
			mod(i, &cfgs[i])
		}
	}
	return cfgs
}

// countServices counts the coordinators that answer a ping for group.
func countServices(t testing.TB, nc *nats.Conn, group string) int {
	t.Helper()
	inbox := nc.NewInbox()
	ch := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	b, _ := msgpack.Marshal(&pingMsg{ID: "probe"})
	if err := newSigner(rand.Uint64(), nil).publish(nc, svcSubject(group, opPing), inbox, group, 0, sealed(b)); err != nil {
		t.Fatal(err)
	}
	macs := newMacSet(nil)
	ids := map[string]bool{}
	deadline := time.After(200 * time.Millisecond)
	for {
		select {
		case m := <-ch:
			if len(m.Data) == 0 { // no-responders status message
				continue
			}
			var p pingMsg
			if _, data, ok := macs.get(group).open(m.Subject, group, m.Data); ok && msgpack.Unmarshal(data, &p) == nil && p.ID != "" {
				ids[p.ID] = true
			}
		case <-deadline:
			return len(ids)
		}
	}
}

// waitDone waits for a member's Done with a bound, returning how long it took.
func waitDone(t testing.TB, m *Member, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-m.Done():
		return time.Since(start)
	case <-time.After(within):
		t.Fatalf("rank %d: Done did not fire within %v", m.Rank(), within)
		return 0
	}
}

// checkGoroutines fails the test if goroutines started during it are still
// running after its cleanups (registered first, so it runs last).
func checkGoroutines(t testing.TB) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(3 * time.Second)
		for {
			n := runtime.NumGoroutine()
			if n <= before {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("goroutine leak: %d before, %d after\n%s", before, n, firstStacks(string(buf), 12))
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

func firstStacks(s string, n int) string {
	parts := strings.Split(s, "\n\n")
	if len(parts) > n {
		parts = parts[:n]
	}
	return strings.Join(parts, "\n\n")
}
