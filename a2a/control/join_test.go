package control

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

func TestJoin(t *testing.T) {
	tests := []struct {
		name    string
		ranks   []int
		service bool
		hosts   []string // optional Host per config, to check assignment order
		want    []int    // expected final rank per config (nil: any permutation)
	}{
		{name: "explicit world 1 service", ranks: []int{0}, service: true, want: []int{0}},
		{name: "explicit world 1 bare", ranks: []int{0}, want: []int{0}},
		{name: "explicit world 2 service", ranks: []int{1, 0}, service: true, want: []int{1, 0}},
		{name: "explicit world 2 bare", ranks: []int{0, 1}, want: []int{0, 1}},
		{name: "explicit world 5 service", ranks: []int{3, 1, 4, 0, 2}, service: true, want: []int{3, 1, 4, 0, 2}},
		{name: "explicit world 5 bare", ranks: []int{4, 2, 0, 3, 1}, want: []int{4, 2, 0, 3, 1}},
		{name: "assigned world 3 service sorted by host", ranks: []int{-1, -1, -1}, service: true,
			hosts: []string{"hb", "hc", "ha"}, want: []int{1, 2, 0}},
		{name: "assigned world 4 election", ranks: []int{-1, -1, -1, -1}},
		{name: "mixed service", ranks: []int{-1, 1, -1}, service: true, hosts: []string{"z", "m", "a"}, want: []int{2, 1, 0}},
		{name: "mixed bare", ranks: []int{-1, 2, -1, 0}, hosts: []string{"b", "x", "a", "y"}, want: []int{3, 2, 1, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.service {
				e.service()
			}
			cfgs := configs("g1", tc.ranks, func(i int, c *JoinConfig) {
				if tc.hosts != nil {
					c.Info.Host = tc.hosts[i]
				}
			})
			mems := e.mustJoin(cfgs)
			var got []int
			for _, m := range mems {
				got = append(got, m.Rank())
			}
			if tc.want != nil && !slices.Equal(got, tc.want) {
				t.Fatalf("ranks %v, want %v", got, tc.want)
			}
			sorted := slices.Sorted(slices.Values(got))
			for r, v := range sorted {
				if r != v {
					t.Fatalf("ranks %v are not a permutation of 0..%d", got, len(got)-1)
				}
			}
			nodes0 := mems[0].Nodes()
			for i, m := range mems {
				if m.Size() != len(tc.ranks) {
					t.Errorf("member %d size %d", i, m.Size())
				}
				if m.Epoch() == 0 || m.Epoch() != mems[0].Epoch() {
					t.Errorf("member %d epoch %d, member 0 epoch %d", i, m.Epoch(), mems[0].Epoch())
				}
				if !reflect.DeepEqual(m.Nodes(), nodes0) {
					t.Errorf("member %d nodes differ:\n%+v\n%+v", i, m.Nodes(), nodes0)
				}
				n := nodes0[m.Rank()]
				if n.Rank != m.Rank() || n.Host != cfgs[i].Info.Host || n.PID != cfgs[i].Info.PID ||
					!maps.EqualFunc(n.Transports, cfgs[i].Info.Transports, bytes.Equal) || n.Streams != 2 {
					t.Errorf("member %d: node %+v does not describe config %+v", i, n, cfgs[i].Info)
				}
			}
			hosting := 0
			for _, m := range mems {
				if m.svc != nil {
					hosting++
				}
			}
			wantHosting := 1
			if tc.service {
				wantHosting = 0
			}
			if hosting != wantHosting {
				t.Errorf("%d members host a coordinator, want %d", hosting, wantHosting)
			}
			if n := countServices(t, e.conn(), "g1"); n != 1 {
				t.Errorf("%d coordinators answer for the group, want 1", n)
			}
		})
	}
}

// TestElection repeats the all-assigned bare-server join to shake out races:
// every round must end with exactly one coordinator.
func TestElection(t *testing.T) {
	e := newEnv(t)
	for round, world := range []int{2, 5, 3} {
		group := "elect" + string(rune('a'+round))
		mems := e.mustJoin(configs(group, slices.Repeat([]int{-1}, world), nil))
		hosting := 0
		for _, m := range mems {
			if m.svc != nil {
				hosting++
			}
		}
		if hosting != 1 {
			t.Errorf("round %d: %d members host a coordinator", round, hosting)
		}
		if n := countServices(t, e.conn(), group); n != 1 {
			t.Errorf("round %d: %d coordinators answer", round, n)
		}
	}
}

