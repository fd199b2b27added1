package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

// strangerHello opens a connection to addr and runs the dialer side of the
// hello with secret, claiming to be rank dialer on stream.
func strangerHello(addr string, secret []byte, dialer, acceptor, stream uint32) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	h := hello{group: "test-job", epoch: testEpoch, dialer: dialer, acceptor: acceptor, stream: stream}
	_, err = dialHello(c, secret, &h)
	return err
}

// TestStrangersDuringExchange checks that connections arriving after Connect
// are refused and counted without disturbing a running exchange.
func TestStrangersDuringExchange(t *testing.T) {
	const (
		n, S   = 3, 2
		rounds = 12
		size   = 512 << 10
		pause  = 8 // ranks wait here for the strangers, so they hit mid-run
	)
	ts := newCluster(t, n, S)
	started := make(chan struct{})
	strangersDone := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			for round := range rounds {
				if round == pause {
					<-strangersDone
				}
				var jobs []job
				var bufs [][]byte
				for p := range n {
					if p == r {
						continue
					}
					for s := range S {
						jobs = append(jobs, sendJob(ts[r].Conn(p, s), hdr(r, s, round, 1), pattern(uint64(1000*round+100*r+10*p+s), size)))
						buf := make([]byte, size)
						bufs = append(bufs, buf)
						jobs = append(jobs, recvJob(ts[r].Conn(p, s), hdr(p, s, round, 1), buf))
					}
				}
				if err := drive(ts[r], jobs, 10*time.Second); err != nil {
					errs[r] = fmt.Errorf("round %d: %w", round, err)
					return
				}
				i := 0
				for p := range n {
					if p == r {
						continue
					}
					for s := range S {
						if !bytes.Equal(bufs[i], pattern(uint64(1000*round+100*p+10*r+s), size)) {
							errs[r] = fmt.Errorf("round %d: frame from rank %d stream %d corrupted", round, p, s)
							return
						}
						i++
					}
				}
				if r == 0 && round == 0 {
					close(started)
				}
			}
		})
	}
	<-started
	addr := ts[0].l.Addr()
	// (a) garbage: refused at the magic, the connection is closed on us.
	garbage, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer garbage.Close()
	garbage.Write(pattern(42, 64))
	garbage.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := garbage.Read(make([]byte, 1)); err != io.EOF && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Errorf("garbage connection: read %v, want it closed", err)
	}
	// (b) a well-formed hello with the wrong secret.
	if err := strangerHello(addr, []byte("not the secret"), 1, 0, 0); err == nil {
		t.Error("hello with a wrong secret was accepted")
	}
	// (c) a duplicate of an existing (rank, stream), even with the secret.
	if err := strangerHello(addr, testSecret, 2, 0, 1); err == nil {
		t.Error("duplicate hello was accepted")
	}
	if !transporttest.WaitFor(3*time.Second, func() bool { return ts[0].l.Rejected() == 3 }) {
		t.Errorf("Rejected() = %d, want 3", ts[0].l.Rejected())
	}
	close(strangersDone)
	wg.Wait()
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
	if got := ts[0].Stats().Rejected; got != 3 {
		t.Errorf("Stats().Rejected = %d, want 3", got)
	}
	if got := ts[1].Stats().Rejected + ts[2].Stats().Rejected; got != 0 {
		t.Errorf("ranks 1 and 2 refused %d connections, want 0", got)
	}
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

