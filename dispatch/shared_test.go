package dispatch

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
)

// TestSharedMemoryChoice: with RowsAuto, exactly the pairs of ranks on one
// host move rows through shared memory (none when a rank forces TCP), the
// others by AllToAllV in the same steps, every rank agrees on every pair, and
// the steps verify whatever the mix, counts mode and output buffer.
func TestSharedMemoryChoice(t *testing.T) {
	cases := []struct {
		name    string
		ranks   int
		hosts   []int // fake host of every rank; nil: all on this host
		tcp     bool
		rows    RowPath
		counts  CountsMode
		outputs outputsAt
	}{
		{name: "one-host", ranks: 3},
		{name: "one-host/alltoallv", ranks: 3, rows: RowsAllToAllV},
		{name: "one-host/tcp-forced", ranks: 3, tcp: true},
		{name: "two-hosts", ranks: 4, hosts: []int{0, 1, 0, 1}},
		{name: "two-hosts/nats/in-recv", ranks: 4, hosts: []int{0, 0, 1, 1}, counts: CountsNATS, outputs: inRecv},
		{name: "uneven-hosts/own-buffer", ranks: 5, hosts: []int{2, 0, 2, 1, 2}, outputs: inOwnBuffer},
		{name: "one-rank-per-host", ranks: 3, hosts: []int{0, 1, 2}},
	}
	url := startNATS(t)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			comms := group(t, url, tc.ranks, func(c *a2a.Config) {
				if tc.hosts != nil {
					c.Host = fmt.Sprintf("host%d", tc.hosts[c.Rank])
				}
				if tc.tcp {
					c.Transport = "tcp"
				}
			})
			c := dispatchCase{ranks: tc.ranks, rows: tc.rows, counts: tc.counts, outputs: tc.outputs,
				l: layer{experts: 7, k: 2, hidden: 24, tokens: 40, dtype: reduce.BFloat16, skew: 1, capacity: 1.2, seed: uint64(200 + i)}}
			pl := c.placement(t)
			ds := newDispatchers(t, comms, Config{Experts: 7, K: 2, Hidden: 24, DType: reduce.BFloat16, CapacityFactor: 1.2,
				Rows: tc.rows, Counts: tc.counts, Hierarchy: HierarchyOff, Logger: discard}) // the flat path's choice (hier_test.go: the relay path)
			// Ranks are numbered by host at join: compare through each Comm's view.
			any := false
			for r, d := range ds {
				for j := range tc.ranks {
					want := j != r && comms[r].Host(j) == comms[r].Host(r) && tc.rows == RowsAuto && !tc.tcp
					any = any || want
					if d.SharedWith(j) != want {
						t.Fatalf("rank %d: SharedWith(%d) = %v, want %v (hosts %d and %d)", r, j, d.SharedWith(j), want, comms[r].Host(r), comms[r].Host(j))
					}
				}
			}
			for r, d := range ds {
				if d.SharedMemory() != any {
					t.Fatalf("rank %d: SharedMemory() = %v, want %v", r, d.SharedMemory(), any)
				}
			}
			mustAll(t, onAll(tc.ranks, func(r int) error {
				for step := range 3 {
					if err := runStep(ds[r], c, pl, r, step); err != nil {
						return fmt.Errorf("step %d: %w", step, err)
					}
				}
				return nil
			}))
		})
	}
}

