package a2a

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/a2a/internal/engine"
	"github.com/a2a-moe/a2a/internal/natsd"
)

var discard = slog.New(slog.DiscardHandler)

// startNATS runs an embedded NATS server for one test.
func startNATS(t testing.TB) string {
	t.Helper()
	s, err := natsd.Start("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s.ClientURL()
}

// group joins n in-process ranks (goroutines, each with its own Comm, real
// loopback sockets) and closes them when the test ends.
func group(t testing.TB, url string, n int, mod func(*Config)) []*Comm {
	t.Helper()
	comms, err := joinGroup(url, n, mod)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

// joinGroup is group for any goroutine: the caller closes the Comms.
func joinGroup(url string, n int, mod func(*Config)) ([]*Comm, error) {
	comms := make([]*Comm, n)
	errs := make([]error, n)
	name := fmt.Sprintf("t%d", rand.Uint64())
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := Config{NATSURL: url, Group: name, Rank: r, WorldSize: n, Secret: "s3cret", Logger: discard,
				HeartbeatInterval: 100 * time.Millisecond, PeerTimeout: time.Second}
			if mod != nil {
				mod(&cfg)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			comms[r], errs[r] = Join(ctx, cfg)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			for _, c := range comms {
				if c != nil {
					c.Close()
				}
			}
			return nil, fmt.Errorf("rank %d join: %w", r, err)
		}
	}
	return comms, nil
}

// onAll runs f on every rank concurrently and returns the errors by rank.
func onAll(comms []*Comm, f func(c *Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(c)
		}()
	}
	wg.Wait()
	return errs
}