// TestStrangersDuringConnect checks that a silent stranger cannot hold up
// Connect and that an impostor sending a wrong MAC cannot take a slot.
func TestStrangersDuringConnect(t *testing.T) {
	const handshake = 300 * time.Millisecond
	cfgs := []Config{testConfig(t, 0, 2, 1), testConfig(t, 1, 2, 1)}
	cfgs[0].HandshakeTimeout = handshake
	ls, addrs := listenAll(t, cfgs)

	silent, err := net.Dial("tcp", addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	// The impostor claims rank 1's slot, is answered with a nonce, and
	// cannot compute MAC_D.
	impostor := make(chan error, 1)
	go func() {
		c, err := net.Dial("tcp", addrs[0])
		if err != nil {
			impostor <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		h := hello{group: "test-job", epoch: testEpoch, dialer: 1, acceptor: 0, stream: 0}
		if _, err := c.Write(h.marshal()); err != nil {
			impostor <- err
			return
		}
		reply := make([]byte, replySize)
		if _, err := io.ReadFull(c, reply); err != nil {
			impostor <- fmt.Errorf("reading reply: %w", err)
			return
		}
		if reply[0] != statusOK {
			impostor <- fmt.Errorf("status %d before authentication", reply[0])
			return
		}
		c.Write(pattern(3, macSize))
		_, err = io.ReadFull(c, reply[:1])
		impostor <- err
	}()
	// Let the impostor's hello reach rank 0's backlog before rank 1's.
	time.Sleep(20 * time.Millisecond)

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ts, errs := connectAll(ctx, ls, addrs)
	took := time.Since(start)
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
	defer ts[0].Close()
	defer ts[1].Close()
	if took >= handshake {
		t.Errorf("Connect took %v: the silent stranger held it up", took)
	}
	if err := <-impostor; err == nil {
		t.Error("impostor with a wrong MAC got the ack")
	}
	if !transporttest.WaitFor(3*time.Second, func() bool { return ls[0].Rejected() == 2 }) {
		t.Errorf("Rejected() = %d, want 2 (impostor and silent stranger)", ls[0].Rejected())
	}
	// The real rank 1 holds the slot: a frame goes through.
	if err := firstErr(driveAll(ts, [][]job{
		{sendJob(ts[0].Conn(1, 0), hdr(0, 0, 0, 1), []byte("hi"))},
		{recvJob(ts[1].Conn(0, 0), hdr(0, 0, 0, 1), make([]byte, 2))},
	}, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestConnectRefusedHello checks real ranks that disagree on the secret,
// group or epoch: the dialer fails at once with ErrMismatch naming the
// acceptor, the acceptor times out naming the dialer, neither hangs.
func TestConnectRefusedHello(t *testing.T) {
	const deadline = 500 * time.Millisecond
	for _, tc := range []struct {
		name   string
		mutate func(c *Config)
		epoch1 uint32
	}{
		{"secret", func(c *Config) { c.Secret = []byte("another secret") }, testEpoch},
		{"group", func(c *Config) { c.Group = "another-job" }, testEpoch},
		{"epoch", nil, testEpoch + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfgs := []Config{testConfig(t, 0, 2, 2), testConfig(t, 1, 2, 2)}
			if tc.mutate != nil {
				tc.mutate(&cfgs[1])
			}
			ls, addrs := listenAll(t, cfgs)
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			errs := make([]error, 2)
			took := make([]time.Duration, 2)
			var wg sync.WaitGroup
			for r, epoch := range []uint32{testEpoch, tc.epoch1} {
				wg.Go(func() {
					tr, err := ls[r].Connect(ctx, epoch, addrs)
					if tr != nil {
						tr.Close()
					}
					errs[r], took[r] = err, time.Since(start)
				})
			}
			wg.Wait()
			var fe *fault.Error
			if !errors.Is(errs[1], fault.ErrMismatch) || !errors.As(errs[1], &fe) || fe.Rank != 0 {
				t.Errorf("dialer: %v, want ErrMismatch naming rank 0", errs[1])
			}
			if took[1] >= deadline {
				t.Errorf("dialer failed after %v, want at once", took[1])
			}
			if !errors.Is(errs[0], fault.ErrTimeout) || !errors.As(errs[0], &fe) || fe.Rank != 1 {
				t.Errorf("acceptor: %v, want ErrTimeout naming rank 1", errs[0])
			}
			if took[0] > deadline+time.Second {
				t.Errorf("acceptor returned after %v", took[0])
			}
			if ls[0].Rejected() == 0 {
				t.Error("acceptor counted no rejection")
			}
			// A failed Connect closes its listener.
			if c, err := net.DialTimeout("tcp", addrs[0], time.Second); err == nil {
				c.Close()
				t.Error("listener still accepting after a failed Connect")
			}
		})
	}
}

// TestConnectMissingPeer checks Connect when one rank never calls Connect:
// the others fail when ctx ends, naming it.
func TestConnectMissingPeer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		missing int
		cancel  bool // cancel ctx instead of letting its deadline pass
		kind    error
		cause   error
	}{
		{"lower rank silent", 0, false, fault.ErrTimeout, context.DeadlineExceeded},
		{"higher rank silent", 2, false, fault.ErrTimeout, context.DeadlineExceeded},
		{"cancelled", 2, true, fault.ErrAborted, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const wait = 300 * time.Millisecond
			cfgs := []Config{testConfig(t, 0, 3, 2), testConfig(t, 1, 3, 2), testConfig(t, 2, 3, 2)}
			ls, addrs := listenAll(t, cfgs)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			if tc.cancel {
				ctx, cancel = context.WithCancel(context.Background())
				time.AfterFunc(wait, cancel)
			}
			defer cancel()
			start := time.Now()
			errs := make([]error, 3)
			var wg sync.WaitGroup
			for r := range 3 {
				if r == tc.missing {
					continue
				}
				wg.Go(func() {
					tr, err := ls[r].Connect(ctx, testEpoch, addrs)
					if tr != nil {
						tr.Close()
					}
					errs[r] = err
				})
			}
			wg.Wait()
			if took := time.Since(start); took > wait+time.Second {
				t.Errorf("Connect returned after %v", took)
			}
			for r, err := range errs {
				if r == tc.missing {
					continue
				}
				var fe *fault.Error
				if !errors.Is(err, tc.kind) || !errors.Is(err, tc.cause) || !errors.As(err, &fe) || fe.Rank != tc.missing {
					t.Errorf("rank %d: %v, want %v naming rank %d", r, err, tc.kind, tc.missing)
				}
			}
		})
	}
}

// TestConnectRefusedPeer checks that a peer whose address refuses
// connections is declared lost after HandshakeTimeout, long before ctx ends.
func TestConnectRefusedPeer(t *testing.T) {
	cfgs := []Config{testConfig(t, 0, 2, 1), testConfig(t, 1, 2, 1)}
	cfgs[1].HandshakeTimeout = 200 * time.Millisecond
	ls, addrs := listenAll(t, cfgs)
	ls[0].Close() // rank 0 died after publishing its address
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	tr, err := ls[1].Connect(ctx, testEpoch, addrs)
	took := time.Since(start)
	if tr != nil {
		tr.Close()
	}
	var fe *fault.Error
	if !errors.Is(err, fault.ErrPeerLost) || !errors.As(err, &fe) || fe.Rank != 0 {
		t.Fatalf("Connect: %v, want ErrPeerLost naming rank 0", err)
	}
	if took < 200*time.Millisecond || took > 3*time.Second {
		t.Errorf("gave up after %v, want about HandshakeTimeout", took)
	}
}

// TestSizeOneAndWake checks a world of one (no conns at all) and the
// Wait/Wake/Close contract.
func TestSizeOneAndWake(t *testing.T) {
	l, err := Listen(Config{Group: "solo", Size: 1, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := l.Connect(context.Background(), 1, []string{""})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Name() != "tcp" || tr.Streams() != 1 {
		t.Errorf("Name %q Streams %d", tr.Name(), tr.Streams())
	}
	if st := tr.Stats(); len(st.BytesSent) != 1 || len(st.BytesReceived) != 1 {
		t.Errorf("stats %+v", st)
	}
	start := time.Now()
	if err := tr.Wait(1500 * time.Microsecond); err != nil || time.Since(start) < 1500*time.Microsecond {
		t.Errorf("idle Wait(1.5ms): %v after %v, want nil after at least 1.5ms", err, time.Since(start))
	}
	// A sub-millisecond timeout is kept, not rounded up to epoll_wait's
	// whole milliseconds: the fastest of a few idle Wait(100us) is well
	// under 1 ms even on a loaded machine, and none returns early.
	fastest := time.Hour
	for range 50 {
		start := time.Now()
		if err := tr.Wait(100 * time.Microsecond); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		if took < 100*time.Microsecond {
			t.Errorf("idle Wait(100us) returned after %v", took)
		}
		fastest = min(fastest, took)
	}
	if fastest >= 900*time.Microsecond {
		t.Errorf("idle Wait(100us) took at least %v: rounded up to milliseconds", fastest)
	}
	tr.Wake()
	start = time.Now()
	if err := tr.Wait(10 * time.Second); err != nil || time.Since(start) > time.Second {
		t.Errorf("Wait after Wake: %v after %v, want at once", err, time.Since(start))
	}
	transporttest.WakeAndClose(t, tr)
}

// TestInvalidArguments checks that bad configurations and calls are refused
// before any connection is made.
func TestInvalidArguments(t *testing.T) {
	good := Config{Group: "g", Rank: 0, Size: 2, Secret: testSecret}
	for _, tc := range []struct {
		name   string
		mutate func(c *Config)
	}{
		{"size 0", func(c *Config) { c.Size = 0 }},
		{"negative rank", func(c *Config) { c.Rank = -2 }},
		{"rank = size", func(c *Config) { c.Rank = 2 }},
		{"negative streams", func(c *Config) { c.Streams = -1 }},
		{"too many streams", func(c *Config) { c.Streams = maxStreams + 1 }},
		{"no secret", func(c *Config) { c.Secret = nil }},
		{"long group", func(c *Config) { c.Group = string(make([]byte, maxGroupLen+1)) }},
		{"negative handshake timeout", func(c *Config) { c.HandshakeTimeout = -time.Second }},
		{"bad listen address", func(c *Config) { c.ListenAddr = "127.0.0.1:99999" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.mutate(&cfg)
			l, err := Listen(cfg)
			if l != nil {
				l.Close()
			}
			if !errors.Is(err, fault.ErrInvalidArgument) {
				t.Fatalf("Listen: %v, want ErrInvalidArgument", err)
			}
		})
	}
	l, err := Listen(good)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	if _, err := l.Connect(ctx, 1, []string{l.Addr()}); !errors.Is(err, fault.ErrInvalidArgument) {
		t.Errorf("Connect with one address for two ranks: %v", err)
	}
	ts := newCluster(t, 2, 1)
	if _, err := ts[0].l.Connect(ctx, 1, []string{"a", "b"}); !errors.Is(err, fault.ErrInvalidArgument) {
		t.Errorf("second Connect: %v", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Conn to self did not panic")
			}
		}()
		ts[0].Conn(0, 0)
	}()
	op := sendJob(ts[0].Conn(1, 0), hdr(0, 0, 0, 1), []byte("abc"))
	op.Send.Hdr.Len = 4
	if _, err := op.C.TrySend(op.Send); !errors.Is(err, fault.ErrInvalidArgument) {
		t.Errorf("send with a header length differing from the payload: %v", err)
	}
	rj := recvJob(ts[1].Conn(0, 0), hdr(0, 0, 0, 1), make([]byte, 3))
	rj.Recv.Want.Len = 4
	if _, err := rj.C.TryRecv(rj.Recv); !errors.Is(err, fault.ErrInvalidArgument) {
		t.Errorf("receive larger than its buffer: %v", err)
	}
}

// TestConnectSubset links only the pairs with an address, as a Comm does when
// other transports reach the rest: ranks 0 and 2 talk over TCP, rank 1 links
// nobody, and a hello from a rank the acceptor does not link is refused.
func TestConnectSubset(t *testing.T) {
	cfgs := []Config{testConfig(t, 0, 3, 2), testConfig(t, 1, 3, 2), testConfig(t, 2, 3, 2)}
	ls, addrs := listenAll(t, cfgs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ts [3]*Transport
	var errs [3]error
	var wg sync.WaitGroup
	wg.Go(func() { ts[0], errs[0] = ls[0].Connect(ctx, testEpoch, []string{"", "", addrs[2]}) })
	wg.Go(func() { ts[2], errs[2] = ls[2].Connect(ctx, testEpoch, []string{addrs[0], "", ""}) })
	wg.Go(func() { ts[1], errs[1] = ls[1].Connect(ctx, testEpoch, []string{"", "", ""}) })
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		defer ts[r].Close()
	}
	data := pattern(7, 100_000)
	got := make([]byte, len(data))
	jobs := [][]job{{sendJob(ts[0].Conn(2, 1), hdr(0, 1, 0, 1), data)}, {recvJob(ts[2].Conn(0, 1), hdr(0, 1, 0, 1), got)}}
	if err := firstErr(driveAll([]*Transport{ts[0], ts[2]}, jobs, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("payload differs")
	}

	// Rank 1 of a second group believes it is linked with rank 0, which
	// links only rank 2: its hello is refused and it does not hang. Rank 2
	// starts once rank 1 is done: rank 0 linked with it before taking rank
	// 1's hello would close its listener, which fails rank 1 uncounted.
	ls, addrs = listenAll(t, cfgs)
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	wg.Go(func() { ts[0], errs[0] = ls[0].Connect(sctx, testEpoch, []string{"", "", addrs[2]}) })
	ts[1], errs[1] = ls[1].Connect(sctx, testEpoch, []string{addrs[0], "", ""})
	wg.Go(func() { ts[2], errs[2] = ls[2].Connect(sctx, testEpoch, []string{addrs[0], "", ""}) })
	wg.Wait()
	if errs[1] == nil {
		ts[1].Close()
		t.Fatal("a rank rank 0 does not link connected to it")
	}
	for _, r := range []int{0, 2} {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		ts[r].Close()
	}
	if ls[0].Rejected() == 0 {
		t.Error("the refused hello was not counted")
	}
}