// TestSharedSegmentsReleased runs steps whose sizes grow (so that segments are
// replaced and peers remap them) and checks that the shared memory is mapped
// while the layer runs and that Close leaves no memfd open or mapped.
func TestSharedSegmentsReleased(t *testing.T) {
	const ranks = 3
	url := startNATS(t)
	comms := group(t, url, ranks, nil)
	if fds, maps := sharedMemory(t); fds+maps != 0 {
		t.Fatalf("%d memfds open and %d mapped before any dispatcher", fds, maps)
	}
	for round, tokens := range []int{8, 300, 2000} {
		c := dispatchCase{ranks: ranks,
			l: layer{experts: 6, k: 2, hidden: 256, tokens: tokens, dtype: reduce.Float32, skew: 1, seed: uint64(300 + round)}}
		pl := c.placement(t)
		ds := make([]*Dispatcher, ranks)
		mustAll(t, onAll(ranks, func(r int) error {
			var err error
			ds[r], err = New(t.Context(), comms[r], Config{Experts: 6, K: 2, Hidden: 256, DType: reduce.Float32, Logger: discard})
			return err
		}))
		mustAll(t, onAll(ranks, func(r int) error {
			// Growing within the dispatcher's life too: step s has more tokens.
			for step := range 3 {
				l := c
				l.l.tokens = tokens * (step + 1)
				if err := runStep(ds[r], l, pl, r, step); err != nil {
					return fmt.Errorf("tokens %d step %d: %w", l.l.tokens, step, err)
				}
			}
			return nil
		}))
		fds, maps := sharedMemory(t)
		if !ds[0].SharedMemory() || fds == 0 || maps == 0 {
			t.Fatalf("round %d: shared outputs %v with %d memfds open and %d mapped, want both in use", round, ds[0].SharedMemory(), fds, maps)
		}
		for _, d := range ds {
			d.Close()
		}
		if fds, maps := sharedMemory(t); fds+maps != 0 {
			t.Fatalf("round %d: %d memfds open and %d mapped after Close", round, fds, maps)
		}
	}
}

// sharedMemory counts this process's open descriptors and mappings of the
// dispatcher's memfds.
func sharedMemory(t *testing.T) (fds, maps int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if link, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.Contains(link, "memfd:a2a-dispatch") {
			fds++
		}
	}
	m, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return fds, strings.Count(string(m), "memfd:a2a-dispatch")
}

// TestSharedPeerAborts: a rank that aborts between dispatch and combine (as
// a crashing one would) makes the others' combine fail with a typed error
// instead of waiting for outputs that never come, and their memory is still
// released.
func TestSharedPeerAborts(t *testing.T) {
	const ranks = 3
	url := startNATS(t)
	comms := group(t, url, ranks, nil)
	c := dispatchCase{ranks: ranks, l: layer{experts: 6, k: 2, hidden: 32, tokens: 50, dtype: reduce.Float32, seed: 9}}
	ds := make([]*Dispatcher, ranks)
	mustAll(t, onAll(ranks, func(r int) error {
		var err error
		ds[r], err = New(t.Context(), comms[r], Config{Experts: 6, K: 2, Hidden: 32, Logger: discard})
		return err
	}))
	if !ds[0].SharedMemory() {
		t.Fatal("shared outputs not in use on one host")
	}
	errs := onAll(ranks, func(r int) error {
		h, err := ds[r].Dispatch(t.Context(), c.l.tokenRows(r, 0), c.l.decision(r, 0))
		if err != nil {
			return err
		}
		defer h.Release()
		if r == 2 {
			return comms[2].Abort(errors.New("rank 2 crashed"))
		}
		runExperts(h, c.l.dtype, c.l.hidden, h.Output())
		return ds[r].Combine(t.Context(), h, h.Output(), make([]byte, h.Tokens()*ds[r].RowBytes()))
	})
	for r := range 2 {
		if !errors.Is(errs[r], a2a.ErrAborted) && !errors.Is(errs[r], a2a.ErrPeerLost) {
			t.Errorf("rank %d: combine with an aborted peer: %v, want ErrAborted or ErrPeerLost", r, errs[r])
		}
	}
	for _, d := range ds {
		d.Close()
	}
	if fds, maps := sharedMemory(t); fds+maps != 0 {
		t.Fatalf("%d memfds open and %d mapped after Close", fds, maps)
	}
}

// trafficRecorder is an Observer that also records shared-memory traffic,
// in all and by peer, and the rows by destination rank.
type trafficRecorder struct {
	mu             sync.Mutex
	sent, received []int64 // one entry per report
	peer           map[int][2]int64
	rankRows       []int
	wire           string
	dtype, wired   int64
}

