package metrics_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/a2atest"
	"github.com/a2a-moe/a2a/metrics"
)

// Each rank registers an Observer on its own registry, sets it as the
// Config's Observer before joining, and serves /metrics for Prometheus
// (deploy/prometheus scrapes port 9465+rank). Two ranks (goroutines here,
// processes in a job) exchange counts and 100 bytes each way; rank 0 then
// scrapes its own endpoint.
func ExampleObserver() {
	nats := a2atest.NewServer() // a job: `a2ad serve` and A2A_NATS_URL
	defer nats.Close()
	const size = 2
	var wg sync.WaitGroup
	for rank := range size {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel() // stops the metrics server
			cfg := a2a.Config{NATSURL: nats.URL, Group: "example", Rank: rank, WorldSize: size}

			reg := prometheus.NewRegistry()
			obs, err := metrics.New(reg, metrics.Options{Group: cfg.Group, Rank: cfg.Rank})
			if err != nil {
				panic(err)
			}
			cfg.Observer = obs
			c, err := a2a.Join(ctx, cfg)
			if err != nil {
				panic(err)
			}
			defer c.Close()
			obs.WatchTransport(func() uint64 { return c.Stats().Rejected })
			addr, err := metrics.Serve(ctx, "127.0.0.1:0", reg) // a job: ":9465" plus the rank
			if err != nil {
				panic(err)
			}

			sendCounts := []int{100, 100}
			sendCounts[c.Rank()] = 0 // nothing to itself
			recvCounts, err := c.ExchangeCounts(ctx, sendCounts)
			if err != nil {
				panic(err)
			}
			if err := c.AllToAllV(ctx, make([]byte, 100), sendCounts, make([]byte, 100), recvCounts); err != nil {
				panic(err)
			}

			if c.Rank() == 0 {
				resp, err := http.Get("http://" + addr + "/metrics")
				if err != nil {
					panic(err)
				}
				defer resp.Body.Close()
				for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
					for _, family := range []string{"a2a_membership_size", "a2a_sent_bytes_total", "a2a_counts_exchange_duration_seconds_count"} {
						if strings.HasPrefix(sc.Text(), family+"{") {
							fmt.Println(sc.Text())
						}
					}
				}
			}
		})
	}
	wg.Wait()
	// Output:
	// a2a_counts_exchange_duration_seconds_count{group="example",rank="0"} 1
	// a2a_membership_size{group="example",rank="0"} 2
	// a2a_sent_bytes_total{group="example",peer_class="local",rank="0"} 100
	// a2a_sent_bytes_total{group="example",peer_class="remote",rank="0"} 0
	// a2a_sent_bytes_total{group="example",peer_class="self",rank="0"} 0
}
