package shm

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// TestInvalidArguments checks that bad configurations and calls are refused
// before any segment is created.
func TestInvalidArguments(t *testing.T) {
	group := testGroup(t)
	good := Config{Group: group, Rank: 0, Size: 2}
	for _, tc := range []struct {
		name   string
		mutate func(c *Config)
	}{
		{"size 0", func(c *Config) { c.Size = 0 }},
		{"negative rank", func(c *Config) { c.Rank = -1 }},
		{"rank = size", func(c *Config) { c.Rank = 2 }},
		{"negative streams", func(c *Config) { c.Streams = -1 }},
		{"too many streams", func(c *Config) { c.Streams = maxStreams + 1 }},
		{"ring not a power of two", func(c *Config) { c.RingBytes = 5000 }},
		{"ring too small", func(c *Config) { c.RingBytes = 2048 }},
		{"local without this rank", func(c *Config) { c.Local = []int{1} }},
		{"local rank outside world", func(c *Config) { c.Local = []int{0, 2} }},
		{"local rank twice", func(c *Config) { c.Local = []int{0, 1, 1} }},
		{"too many local ranks", func(c *Config) { c.Size = maxLocal + 1; c.Local = nil }},
		{"segment too large", func(c *Config) { c.Streams = maxStreams; c.RingBytes = maxRingBytes }},
		{"missing directory", func(c *Config) { c.Dir = "/nonexistent/a2a-shm-test" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.mutate(&cfg)
			tr, err := Open(context.Background(), cfg)
			if tr != nil {
				tr.Close()
			}
			if !errors.Is(err, fault.ErrInvalidArgument) {
				t.Fatalf("Open: %v, want ErrInvalidArgument", err)
			}
			checkNoFiles(t, DefaultDir, group)
		})
	}
	ts := newCluster(t, 2, 1, ringOnly)
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
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Conn to self did not panic")
			}
		}()
		ts[0].Conn(0, 0)
	}()
}

// TestOpenMissingPeer checks Open when one local rank never opens: the others
// fail when ctx ends, naming it, and leave no file behind.
func TestOpenMissingPeer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		missing int
		cancel  bool // cancel ctx instead of letting its deadline pass
		kind    error
		cause   error
	}{
		{"lower rank missing", 0, false, fault.ErrTimeout, context.DeadlineExceeded},
		{"higher rank missing", 2, false, fault.ErrTimeout, context.DeadlineExceeded},
		{"cancelled", 1, true, fault.ErrAborted, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const wait = 200 * time.Millisecond
			group := testGroup(t)
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
					tr, err := Open(ctx, testConfig(t, group, r, 3, 2, ringOnly))
					if tr != nil {
						tr.Close()
					}
					errs[r] = err
				})
			}
			wg.Wait()
			if took := time.Since(start); took > wait+time.Second {
				t.Errorf("Open returned after %v", took)
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
			checkNoFiles(t, DefaultDir, group)
		})
	}
}

// TestOpenMismatch checks that ranks disagreeing on the configuration fail
// with ErrMismatch instead of sharing rings of different shapes.
func TestOpenMismatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(c *Config)
	}{
		{"streams", func(c *Config) { c.Streams = 2 }},
		{"ring size", func(c *Config) { c.RingBytes = 2 * testRing }},
		{"local ranks", func(c *Config) { c.Size = 3; c.Local = []int{0, 1} }},
		{"LL slot size", func(c *Config) { c.SlotBytes = 2 * DefaultSlotBytes }},
		{"LL slots off", func(c *Config) { c.SlotBytes = -1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			group := testGroup(t)
			cfgs := []Config{testConfig(t, group, 0, 2, 1, ringOnly), testConfig(t, group, 1, 2, 1, ringOnly)}
			tc.mutate(&cfgs[1])
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			ts, errs := openAll(ctx, cfgs)
			for r, err := range errs {
				if ts[r] != nil {
					ts[r].Close()
				}
				var fe *fault.Error
				if !errors.Is(err, fault.ErrMismatch) || !errors.As(err, &fe) || fe.Rank != 1-r {
					t.Errorf("rank %d: %v, want ErrMismatch naming rank %d", r, err, 1-r)
				}
			}
			checkNoFiles(t, DefaultDir, group)
		})
	}
}