func (o *trafficRecorder) ObserveSharedPeer(peer int, sent, received int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.peer == nil {
		o.peer = map[int][2]int64{}
	}
	p := o.peer[peer]
	o.peer[peer] = [2]int64{p[0] + sent, p[1] + received}
}

func (o *trafficRecorder) ObserveRows(rankRows []int, wire string, dtypeBytes, wireBytes int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.rankRows, o.wire, o.dtype, o.wired = append([]int(nil), rankRows...), wire, dtypeBytes, wireBytes
}

func (*trafficRecorder) ObserveDispatch(time.Duration, []int, int, float64) {}
func (*trafficRecorder) ObserveCombine(time.Duration)                       {}
func (o *trafficRecorder) ObserveSharedTraffic(sent, received int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sent, o.received = append(o.sent, sent), append(o.received, received)
}

// TestSharedTrafficObserved: a SharedTrafficObserver hears, per dispatch and
// per combine, exactly the bytes that moved through shared memory: the rows
// to and from same-host peers, then their outputs the other way; the rows
// to the other host are the collectives' to report.
func TestSharedTrafficObserved(t *testing.T) {
	const ranks = 4
	url := startNATS(t)
	comms := group(t, url, ranks, func(c *a2a.Config) { c.Host = fmt.Sprintf("host%d", c.Rank/2) })
	l := layer{experts: 8, k: 2, hidden: 16, tokens: 30, dtype: reduce.Float32, skew: 1, seed: 77}
	obs := make([]*trafficRecorder, ranks)
	ds := make([]*Dispatcher, ranks)
	mustAll(t, onAll(ranks, func(r int) error {
		obs[r] = new(trafficRecorder)
		var err error
		ds[r], err = New(t.Context(), comms[r], Config{Experts: 8, K: 2, Hidden: 16, Observer: obs[r], Hierarchy: HierarchyOff, Logger: discard})
		return err
	}))
	t.Cleanup(func() {
		for _, d := range ds {
			d.Close()
		}
	})
	mustAll(t, onAll(ranks, func(r int) error {
		h, err := ds[r].Dispatch(t.Context(), l.tokenRows(r, 0), l.decision(r, 0))
		if err != nil {
			return err
		}
		defer h.Release()
		var wantSent, wantRecv, wantDType int64
		wantPeer := map[int][2]int64{}
		for j := range ranks {
			if ds[r].SharedWith(j) {
				wantSent += int64(h.sendCounts[j])
				wantRecv += int64(h.recvCounts[j])
				// The dispatch's rows one way, their outputs the other.
				both := int64(h.sendCounts[j] + h.recvCounts[j])
				wantPeer[j] = [2]int64{both, both}
			}
			if j != r {
				wantDType += int64(h.plan.RankRows[j] * ds[r].RowBytes())
			}
		}
		if o := obs[r]; !slices.Equal(o.rankRows, h.plan.RankRows) || o.wire != "same" || o.dtype != wantDType || o.wired != wantDType {
			return fmt.Errorf("rows observed %v %s %d/%d, want %v same %d", o.rankRows, o.wire, o.dtype, o.wired, h.plan.RankRows, wantDType)
		}
		if wantSent+wantRecv == 0 {
			return fmt.Errorf("no rows between same-host ranks: the test shows nothing")
		}
		runExperts(h, l.dtype, l.hidden, h.Output())
		if err := ds[r].Combine(t.Context(), h, h.Output(), make([]byte, h.Tokens()*ds[r].RowBytes())); err != nil {
			return err
		}
		o := obs[r]
		if len(o.sent) != 2 || o.sent[0] != wantSent || o.received[0] != wantRecv || o.sent[1] != wantRecv || o.received[1] != wantSent {
			return fmt.Errorf("shared traffic reports sent %v received %v, want dispatch %d/%d then combine %d/%d",
				o.sent, o.received, wantSent, wantRecv, wantRecv, wantSent)
		}
		if !maps.Equal(o.peer, wantPeer) {
			return fmt.Errorf("shared traffic by peer %v, want %v", o.peer, wantPeer)
		}
		return nil
	}))
}