func mustAll(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func pat(src, dst, k int) byte { return byte(src*131 + dst*31 + k*7 + k>>8) }

// exchange runs one verified AllToAllV of matrix m (row-major n x n) on all ranks.
func exchange(t *testing.T, comms []*Comm, m []int, inBand bool) {
	t.Helper()
	n := len(comms)
	errs := onAll(comms, func(c *Comm) error {
		r := c.Rank()
		sendCounts, recvCounts := make([]int, n), make([]int, n)
		st, rt := 0, 0
		for j := range n {
			sendCounts[j], recvCounts[j] = m[r*n+j], m[j*n+r]
			st += sendCounts[j]
			rt += recvCounts[j]
		}
		send := make([]byte, st)
		off := 0
		for j := range n {
			for k := range sendCounts[j] {
				send[off+k] = pat(r, j, k)
			}
			off += sendCounts[j]
		}
		recv := make([]byte, rt+5) // spare room must stay untouched
		for i := range recv {
			recv[i] = 0xEE
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if inBand {
			learned := make([]int, n)
			if err := c.AllToAllVInBand(ctx, send, sendCounts, recv, learned); err != nil {
				return err
			}
			for i := range learned {
				if learned[i] != recvCounts[i] {
					return fmt.Errorf("in-band counts %v, want %v", learned, recvCounts)
				}
			}
		} else if err := c.AllToAllV(ctx, send, sendCounts, recv, recvCounts); err != nil {
			return err
		}
		off = 0
		for i := range n {
			for k := range recvCounts[i] {
				if recv[off+k] != pat(i, r, k) {
					return fmt.Errorf("byte %d of the block from rank %d: got %d want %d", k, i, recv[off+k], pat(i, r, k))
				}
			}
			off += recvCounts[i]
		}
		for i := rt; i < len(recv); i++ {
			if recv[i] != 0xEE {
				return fmt.Errorf("recv[%d] beyond the received blocks was overwritten", i)
			}
		}
		return nil
	})
	mustAll(t, errs)
}

func matrixOf(kind string, n int, rng *rand.Rand) []int {
	m := make([]int, n*n)
	for i := range m {
		switch kind {
		case "uniform":
			m[i] = 1000
		case "random":
			m[i] = rng.IntN(5000)
		case "zeros":
		case "sparse":
			if rng.IntN(3) == 0 {
				m[i] = rng.IntN(70000)
			}
		}
	}
	switch kind {
	case "giant":
		m[n*n-1-(n-1)] = 3<<20 + 17 // rank n-1 sends rank 0 more than a frame
	case "all-to-one":
		for i := range n {
			m[i*n] = 20000 + i
		}
	}
	return m
}

func TestAllToAllV(t *testing.T) {
	url := startNATS(t)
	cases := []struct {
		n       int
		algo    string
		streams int
	}{
		{1, "", 1}, {2, "pairwise", 1}, {2, "fullmesh", 2}, {3, "", 1}, {4, "fullmesh", 1},
		{4, "pairwise", 2}, {5, "fullmesh", 3}, {7, "", 1}, {4, "skew", 1}, {5, "skew", 2},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("n%d-%s-s%d", tc.n, tc.algo, tc.streams), func(t *testing.T) {
			comms := group(t, url, tc.n, func(c *Config) { c.Algo, c.Streams, c.Window = tc.algo, tc.streams, 2 })
			rng := rand.New(rand.NewPCG(uint64(tc.n), 7))
			for _, kind := range []string{"uniform", "zeros", "random", "sparse", "giant", "all-to-one"} {
				exchange(t, comms, matrixOf(kind, tc.n, rng), false)
			}
			exchange(t, comms, matrixOf("random", tc.n, rng), true)
			exchange(t, comms, matrixOf("zeros", tc.n, rng), true)
		})
	}
}

func TestAssignedRanks(t *testing.T) {
	url := startNATS(t)
	const n = 4
	comms := group(t, url, n, func(c *Config) { c.Rank = -1 })
	seen := map[int]bool{}
	for _, c := range comms {
		seen[c.Rank()] = true
		if c.Size() != n {
			t.Fatalf("size %d", c.Size())
		}
	}
	if len(seen) != n {
		t.Fatalf("ranks %v are not a permutation of 0..%d", seen, n-1)
	}
	// exchange() indexes comms by rank
	byRank := make([]*Comm, n)
	for _, c := range comms {
		byRank[c.Rank()] = c
	}
	exchange(t, byRank, matrixOf("random", n, rand.New(rand.NewPCG(5, 5))), false)
}

// TestStagedAcrossFakeHosts runs the staged two-level algorithm with ranks
// told (A2A_HOST) that they live on different hosts.
func TestStagedAcrossFakeHosts(t *testing.T) {
	url := startNATS(t)
	for _, tc := range []struct {
		n, perHost int
		algo       string
	}{{4, 2, "staged"}, {6, 2, "staged"}, {6, 3, ""}, {5, 2, "staged"}} { // 5 ranks: uneven hosts fall back
		t.Run(fmt.Sprintf("n%d-per%d-%s", tc.n, tc.perHost, tc.algo), func(t *testing.T) {
			comms := group(t, url, tc.n, func(c *Config) {
				c.Algo = tc.algo
				c.Host = fmt.Sprintf("host%d", c.Rank/tc.perHost)
				// Without LL: with it, auto sends these small blocks in one
				// LL round across hosts instead (TestAutoLLAcrossHosts).
				c.LLBytes = -1
				// Fullmesh in two windows, as staged's two phases: with
				// every peer in one window it would win at 6 ranks.
				c.Window = 4
			})
			rng := rand.New(rand.NewPCG(uint64(tc.n), 9))
			for _, kind := range []string{"random", "zeros", "sparse", "all-to-one"} {
				m := matrixOf(kind, tc.n, rng)
				if tc.algo != "" {
					exchange(t, comms, m, false) // staged gathers the matrix itself
				}
				// With the matrix given, auto picks staged for small messages across hosts.
				mustAll(t, onAll(comms, func(c *Comm) error {
					r, n := c.Rank(), tc.n
					st, rt := 0, 0
					for j := range n {
						st += m[r*n+j]
						rt += m[j*n+r]
					}
					send, recv := make([]byte, st), make([]byte, rt)
					off := 0
					for j := range n {
						for k := range m[r*n+j] {
							send[off+k] = pat(r, j, k)
						}
						off += m[r*n+j]
					}
					if err := c.AllToAllVMatrix(context.Background(), send, recv, m); err != nil {
						return err
					}
					off = 0
					for i := range n {
						for k := range m[i*n+r] {
							if recv[off+k] != pat(i, r, k) {
								return fmt.Errorf("byte %d from %d", k, i)
							}
						}
						off += m[i*n+r]
					}
					want := "staged"
					if tc.n%tc.perHost != 0 {
						want = "fullmesh"
					}
					if got := c.LastAlgo(); got != want && kind != "sparse" {
						return fmt.Errorf("ran %s, want %s", got, want)
					}
					return nil
				}))
			}
		})
	}
}

func TestAllToAllAndCounts(t *testing.T) {
	url := startNATS(t)
	const n = 4
	comms := group(t, url, n, nil)
	mustAll(t, onAll(comms, func(c *Comm) error {
		ctx := context.Background()
		block := 333
		send, recv := make([]byte, n*block), make([]byte, n*block)
		for j := range n {
			for k := range block {
				send[j*block+k] = pat(c.Rank(), j, k)
			}
		}
		if err := c.AllToAll(ctx, send, recv); err != nil {
			return err
		}
		for i := range n {
			for k := range block {
				if recv[i*block+k] != pat(i, c.Rank(), k) {
					return fmt.Errorf("alltoall: bad byte from rank %d", i)
				}
			}
		}
		for step := range 5 {
			sc := make([]int, n)
			for j := range sc {
				sc[j] = (c.Rank()+1)*100 + j*10 + step
			}
			rc, err := c.ExchangeCounts(ctx, sc)
			if err != nil {
				return err
			}
			for i := range rc {
				if want := (i+1)*100 + c.Rank()*10 + step; rc[i] != want {
					return fmt.Errorf("step %d recvCounts[%d]=%d want %d", step, i, rc[i], want)
				}
			}
			m := make([]int, n*n)
			if err := c.ExchangeCountsMatrix(ctx, sc, rc, m); err != nil {
				return err
			}
			for i := range n {
				for j := range n {
					if want := (i+1)*100 + j*10 + step; m[i*n+j] != want {
						return fmt.Errorf("matrix[%d][%d]=%d want %d", i, j, m[i*n+j], want)
					}
				}
			}
		}
		return nil
	}))
}

func TestBadArgumentsReleaseEveryone(t *testing.T) {
	url := startNATS(t)
	const n = 3
	cases := []struct {
		name string
		bad  func(sc, rc []int, send, recv []byte) ([]int, []int, []byte, []byte)
		kind error
	}{
		{"negative count", func(sc, rc []int, s, r []byte) ([]int, []int, []byte, []byte) {
			sc[1] = -1
			return sc, rc, s, r
		}, ErrInvalidArgument},
		{"short counts", func(sc, rc []int, s, r []byte) ([]int, []int, []byte, []byte) { return sc[:2], rc, s, r }, ErrInvalidArgument},
		{"short send buffer", func(sc, rc []int, s, r []byte) ([]int, []int, []byte, []byte) { return sc, rc, s[:len(s)-1], r }, ErrInvalidArgument},
		{"short recv buffer", func(sc, rc []int, s, r []byte) ([]int, []int, []byte, []byte) { return sc, rc, s, r[:len(r)-1] }, ErrInvalidArgument},
		{"recv counts disagree with sender", func(sc, rc []int, s, r []byte) ([]int, []int, []byte, []byte) {
			rc[0]--
			return sc, rc, s, r
		}, ErrMismatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			comms := group(t, url, n, nil)
			start := time.Now()
			errs := onAll(comms, func(c *Comm) error {
				sc, rc := []int{10, 20, 30}, []int{10, 20, 30}
				for j := range n {
					sc[j], rc[j] = 10*(j+1)+c.Rank(), 10*(c.Rank()+1)+j
				}
				send, recv := make([]byte, 200), make([]byte, 200)
				send, recv = send[:sum(sc)], recv[:sum(rc)]
				if c.Rank() == 1 {
					sc, rc, send, recv = tc.bad(sc, rc, send, recv)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				return c.AllToAllV(ctx, send, sc, recv, rc)
			})
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("ranks released after %v", d)
			}
			if !errors.Is(errs[1], tc.kind) {
				t.Errorf("rank 1: got %v, want %v", errs[1], tc.kind)
			}
			// A rank whose part of the exchange did not depend on rank 1 may
			// finish; every other rank is released with ErrAborted.
			for _, r := range []int{0, 2} {
				if errs[r] != nil && !errors.Is(errs[r], ErrAborted) {
					t.Errorf("rank %d: got %v, want nil or ErrAborted", r, errs[r])
				}
			}
			// Either way the group is aborted: the next call fails everywhere.
			for r, c := range comms {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := c.AllToAll(ctx, make([]byte, n), make([]byte, n))
				cancel()
				if !errors.Is(err, ErrAborted) && !errors.Is(err, tc.kind) {
					t.Errorf("rank %d call after abort: %v", r, err)
				}
			}
		})
	}
}