// TestOpenTwice checks that a second transport for the same group, epoch and
// rank is refused while the first one lives, and does not disturb it.
func TestOpenTwice(t *testing.T) {
	group := testGroup(t)
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() {
		tr, err := Open(ctx, testConfig(t, group, 0, 2, 1, ringOnly))
		if tr != nil {
			tr.Close()
		}
		first <- err
	}()
	waitPublished(t, DefaultDir, group)
	tr, err := Open(context.Background(), testConfig(t, group, 0, 2, 1, ringOnly))
	if tr != nil {
		tr.Close()
	}
	if !errors.Is(err, fault.ErrInvalidArgument) {
		t.Errorf("second rank 0: %v, want ErrInvalidArgument", err)
	}
	if files := groupFiles(t, DefaultDir, group); len(files) != 1 {
		t.Errorf("the second Open removed the first one's segment: %v", files)
	}
	cancel()
	if err := <-first; !errors.Is(err, fault.ErrAborted) {
		t.Errorf("first rank 0 after cancel: %v", err)
	}
	checkNoFiles(t, DefaultDir, group)
}

// TestOpenPeerGone checks that a rank waiting in Open for a peer that mapped
// its segment and then closed fails with ErrPeerLost, long before ctx ends.
func TestOpenPeerGone(t *testing.T) {
	group := testGroup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Ranks 0 and 1 meet; rank 2 never comes, so both wait; rank 1 gives up
	// early and closes its segment.
	ctx1, cancel1 := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel1()
	var wg sync.WaitGroup
	var err0, err1 error
	start := time.Now()
	wg.Go(func() {
		tr, err := Open(ctx, testConfig(t, group, 0, 3, 1, ringOnly))
		if tr != nil {
			tr.Close()
		}
		err0 = err
	})
	wg.Go(func() {
		tr, err := Open(ctx1, testConfig(t, group, 1, 3, 1, ringOnly))
		if tr != nil {
			tr.Close()
		}
		err1 = err
	})
	wg.Wait()
	if !errors.Is(err1, fault.ErrTimeout) {
		t.Errorf("rank 1: %v, want ErrTimeout", err1)
	}
	var fe *fault.Error
	if !errors.Is(err0, fault.ErrPeerLost) || !errors.As(err0, &fe) || fe.Rank != 1 {
		t.Errorf("rank 0: %v, want ErrPeerLost naming rank 1", err0)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("rank 0 gave up after %v", took)
	}
	checkNoFiles(t, DefaultDir, group)
}

// TestOpenTruncatedPeer: a peer's segment file cut short (by another process
// of the user) is refused with ErrMismatch naming that peer, instead of being
// mapped whole and faulting with SIGBUS on first touch.
func TestOpenTruncatedPeer(t *testing.T) {
	group := testGroup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	first := make(chan error, 1)
	go func() {
		tr, err := Open(ctx, testConfig(t, group, 0, 2, 1, ringOnly))
		if tr != nil {
			tr.Close()
		}
		first <- err
	}()
	seg := waitPublished(t, DefaultDir, group)
	if err := os.Truncate(seg, pageSize); err != nil {
		t.Fatal(err)
	}
	tr, err := Open(ctx, testConfig(t, group, 1, 2, 1, ringOnly))
	if tr != nil {
		tr.Close()
	}
	var fe *fault.Error
	if !errors.Is(err, fault.ErrMismatch) || !errors.As(err, &fe) || fe.Rank != 0 || !strings.Contains(err.Error(), "file size") {
		t.Errorf("rank 1: %v, want ErrMismatch naming rank 0's file size", err)
	}
	cancel()
	if err := <-first; err == nil {
		t.Error("rank 0 opened a group whose peer refused it")
	}
	checkNoFiles(t, DefaultDir, group)
}
