package tcp

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"a2a/a2a/internal/fault"
	"a2a/a2a/transport"
)

var testSecret = []byte("a2a-tcp-test-secret-0123456789ab")

const testEpoch = 3

// testLogger routes transport logs into the test log, so that a failing test
// shows which connections were refused and why.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

func testConfig(t testing.TB, rank, size, streams int) Config {
	return Config{
		Group:   "test-job",
		Rank:    rank,
		Size:    size,
		Streams: streams,
		Secret:  testSecret,
		Logger:  testLogger(t),
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

// job is one op of a progress loop: exactly one of send and recv is set.
type job struct {
	c    transport.Conn
	send *transport.SendOp
	recv *transport.RecvOp
	done bool
}

func sendJob(c transport.Conn, h transport.Header, data []byte) job {
	op := new(transport.SendOp)
	op.Reset(h, data)
	return job{c: c, send: op}
}

func recvJob(c transport.Conn, want transport.Header, dst []byte) job {
	op := new(transport.RecvOp)
	op.Reset(want, dst, false)
	return job{c: c, recv: op}
}

// drive progresses jobs on tr like the engine does: it sweeps every pending op
// and parks in Wait(1ms) after a sweep in which nothing moved. Ops of one conn
// and direction must be listed in wire order.
func drive(tr *Transport, jobs []job, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	left := 0
	for i := range jobs {
		if !jobs[i].done {
			left++
		}
	}
	for left > 0 {
		moved := false
		for i := range jobs {
			j := &jobs[i]
			if j.done {
				continue
			}
			var done bool
			var err error
			if j.send != nil {
				before := j.send.Progress
				done, err = j.c.TrySend(j.send)
				moved = moved || j.send.Progress != before
			} else {
				before := j.recv.Progress
				done, err = j.c.TryRecv(j.recv)
				moved = moved || j.recv.Progress != before
			}
			if err != nil {
				return err
			}
			if done {
				j.done = true
				left--
				moved = true
			}
		}
		if moved {
			continue
		}
		if time.Now().After(deadline) {
			return fault.New(fault.ErrTimeout, -1, "test: %d ops not done after %v", left, timeout)
		}
		if err := tr.Wait(time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// driveAll runs drive on every transport concurrently and returns each
// rank's error.
func driveAll(ts []*Transport, jobs [][]job, timeout time.Duration) []error {
	errs := make([]error, len(ts))
	var wg sync.WaitGroup
	for r := range ts {
		wg.Go(func() { errs[r] = drive(ts[r], jobs[r], timeout) })
	}
	wg.Wait()
	return errs
}

// pattern returns n deterministic pseudo-random bytes for seed.
func pattern(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := rng.Uint64()
		for k := 0; k < 8 && i+k < n; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	return b
}

// hdr is the frame header rank src uses for frame round on stream.
func hdr(src, stream, round int, seq uint64) transport.Header {
	return transport.Header{
		Kind:   transport.OpAllToAllV,
		Algo:   1,
		Flags:  transport.FlagLast,
		Stream: uint16(stream),
		Epoch:  testEpoch,
		Src:    uint32(src),
		Round:  uint32(round),
		Seq:    seq,
	}
}

func firstErr(errs []error) error {
	for r, err := range errs {
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return nil
}