func sum(v []int) int {
	s := 0
	for _, x := range v {
		s += x
	}
	return s
}

func TestMismatchedCollectives(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 2, nil)
	errs := onAll(comms, func(c *Comm) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		buf, out := make([]byte, 8), make([]byte, 8)
		counts := []int{4, 4}
		if c.Rank() == 0 { // different order on the two ranks
			if err := c.AllToAll(ctx, buf, out); err != nil {
				return err
			}
			return c.AllToAllV(ctx, buf, counts, out, counts)
		}
		if err := c.AllToAllV(ctx, buf, counts, out, counts); err != nil {
			return err
		}
		return c.AllToAll(ctx, buf, out)
	})
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) {
			t.Errorf("rank %d: %v, want ErrMismatch", r, err)
		}
	}
}

func TestDeadlineAndCancel(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 2, nil)
	buf := make([]byte, 2)
	counts := []int{1, 1}
	// Rank 1 never calls: rank 0's deadline fires.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := comms[0].AllToAllV(ctx, buf, counts, make([]byte, 2), counts)
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("deadline honoured after %v", d)
	}
	// The abort reaches rank 1 even though it never joined the operation.
	select {
	case <-comms[1].member.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("rank 1 not told about the abort")
	}
	if err := comms[1].AllToAllV(context.Background(), buf, counts, make([]byte, 2), counts); !errors.Is(err, ErrAborted) || !errors.Is(err, ErrTimeout) {
		t.Errorf("rank 1 after abort: %v", err)
	}

	// Cancellation of a waiting call.
	comms = group(t, url, 2, nil)
	cctx, ccancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, ccancel)
	err = comms[0].AllToAllV(cctx, buf, counts, make([]byte, 2), counts)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancel: %v", err)
	}
	// A Config.Timeout applies when ctx has no deadline.
	comms = group(t, url, 2, func(c *Config) { c.Timeout = 300 * time.Millisecond })
	if err := comms[0].AllToAllV(context.Background(), buf, counts, make([]byte, 2), counts); !errors.Is(err, ErrTimeout) {
		t.Errorf("config timeout: %v", err)
	}
}

