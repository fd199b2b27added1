package control

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// BenchmarkExchangeCounts measures one counts exchange across N in-process
// ranks, each on its own TCP connection to an embedded server, with the
// coordinator either a daemon-style Service on its own connection or hosted by
// rank 0. ns/op is the time per operation with every rank looping (the
// slowest rank bounds it).
func BenchmarkExchangeCounts(b *testing.B) {
	for _, hosted := range []bool{false, true} {
		for _, n := range []int{2, 4, 8} {
			name := fmt.Sprintf("svc=daemon/ranks=%d", n)
			if hosted {
				name = fmt.Sprintf("svc=rank0/ranks=%d", n)
			}
			b.Run(name, func(b *testing.B) {
				e := newEnv(b)
				if !hosted {
					e.service()
				}
				ranks := make([]int, n)
				for i := range ranks {
					ranks[i] = i
				}
				mems := e.mustJoin(configs("gbench", ranks, nil))
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				b.ReportAllocs()
				b.ResetTimer()
				var wg sync.WaitGroup
				for _, m := range mems {
					wg.Add(1)
					go func() {
						defer wg.Done()
						send, recv := make([]int, n), make([]int, n)
						for j := range send {
							send[j] = 100*m.Rank() + j
						}
						for i := 0; i < b.N; i++ {
							if err := m.ExchangeCounts(ctx, uint64(i+1), send, recv, nil); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
			})
		}
	}
}

// BenchmarkRawAggregator is the floor for BenchmarkExchangeCounts: the same
// message pattern (N rows in, N columns out through one aggregator
// subscription) with bare NATS calls, no encoding and no bookkeeping.
func BenchmarkRawAggregator(b *testing.B) {
	for _, n := range []int{2, 4, 8} {
		b.Run(fmt.Sprintf("ranks=%d", n), func(b *testing.B) {
			e := newEnv(b)
			agg := e.conn()
			var (
				mu      sync.Mutex
				arrived int
				replies = make([]string, n)
				col     = make([]byte, 8*n)
			)
			sub, err := agg.Subscribe("raw.rows", func(m *nats.Msg) {
				mu.Lock()
				replies[int(m.Data[0])] = m.Reply
				arrived++
				if arrived < n {
					mu.Unlock()
					return
				}
				arrived = 0
				mu.Unlock()
				for _, r := range replies {
					_ = agg.Publish(r, col)
				}
			})
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Unsubscribe()
			_ = agg.Flush()
			b.ResetTimer()
			var wg sync.WaitGroup
			for r := 0; r < n; r++ {
				nc := e.conn()
				inbox := nc.NewInbox()
				ch := make(chan *nats.Msg, 16)
				rs, err := nc.ChanSubscribe(inbox, ch)
				if err != nil {
					b.Fatal(err)
				}
				_ = nc.Flush()
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer rs.Unsubscribe()
					row := make([]byte, 8*n+1)
					row[0] = byte(r)
					for i := 0; i < b.N; i++ {
						_ = nc.PublishRequest("raw.rows", inbox, row)
						<-ch
					}
				}()
			}
			wg.Wait()
		})
	}
}
