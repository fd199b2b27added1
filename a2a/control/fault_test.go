package control

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

func TestAbortReachesAll(t *testing.T) {
	for _, tc := range []struct {
		name    string
		service bool
		cause   error
		kind    error // inner kind peers see
	}{
		{"mismatch service", true, fault.New(fault.ErrMismatch, 1, "wrong op"), fault.ErrMismatch},
		{"plain error bare", false, errors.New("app failure"), fault.ErrAborted},
		{"nil cause service", true, nil, fault.ErrAborted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.service {
				e.service()
			}
			mems := e.mustJoin(configs("gab", []int{0, 1, 2, 3}, nil))
			origin := mems[1]
			origin.Abort(tc.cause)
			origin.Abort(errors.New("second cause is ignored"))
			for _, m := range mems {
				waitDone(t, m, 2*time.Second)
				err := m.Err()
				if !errors.Is(err, fault.ErrAborted) || !errors.Is(err, tc.kind) {
					t.Errorf("rank %d: %v", m.Rank(), err)
				}
				if tc.cause != nil && m == origin && !errors.Is(err, tc.cause) {
					t.Errorf("origin: %v does not wrap its cause", err)
				}
				var fe *fault.Error
				if m != origin && (!errors.As(err, &fe) || fe.Rank != 1 || fe.Kind != fault.ErrAborted) {
					t.Errorf("rank %d: %#v, want ErrAborted from rank 1", m.Rank(), err)
				}
			}
		})
	}
}

// TestPeerLost: a member whose connection dies (no Leave) is declared lost by
// every other member within PeerTimeout plus a margin; it also aborts itself.
func TestPeerLost(t *testing.T) {
	const hb, timeout = 50 * time.Millisecond, 400 * time.Millisecond
	for _, tc := range []struct {
		name    string
		service bool
		victim  int // index in the ranks list; in the bare case rank 0 hosts the coordinator
	}{
		{"service", true, 2},
		{"bare, coordinator host dies", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.service {
				e.service()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			mems, errs, conns := e.join(ctx, configs("glost", []int{0, 1, 2}, func(i int, c *JoinConfig) {
				c.HeartbeatInterval, c.PeerTimeout = hb, timeout
			}))
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			victim := mems[tc.victim]
			time.Sleep(3 * hb)
			conns[tc.victim].Close()
			killed := time.Now()
			for _, m := range mems {
				if m == victim {
					continue
				}
				waitDone(t, m, timeout+time.Second)
				// Loss counts from the last heartbeat heard, which may precede
				// the kill by a late tick or two on a loaded machine; half the
				// timeout still tells a real timeout from an early verdict.
				if el := time.Since(killed); el < timeout/2 {
					t.Errorf("rank %d declared loss after %v, well before PeerTimeout", m.Rank(), el)
				}
				err := m.Err()
				if !errors.Is(err, fault.ErrAborted) || !errors.Is(err, fault.ErrPeerLost) {
					t.Errorf("rank %d: %v", m.Rank(), err)
				}
				var fe *fault.Error
				if !errors.As(errors.Unwrap(err), &fe) || fe.Kind != fault.ErrPeerLost || fe.Rank != victim.Rank() {
					t.Errorf("rank %d: %v does not name lost rank %d", m.Rank(), err, victim.Rank())
				}
			}
			waitDone(t, victim, time.Second)
			if err := victim.Err(); !errors.Is(err, fault.ErrAborted) || !errors.Is(err, nats.ErrConnectionClosed) {
				t.Errorf("victim: %v", err)
			}
		})
	}
}