func TestPeerClosedMidOperation(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 3, nil)
	const big = 8 << 20
	errs := onAll(comms, func(c *Comm) error {
		if c.Rank() == 2 {
			time.Sleep(50 * time.Millisecond)
			c.tr.Close() // the data plane dies under the others
			return nil
		}
		counts := []int{big, big, big}
		send, recv := make([]byte, 3*big), make([]byte, 3*big)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for {
			if err := c.AllToAllV(ctx, send, counts, recv, counts); err != nil {
				return err
			}
		}
	})
	for r := range 2 {
		if !errors.Is(errs[r], ErrPeerLost) {
			t.Errorf("rank %d: %v, want ErrPeerLost", r, errs[r])
		}
	}
}

func TestStrangersOnTheDataPort(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 3, func(c *Config) { c.Transport = "tcp" })
	addr := string(comms[0].member.Nodes()[0].Transports["tcp"])
	done := make(chan struct{})
	go func() {
		defer close(done)
		// garbage, then something hello-sized with random bytes
		for _, payload := range [][]byte{[]byte("GET / HTTP/1.0\r\n\r\n"), make([]byte, 200)} {
			conn, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			conn.Write(payload)
			conn.SetReadDeadline(time.Now().Add(3 * time.Second))
			b := make([]byte, 256)
			for {
				if _, err := conn.Read(b); err != nil {
					break // dropped by the rank
				}
			}
			conn.Close()
		}
	}()
	rng := rand.New(rand.NewPCG(3, 3))
	for range 30 {
		exchange(t, comms, matrixOf("random", 3, rng), false)
	}
	<-done
	deadline := time.Now().Add(5 * time.Second)
	for comms[0].Stats().Rejected < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := comms[0].Stats().Rejected; got < 2 {
		t.Errorf("rejected %d strangers, want 2", got)
	}
	exchange(t, comms, matrixOf("uniform", 3, rng), false)
}