func TestJoinErrors(t *testing.T) {
	tests := []struct {
		name     string
		ranks    []int
		service  bool
		mod      func(i int, c *JoinConfig)
		ctx      time.Duration
		kind     error
		contains string // in every error
	}{
		{name: "duplicate rank service", ranks: []int{0, 1, 1}, service: true, kind: fault.ErrInvalidArgument, contains: "duplicate rank 1"},
		{name: "duplicate rank 0 bare", ranks: []int{0, 0}, kind: fault.ErrInvalidArgument, contains: "duplicate rank 0"},
		{name: "world size disagreement", ranks: []int{0, 1, 2}, service: true, kind: fault.ErrInvalidArgument,
			mod: func(i int, c *JoinConfig) {
				if i == 2 {
					c.WorldSize = 4
				}
			}, contains: "WorldSize disagreement"},
		{name: "streams disagreement bare", ranks: []int{0, -1}, kind: fault.ErrInvalidArgument,
			mod: func(i int, c *JoinConfig) {
				if i == 1 {
					c.Info.Streams = 3
				}
			}, contains: "Streams disagreement"},
		{name: "missing rank service", ranks: []int{0, 2}, service: true, ctx: 700 * time.Millisecond, kind: fault.ErrTimeout,
			mod: func(i int, c *JoinConfig) { c.WorldSize = 3 }, contains: "ranks joined [0 2], 0 awaiting assignment, ranks missing [1]"},
		{name: "missing rank bare", ranks: []int{1}, ctx: 900 * time.Millisecond, kind: fault.ErrTimeout,
			mod: func(i int, c *JoinConfig) { c.WorldSize = 2 }, contains: "ranks joined [1]"},
		{name: "bad group", ranks: []int{0}, kind: fault.ErrInvalidArgument,
			mod: func(i int, c *JoinConfig) { c.Group = "a.b" }, contains: "subject token"},
		{name: "rank beyond world", ranks: []int{0}, kind: fault.ErrInvalidArgument,
			mod: func(i int, c *JoinConfig) { c.Rank = 1 }, contains: "out of range"},
		{name: "world 0", ranks: []int{-1}, kind: fault.ErrInvalidArgument,
			mod: func(i int, c *JoinConfig) { c.WorldSize = 0 }, contains: "WorldSize 0"},
		{name: "timeout not above interval", ranks: []int{0}, kind: fault.ErrInvalidArgument,
			mod: func(i int, c *JoinConfig) { c.HeartbeatInterval, c.PeerTimeout = time.Second, time.Second }, contains: "must exceed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.service {
				e.service()
			}
			d := tc.ctx
			if d == 0 {
				d = 5 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			start := time.Now()
			mems, errs, _ := e.join(ctx, configs("gerr", tc.ranks, tc.mod))
			if el := time.Since(start); el > d+time.Second {
				t.Errorf("join took %v", el)
			}
			if tc.ctx == 0 && time.Since(start) > 3*time.Second {
				t.Errorf("configuration error took %v to report", time.Since(start))
			}
			for i, err := range errs {
				if mems[i] != nil {
					t.Errorf("member %d joined", i)
				}
				var fe *fault.Error
				if !errors.Is(err, tc.kind) || !errors.As(err, &fe) {
					t.Errorf("member %d: %v, want *fault.Error of kind %v", i, err, tc.kind)
					continue
				}
				if k := fault.KindOf(err); k != tc.kind {
					t.Errorf("member %d: kind %v, want %v", i, k, tc.kind)
				}
				if !strings.Contains(err.Error(), tc.contains) {
					t.Errorf("member %d: %q does not mention %q", i, err, tc.contains)
				}
				if tc.kind == fault.ErrTimeout && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("member %d: timeout %v does not wrap ctx.Err()", i, err)
				}
			}
		})
	}
}

// TestJoinMoreMembersThanWorld: a joiner arriving after a healthy formation is
// refused, and the formation is unaffected.
func TestJoinMoreMembersThanWorld(t *testing.T) {
	e := newEnv(t)
	e.service()
	short := func(i int, c *JoinConfig) {
		c.HeartbeatInterval, c.PeerTimeout = 50*time.Millisecond, 300*time.Millisecond
	}
	mems := e.mustJoin(configs("gmore", []int{-1, -1}, short))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, errs, _ := e.join(ctx, configs("gmore", []int{-1, -1}, short)[:1])
	if !errors.Is(errs[0], fault.ErrInvalidArgument) || !strings.Contains(errs[0].Error(), "more members than WorldSize") {
		t.Fatalf("third joiner: %v", errs[0])
	}
	if el := time.Since(start); el < 600*time.Millisecond || el > 2*time.Second {
		t.Errorf("third joiner refused after %v, want about two PeerTimeouts", el)
	}
	for _, m := range mems {
		if m.Err() != nil {
			t.Errorf("rank %d disturbed: %v", m.Rank(), m.Err())
		}
	}
}