// TestPeerLostAfterScopedAbort: a peer's abort of later operations leaves
// this member's earlier ones running, so it keeps watching its peers: one
// that dies meanwhile fails those earlier operations too (ErrPeerLost naming
// it), instead of leaving them waiting for data that will never come.
func TestPeerLostAfterScopedAbort(t *testing.T) {
	const hb, timeout = 50 * time.Millisecond, 400 * time.Millisecond
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mems, errs, conns := e.join(ctx, configs("gscoped", []int{0, 1, 2}, func(i int, c *JoinConfig) {
		c.HeartbeatInterval, c.PeerTimeout = hb, timeout
	}))
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	mems[0].AbortAt(5, fault.New(fault.ErrInvalidArgument, 0, "bad counts"))
	waitDone(t, mems[1], time.Second)
	if err := mems[1].FailedAt(4); err != nil {
		t.Fatalf("operation 4 failed by an abort from 5: %v", err)
	}
	conns[2].Close()
	deadline := time.Now().Add(timeout + 2*time.Second)
	for mems[1].FailedAt(4) == nil {
		if time.Now().After(deadline) {
			t.Fatal("rank 1: operation 4 still running after its peer 2 died")
		}
		time.Sleep(hb)
	}
	err := mems[1].FailedAt(4)
	var fe *fault.Error
	if !errors.Is(err, fault.ErrPeerLost) || !errors.As(errors.Unwrap(err), &fe) || fe.Rank != 2 {
		t.Errorf("rank 1, operation 4: %v, want ErrPeerLost naming rank 2", err)
	}
}

// TestPeerLostDefaults: with default settings every survivor's Done fires
// within 3s of a member vanishing.
func TestPeerLostDefaults(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mems, errs, conns := e.join(ctx, configs("gdef", []int{0, 1, 2}, nil))
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	conns[1].Close()
	for _, m := range []*Member{mems[0], mems[2]} {
		waitDone(t, m, 3*time.Second)
		if !errors.Is(m.Err(), fault.ErrPeerLost) {
			t.Errorf("rank %d: %v", m.Rank(), m.Err())
		}
	}
}