func TestJoinErrors(t *testing.T) {
	url := startNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	// A group that can never complete.
	_, err := Join(ctx, Config{NATSURL: url, Group: "lonely", Rank: 0, WorldSize: 2, Logger: discard})
	if !errors.Is(err, ErrTimeout) {
		t.Errorf("incomplete group: %v", err)
	}
	for _, cfg := range []Config{
		{NATSURL: url, WorldSize: 0},
		{NATSURL: url, WorldSize: 2, Rank: 2},
		{NATSURL: url, WorldSize: 2, Algo: "bogus"},
		{NATSURL: url, WorldSize: 2, Streams: -1},
	} {
		if _, err := Join(context.Background(), cfg); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%v: %v, want ErrInvalidArgument", cfg, err)
		}
	}
	// Wrong secret on one rank: the data plane refuses it, nobody hangs.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			c, err := Join(ctx, Config{NATSURL: url, Group: "secrets", Rank: r, WorldSize: 2, Secret: "s" + strconv.Itoa(r), Logger: discard})
			if err == nil {
				c.Close()
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil {
			t.Errorf("rank %d joined despite a wrong secret", r)
		}
	}
}

// TestExternalNATSServer runs a group on Debian's standalone nats-server
// (installed by `make deps`), with no a2ad: rank 0 hosts the coordinator.
func TestExternalNATSServer(t *testing.T) {
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
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	for i := 0; ; i++ {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
			break
		}
		if i > 100 {
			t.Fatal("nats-server did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	comms := group(t, url, 4, nil)
	rng := rand.New(rand.NewPCG(1, 2))
	exchange(t, comms, matrixOf("random", 4, rng), false)
	mustAll(t, onAll(comms, func(c *Comm) error {
		_, err := c.ExchangeCounts(context.Background(), []int{1, 2, 3, 4})
		return err
	}))
}

// testBed is hosts network namespaces of perHost ranks each, bound to a
// core each by local rank, all on the machine with kernel id machine ("":
// unknown, each host its own machine).
func testBed(hosts, perHost int, machine string) []control.NodeInfo {
	var nodes []control.NodeInfo
	for h := range hosts {
		for l := range perHost {
			nodes = append(nodes, control.NodeInfo{Host: "h" + strconv.Itoa(h), Machine: machine, PID: 100 + len(nodes), CPUs: strconv.Itoa(l)})
		}
	}
	return nodes
}

func TestWaitPolicy(t *testing.T) {
	node := func(host string, pid int, cpus string) control.NodeInfo {
		return control.NodeInfo{Host: host, PID: pid, CPUs: cpus}
	}
	// n ranks on host "a", each its own process with affinity cpus(r), and
	// one rank on host "b" (8 CPUs, never counted).
	group := func(n int, cpus func(r int) string) []control.NodeInfo {
		nodes := []control.NodeInfo{node("b", 1, "0-7")}
		for r := range n {
			nodes = append(nodes, node("a", 10+r, cpus(r)))
		}
		return nodes
	}
	unbound := func(int) string { return "0-1" }
	bound := func(r int) string { return strconv.Itoa(r % 2) }
	for _, c := range []struct {
		name        string
		spin        time.Duration
		nodes       []control.NodeInfo
		hostCPUs    int
		wantSpin    time.Duration
		wantShared  bool
		wantCrowded bool
	}{
		{"2 unbound ranks, 2 CPUs", 0, group(2, unbound), 2, engine.DefaultSpin, false, false},
		{"2 ranks bound to a core each", 0, group(2, bound), 2, engine.DefaultSpin, false, false},
		{"4 unbound ranks, 2 CPUs", 0, group(4, unbound), 2, 0, false, true},
		{"4 ranks bound two per core", 0, group(4, bound), 2, 0, false, true},
		{"2 ranks confined to one core", 0, group(2, func(int) string { return "1" }), 2, 0, false, true},
		{"2 ranks, host of 64, job given 2", 0, group(2, unbound), 64, engine.DefaultSpin, false, false},
		{"3 ranks, job given 2 of 64", 0, group(3, unbound), 64, 0, false, true},
		{"affinity unknown: the host's CPUs", 0, group(2, func(int) string { return "" }), 2, engine.DefaultSpin, false, false},
		{"affinity unknown, crowded host", 0, group(3, func(int) string { return "" }), 2, 0, false, true},
		{"spin forced", 7 * time.Microsecond, group(4, unbound), 2, 7 * time.Microsecond, false, true},
		{"spin off", -1, group(1, unbound), 2, 0, false, false},
		{"goroutine ranks", 0, []control.NodeInfo{node("a", 5, "0-3"), node("a", 5, "0-3")}, 4, engine.DefaultSpin, true, false},
		{"4 namespaces x 2 ranks on one 2-CPU machine", 0, testBed(4, 2, "k"), 2, 0, false, true},
		{"4 hosts x 2 ranks, each its own machine", 0, testBed(4, 2, ""), 2, engine.DefaultSpin, false, false},
	} {
		machines, cores := machineCores(c.nodes)
		w := waitPolicy(c.spin, 0, c.nodes, machines, cores, len(c.nodes)-1, c.hostCPUs)
		if w.Spin != c.wantSpin || w.Yield != engine.DefaultYield || w.SharedProcess != c.wantShared || w.Crowded != c.wantCrowded {
			t.Errorf("%s: %+v, want spin %v yield %v sharedProcess %v crowded %v", c.name, w, c.wantSpin, engine.DefaultYield, c.wantShared, c.wantCrowded)
		}
	}
}

// TestAutoLLAcrossHosts: under auto, blocks within the LL cutoff to ranks
// of other hosts (TCP, no slot) go in the first round as one frame each,
// larger ones by frames alone, and every byte lands, with counts known, in
// band, and with the matrix. The cutoff is twice the shm slot here, so that
// blocks between the two go by LL across hosts and by frames on one.
func TestAutoLLAcrossHosts(t *testing.T) {
	url := startNATS(t)
	const n, perHost = 6, 3
	slot := ClassCapabilities("shm").SlotBytes
	comms := group(t, url, n, func(c *Config) {
		c.Host = fmt.Sprintf("host%d", c.Rank/perHost)
		c.LLBytes = 2 * slot
	})
	for _, tc := range []struct {
		name   string
		block  int
		wantLL bool // every block went by LL: the op reports ll
	}{
		{"8 B", 8, true},
		{"600 B", 600, true},
		{"the shm slot", slot, false}, // blocks of slot+1 and slot+2 too
		{"beyond the slot: local pairs by frames", slot + 100, false},
		{"beyond the cutoff: all by frames", 2*slot + 100, false},
	} {
		m := make([]int, n*n)
		for i := range m {
			m[i] = tc.block + i%3
		}
		exchange(t, comms, m, false)
		for _, c := range comms {
			if got := c.LastAlgo(); (got == "ll") != tc.wantLL {
				t.Errorf("%s: rank %d ran %s, want ll: %v", tc.name, c.Rank(), got, tc.wantLL)
			}
		}
		exchange(t, comms, m, true)
	}
}

// TestExchangeCountsMatrixLength: a matrix of the wrong length is
// ErrInvalidArgument on the rank that passed it and fails the same call on
// the others (they do not wait out their deadline), while a nonblocking
// collective every rank started before it completes.
func TestExchangeCountsMatrixLength(t *testing.T) {
	comms := group(t, startNATS(t), 2, func(cfg *Config) { cfg.Timeout = 20 * time.Second })
	ctx := context.Background()
	start := time.Now()
	errs := onAll(comms, func(c *Comm) error {
		in, out := []byte{byte(c.Rank()), 0, 0, 0}, make([]byte, 8)
		req := c.IAllGather(ctx, in, out)
		matrix := make([]int, 4)
		if c.Rank() == 0 {
			matrix = matrix[:3]
		}
		err := c.ExchangeCountsMatrix(ctx, []int{1, 1}, make([]int, 2), matrix)
		if _, werr := req.Wait(ctx); werr != nil {
			return fmt.Errorf("the AllGather begun before: %w", werr)
		}
		if out[0] != 0 || out[4] != 1 {
			return fmt.Errorf("AllGather gave %v", out)
		}
		return err
	})
	if !errors.Is(errs[0], ErrInvalidArgument) || !strings.Contains(errs[0].Error(), "len(matrix)=3, want 4") {
		t.Errorf("rank 0: %v, want ErrInvalidArgument naming the matrix length", errs[0])
	}
	if !errors.Is(errs[1], ErrAborted) || !errors.Is(errs[1], ErrInvalidArgument) {
		t.Errorf("rank 1: %v, want ErrAborted by rank 0's invalid argument", errs[1])
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v, want the peer released at once", d)
	}
}
