// Package a2atest runs groups of in-process ranks for tests, as httptest runs
// servers: an embedded NATS server and n goroutine ranks, each with its own
// Comm and real loopback sockets, all torn down when the test ends.
//
// NewServer is the form for code without a testing.TB, such as the package
// examples: it starts the NATS server that, in a real job, `a2ad serve`
// would run and A2A_NATS_URL would name.
package a2atest

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/internal/natsd"
	"github.com/nats-io/nats-server/v2/server"
)

// Server is a NATS server running in this process on a free loopback port,
// as httptest.Server is an HTTP server.
type Server struct {
	URL string // client URL, for a2a.Config.NATSURL
	srv *server.Server
}

// NewServer starts a Server. It panics if the server cannot start, as
// httptest.NewServer does, so that examples stay short; tests use StartNATS.
func NewServer() *Server {
	s, err := natsd.Start("")
	if err != nil {
		panic(fmt.Sprintf("a2atest: %v", err))
	}
	return &Server{URL: s.ClientURL(), srv: s}
}

// Close shuts the server down and waits until it has. Close the ranks'
// Comms first.
func (s *Server) Close() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}

// StartNATS runs an embedded NATS server for the test and returns its URL.
func StartNATS(t testing.TB) string {
	t.Helper()
	s, err := natsd.Start("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s.ClientURL()
}

// Group joins n ranks of a fresh group through the NATS server at url and
// returns their Comms by rank. The defaults suit tests (fast heartbeats, a 2 s
// peer timeout, 20 s operations); mod, when not nil, adjusts each rank's
// Config (its Rank is already set) before it joins.
func Group(t testing.TB, url string, n int, mod func(*a2a.Config)) []*a2a.Comm {
	t.Helper()
	comms := make([]*a2a.Comm, n)
	errs := make([]error, n)
	name := fmt.Sprintf("t%d", rand.Uint64())
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			cfg := a2a.Config{NATSURL: url, Group: name, Rank: r, WorldSize: n, Secret: "s3cret",
				Logger:            slog.New(slog.DiscardHandler),
				HeartbeatInterval: 100 * time.Millisecond, PeerTimeout: 2 * time.Second, Timeout: 20 * time.Second}
			if mod != nil {
				mod(&cfg)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			comms[r], errs[r] = a2a.Join(ctx, cfg)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d join: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}