// TestLeaveIsNotLoss: a rank that leaves is not reported lost; the others keep
// running (and a counts exchange with the departed rank fails fast).
func TestLeaveIsNotLoss(t *testing.T) {
	const hb, timeout = 50 * time.Millisecond, 300 * time.Millisecond
	for _, service := range []bool{true, false} {
		name := "bare"
		if service {
			name = "service"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			if service {
				e.service()
			}
			mems := e.mustJoin(configs("gleave", []int{0, 1, 2}, func(i int, c *JoinConfig) {
				c.HeartbeatInterval, c.PeerTimeout = hb, timeout
			}))
			leaver := mems[2]
			if err := leaver.Leave(); err != nil {
				t.Fatal(err)
			}
			if err := leaver.Leave(); err != nil {
				t.Fatalf("second Leave: %v", err)
			}
			select {
			case <-leaver.Done():
			default:
				t.Fatal("Done not closed after Leave")
			}
			if !errors.Is(leaver.Err(), fault.ErrClosed) {
				t.Errorf("leaver: %v", leaver.Err())
			}
			time.Sleep(2*timeout + 2*hb)
			for _, m := range mems[:2] {
				if m.Err() != nil {
					t.Errorf("rank %d aborted after a graceful leave: %v", m.Rank(), m.Err())
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			// Rank 2 left before this exchange: it fails at once, naming it
			// (not "closed": this member is open).
			err := mems[0].ExchangeCounts(ctx, 1, []int{1, 2, 3}, make([]int, 3), nil)
			var fe *fault.Error
			if !errors.Is(err, fault.ErrPeerLost) || !errors.As(err, &fe) || fe.Rank != 2 {
				t.Errorf("exchange with a departed rank: %v, want ErrPeerLost naming rank 2", err)
			}
		})
	}
}

// TestRestartAfterLoss: a killed rank restarted at once is held by the
// coordinator until the old formation is seen dead, then forms a new epoch
// with the survivors, who rejoin after their abort.
func TestRestartAfterLoss(t *testing.T) {
	const hb, timeout = 50 * time.Millisecond, 300 * time.Millisecond
	short := func(i int, c *JoinConfig) { c.HeartbeatInterval, c.PeerTimeout = hb, timeout }
	e := newEnv(t)
	e.service()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfgs := configs("grestart", []int{0, 1, 2}, short)
	mems, errs, conns := e.join(ctx, cfgs)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	old := mems[0].Epoch()
	conns[2].Close()
	restarted := make(chan *Member, 1)
	go func() {
		m, errs, _ := e.join(ctx, cfgs[2:])
		if errs[0] != nil {
			t.Error(errs[0])
		}
		restarted <- m[0]
	}()
	for _, m := range mems[:2] {
		waitDone(t, m, 2*time.Second)
		if err := m.Leave(); err != nil {
			t.Fatal(err)
		}
	}
	survivors, errs, _ := e.join(ctx, cfgs[:2])
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	r := <-restarted
	if r == nil {
		t.Fatal("restarted rank did not join")
	}
	all := append(survivors, r)
	for i, m := range all {
		if m.Rank() != i || m.Epoch() != all[0].Epoch() || m.Epoch() == old {
			t.Errorf("member %d: rank %d epoch %d (old epoch %d)", i, m.Rank(), m.Epoch(), old)
		}
	}
}

// TestStalled: a heartbeat loop that ran more than half a peer timeout late
// was starved itself, and must not count the wait against its peers.
func TestStalled(t *testing.T) {
	const interval, timeout = 100 * time.Millisecond, time.Second
	for _, tc := range []struct {
		gap  time.Duration
		want bool
	}{
		{interval, false},
		{2 * interval, false},
		{interval + timeout/2, false},
		{interval + timeout/2 + time.Millisecond, true},
		{1247 * time.Millisecond, true}, // the false loss this guards against
	} {
		if got := stalled(tc.gap, interval, timeout); got != tc.want {
			t.Errorf("stalled(%v) = %v, want %v", tc.gap, got, tc.want)
		}
	}
}

// TestJoinControlPlaneLost: the NATS server dies while a rank waits in Join
// for the rest of its group. Whether its connection keeps reconnecting
// (as a2a's does) or closes, Join ends within 3 s with ErrAborted saying the
// control plane is lost, not a timeout at the join deadline or ErrClosed.
func TestJoinControlPlaneLost(t *testing.T) {
	for _, tc := range []struct {
		name       string
		reconnects int
		after      time.Duration // how long Join has run when the server dies
	}{
		{"reconnecting", -1, 300 * time.Millisecond},
		{"reconnecting early", -1, 0}, // electing itself, starting its service
		{"reconnecting soon", -1, 20 * time.Millisecond},
		{"closed", 0, 300 * time.Millisecond},
		{"closed early", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
			if err != nil {
				t.Fatal(err)
			}
			go srv.Start()
			if !srv.ReadyForConnections(5 * time.Second) {
				t.Fatal("nats server not ready")
			}
			defer srv.WaitForShutdown()
			defer srv.Shutdown()
			nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(tc.reconnects), nats.ReconnectWait(50*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			joined := make(chan error, 1)
			go func() {
				m, err := Join(ctx, nc, configs("glostjoin", []int{0}, func(_ int, c *JoinConfig) { c.WorldSize = 2 })[0])
				if m != nil {
					m.Leave()
				}
				joined <- err
			}()
			time.Sleep(tc.after) // then waiting for rank 1
			srv.Shutdown()
			killed := time.Now()
			select {
			case err := <-joined:
				took := time.Since(killed)
				t.Logf("after %v: %v", took, err)
				if !errors.Is(err, fault.ErrAborted) || !strings.Contains(err.Error(), "control plane lost") {
					t.Errorf("Join: %v, want ErrAborted: control plane lost", err)
				}
				if took > 3*time.Second {
					t.Errorf("Join noticed the lost control plane after %v", took)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Join still waiting 10 s after its NATS server died")
			}
		})
	}
}
