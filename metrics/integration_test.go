package metrics

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/a2atest"
)

// TestWithComm runs real communicators (embedded NATS, loopback TCP) with one
// Observer per rank on a shared registry, as a2ad demo does, and checks what
// the core reports: counts exchanges, bytes, the last peer, and a failure on
// one rank counted on every rank under the kind its error matches.
func TestWithComm(t *testing.T) {
	const n = 3
	url := a2atest.StartNATS(t)
	reg := prometheus.NewRegistry()
	group := fmt.Sprintf("m%d", rand.Uint64())
	obs := make([]*Observer, n)
	for r := range n {
		var err error
		if obs[r], err = New(reg, Options{Group: group, Rank: r}); err != nil {
			t.Fatal(err)
		}
	}
	// Ranks 0 and 2 share a (fake) host, rank 1 has its own: bytes between
	// 0 and 2 are local, the others remote.
	host := func(r int) int { return r % 2 }
	comms := a2atest.Group(t, url, n, func(cfg *a2a.Config) {
		cfg.Group, cfg.Observer = group, obs[cfg.Rank]
		cfg.PeerTimeout, cfg.Timeout = time.Second, 10*time.Second
		cfg.Host = fmt.Sprintf("host%d", host(cfg.Rank))
	})
	onAll := func(f func(r int, c *a2a.Comm) error) []error {
		errs := make([]error, n)
		var wg sync.WaitGroup
		for r, c := range comms {
			wg.Add(1)
			go func() { defer wg.Done(); errs[r] = f(r, c) }()
		}
		wg.Wait()
		return errs
	}
	ctx := context.Background()
	// Rank i sends 10*i+j+1 bytes to rank j.
	bytes := func(i, j int) int { return 10*i + j + 1 }

	for r, err := range onAll(func(r int, c *a2a.Comm) error {
		obs[r].WatchTransport(func() uint64 { return c.Stats().Rejected })
		send := make([]int, n)
		for j := range send {
			send[j] = bytes(r, j)
		}
		recv, err := c.ExchangeCounts(ctx, send)
		if err != nil {
			return err
		}
		sendBuf, recvBuf := make([]byte, 256), make([]byte, 256)
		return c.AllToAllV(ctx, sendBuf, send, recvBuf, recv)
	}) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}

	for r := range n {
		got := rankSeries(t, reg, strconv.Itoa(r))
		sent, received := map[bool]int{}, map[bool]int{} // by "local"
		for j := range n {
			if j != r {
				sent[host(j) == host(r)] += bytes(r, j)
				received[host(j) == host(r)] += bytes(j, r)
			}
		}
		want := map[string]float64{
			"a2a_counts_exchange_duration_seconds_count":  1,
			"a2a_sent_bytes_total{peer_class=remote}":     float64(sent[false]),
			"a2a_received_bytes_total{peer_class=remote}": float64(received[false]),
			"a2a_sent_bytes_total{peer_class=local}":      float64(sent[true]),
			"a2a_received_bytes_total{peer_class=local}":  float64(received[true]),
			"a2a_membership_size":                         n,
			"a2a_rejected_connections_total":              0,
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("rank %d: %s = %g, want %g", r, k, got[k], v)
			}
		}
		selections, lasts, durations := 0.0, 0.0, 0.0
		for k, v := range got {
			switch {
			case strings.HasPrefix(k, "a2a_algorithm_selections_total{") && strings.Contains(k, "op=alltoallv"):
				selections += v
			case strings.HasPrefix(k, "a2a_peer_last_arrivals_total{"):
				lasts += v
			case strings.HasPrefix(k, "a2a_collective_duration_seconds_count{"):
				durations += v
			}
		}
		if selections != 1 || durations != 1 || lasts != 1 {
			t.Errorf("rank %d: alltoallv selections %g, durations %g, last arrivals %g; want 1 each", r, selections, durations, lasts)
		}
		if v := got[fmt.Sprintf("a2a_peer_last_arrivals_total{peer=%d}", r)]; v != 0 {
			t.Errorf("rank %d waited on itself %g times", r, v)
		}
	}

	// Rank 0 passes a counts vector of the wrong length: it fails with
	// ErrInvalidArgument and aborts the group, so the others fail with
	// ErrAborted wrapping that root cause, counted under it.
	errs := onAll(func(r int, c *a2a.Comm) error {
		counts := make([]int, n)
		if r == 0 {
			counts = counts[:1]
		}
		return c.AllToAllV(ctx, nil, counts, nil, make([]int, n))
	})
	for r, err := range errs {
		if k := ErrorKind(err); k != KindInvalidArgument {
			t.Errorf("rank %d: error %v has kind %q, want %q", r, err, k, KindInvalidArgument)
		}
		got := rankSeries(t, reg, strconv.Itoa(r))
		for _, kind := range []string{KindInvalidArgument, KindAborted} {
			key := fmt.Sprintf("a2a_errors_total{kind=%s,op=alltoallv}", kind)
			if want := map[bool]float64{true: 1}[kind == KindInvalidArgument]; got[key] != want {
				t.Errorf("rank %d: %s = %g, want %g", r, key, got[key], want)
			}
		}
	}
}