// TestReform: a second formation of a group, after everyone left or after an
// abort, gets a new epoch, with a daemon coordinator and with an in-process one.
func TestReform(t *testing.T) {
	for _, tc := range []struct {
		name    string
		service bool
		abort   bool
	}{
		{"service after leave", true, false},
		{"bare after leave", false, false},
		{"service after abort", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.service {
				e.service()
			}
			epochs := map[uint32]bool{}
			for round := 0; round < 3; round++ {
				mems := e.mustJoin(configs("gre", []int{0, -1, 2}, nil))
				ep := mems[0].Epoch()
				if epochs[ep] {
					t.Fatalf("round %d reuses epoch %d", round, ep)
				}
				epochs[ep] = true
				if tc.abort {
					mems[1].Abort(errors.New("boom"))
					for _, m := range mems {
						waitDone(t, m, 2*time.Second)
					}
				}
				for _, m := range mems {
					if err := m.Leave(); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
}

func TestGroupsView(t *testing.T) {
	e := newEnv(t)
	svc := e.service()
	mems := e.mustJoin(configs("gview", []int{1, 0}, nil))
	time.Sleep(50 * time.Millisecond) // first heartbeats
	gv := svc.Groups()
	if len(gv) != 1 {
		t.Fatalf("groups %+v", gv)
	}
	g := gv[0]
	if g.Group != "gview" || g.Epoch != mems[0].Epoch() || g.Size != 2 || g.Forming || len(g.Ranks) != 2 {
		t.Fatalf("view %+v", g)
	}
	for r, rv := range g.Ranks {
		if rv.Rank != r || rv.Host != mems[0].Nodes()[r].Host || rv.Left || rv.Lost ||
			!slices.Equal(rv.Transports, []string{"shm", "tcp"}) || time.Since(rv.LastHeartbeat) > time.Second {
			t.Errorf("rank view %+v", rv)
		}
	}
	for _, m := range mems {
		_ = m.Leave()
	}
	deadline := time.Now().Add(2 * time.Second)
	for len(svc.Groups()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("group still listed after every rank left: %+v", svc.Groups())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSharedConn: members may share one connection, including the one that
// hosts the coordinator.
func TestSharedConn(t *testing.T) {
	e := newEnv(t)
	nc := e.conn()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfgs := configs("gshare", []int{-1, -1, -1}, nil)
	mems := make([]*Member, len(cfgs))
	errs := make(chan error, len(cfgs))
	for i := range cfgs {
		go func() {
			m, err := Join(ctx, nc, cfgs[i])
			mems[i] = m
			errs <- err
		}()
	}
	for range cfgs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range mems {
		defer m.Leave()
	}
	for _, m := range mems {
		go func() {
			send := []int{m.Rank(), 10 + m.Rank(), 20 + m.Rank()}
			recv := make([]int, 3)
			err := m.ExchangeCounts(ctx, 1, send, recv, nil)
			if err == nil && !slices.Equal(recv, []int{10 * m.Rank(), 10*m.Rank() + 1, 10*m.Rank() + 2}) {
				err = fmt.Errorf("rank %d recv %v", m.Rank(), recv)
			}
			errs <- err
		}()
	}
	for range mems {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestCloseFinishesFormedReplies: a coordinator closed while it sends a
// formed roster (its host learned of the formation first, failed and left)
// finishes the replies before Close returns, so every member forms instead
// of waiting for a roster that is gone until its deadline.
func TestCloseFinishesFormedReplies(t *testing.T) {
	e := newEnv(t)
	svcConn := e.conn()
	s, err := NewService(svcConn, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	paused, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.mu.Lock()
	s.beforeReply = func(i int) {
		if i == 1 { // the first member has its roster; the second waits
			once.Do(func() { close(paused) })
			<-release
		}
	}
	s.mu.Unlock()
	type result struct {
		m   *Member
		err error
	}
	results := make(chan result, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, cfg := range configs("closing", []int{0, 1}, nil) {
		nc := e.conn()
		go func() {
			m, err := Join(ctx, nc, cfg)
			results <- result{m, err}
		}()
	}
	select {
	case <-paused:
	case <-time.After(5 * time.Second):
		t.Fatal("the roster was never sent")
	}
	closed := make(chan struct{})
	go func() {
		s.Close()
		svcConn.Close() // as the hosting rank's teardown does right after
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while a formed reply was still to be sent")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-closed
	for range 2 {
		r := <-results
		if r.err != nil {
			t.Fatalf("a member did not form after the coordinator closed: %v", r.err)
		}
		e.mu.Lock()
		e.mems = append(e.mems, r.m)
		e.mu.Unlock()
	}
}
