package tcp

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

var testSecret = []byte("a2a-tcp-test-secret-0123456789ab")

const testEpoch = transporttest.Epoch

func testConfig(t testing.TB, rank, size, streams int) Config {
	return Config{
		Group:   "test-job",
		Rank:    rank,
		Size:    size,
		Streams: streams,
		Secret:  testSecret,
		Logger:  transporttest.Logger(t),
	}
}

// listenAll opens one listener per config and returns their addresses; the
// listeners are closed at cleanup (a no-op once a Transport owns them).
func listenAll(t testing.TB, cfgs []Config) ([]*Listener, []string) {
	t.Helper()
	ls := make([]*Listener, len(cfgs))
	addrs := make([]string, len(cfgs))
	for i, cfg := range cfgs {
		l, err := Listen(cfg)
		if err != nil {
			t.Fatalf("Listen rank %d: %v", cfg.Rank, err)
		}
		t.Cleanup(func() { l.Close() })
		ls[i], addrs[i] = l, l.Addr()
	}
	return ls, addrs
}

// connectAll runs Connect on every listener concurrently, as the ranks of a job
// would after rendezvous.
func connectAll(ctx context.Context, ls []*Listener, addrs []string) ([]*Transport, []error) {
	ts := make([]*Transport, len(ls))
	errs := make([]error, len(ls))
	var wg sync.WaitGroup
	for i, l := range ls {
		wg.Go(func() { ts[i], errs[i] = l.Connect(ctx, testEpoch, addrs) })
	}
	wg.Wait()
	return ts, errs
}

// newCluster starts n connected transports with the given streams per pair,
// closed at cleanup.
func newCluster(t testing.TB, n, streams int) []*Transport {
	t.Helper()
	cfgs := make([]Config, n)
	for r := range n {
		cfgs[r] = testConfig(t, r, n, streams)
	}
	ls, addrs := listenAll(t, cfgs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ts, errs := connectAll(ctx, ls, addrs)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("Connect rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, tr := range ts {
			tr.Close()
		}
	})
	return ts
}

// The progress-loop harness is shared with every transport's tests.
type job = transporttest.Job

var (
	sendJob  = transporttest.SendJob
	recvJob  = transporttest.RecvJob
	pattern  = transporttest.Pattern
	hdr      = transporttest.Hdr
	firstErr = transporttest.FirstErr
)

func drive(tr *Transport, jobs []job, timeout time.Duration) error {
	return transporttest.Drive(tr, jobs, timeout)
}

func driveAll(ts []*Transport, jobs [][]job, timeout time.Duration) []error {
	return transporttest.DriveAll(ts, jobs, timeout)
}
