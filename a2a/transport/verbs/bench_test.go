package verbs

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

// The benchmarks run in the lab (make bench-rdma, or the verbs test binary
// with -test.bench), between a transport on rxe0 and one on rxe1 of one
// process, with the engine's idle policy (transporttest.Progress).

// reportP50 reports the median of rank 0's round trips halved: the one-way
// latency ib_write_lat reports as t_typical. On a busy lab guest the mean
// (ns/op) is dominated by a few descheduled iterations.
func reportP50(b *testing.B, rtts []time.Duration) {
	if len(rtts) == 0 {
		return
	}
	slices.Sort(rtts)
	b.ReportMetric(float64(rtts[len(rtts)/2].Nanoseconds())/2e3, "us-one-way-p50")
}

// BenchmarkPingPong is a round trip of one frame each way: ns/op is the
// round trip, twice ib_write_lat's figure.
func BenchmarkPingPong(b *testing.B) {
	for _, size := range []int{8, 4096, 64 << 10} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			ts := newClusterWith(b, labProvider(), 2, 1)
			out, back := transporttest.Pattern(1, size), make([]byte, size)
			var wg sync.WaitGroup
			errs := make([]error, 2)
			rtts := make([]time.Duration, 0, b.N)
			b.SetBytes(int64(2 * size))
			b.ResetTimer()
			for r := range 2 {
				wg.Go(func() {
					tr, c := ts[r], ts[r].Conn(1-r, 0)
					var s transport.SendOp
					var rv transport.RecvOp
					for i := range b.N {
						start := time.Now()
						hs, hr := transporttest.Hdr(r, 0, 0, uint64(i+1)), transporttest.Hdr(1-r, 0, 0, uint64(i+1))
						s.Reset(hs, out)
						rv.Reset(hr, back, false)
						var err error
						if r == 0 {
							if _, err = transporttest.Progress(tr, c, &s, nil); err == nil {
								_, err = transporttest.Progress(tr, c, nil, &rv)
							}
						} else if _, err = transporttest.Progress(tr, c, nil, &rv); err == nil {
							_, err = transporttest.Progress(tr, c, &s, nil)
						}
						if err != nil {
							errs[r] = err
							return
						}
						if r == 0 {
							rtts = append(rtts, time.Since(start))
						}
					}
				})
			}
			wg.Wait()
			if err := transporttest.FirstErr(errs); err != nil {
				b.Fatal(err)
			}
			reportP50(b, rtts)
		})
	}
}

// BenchmarkLLPingPong is a round trip of one LL store each way.
func BenchmarkLLPingPong(b *testing.B) {
	ts := newClusterWith(b, labProvider(), 2, 1)
	msg := make([]byte, 8)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	rtts := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for r := range 2 {
		wg.Go(func() {
			tr := ts[r]
			dst := make([]byte, 8)
			epoch := transport.FirstEpoch
			load := func() error {
				var st transport.SlotLoad
				var idle transporttest.Idler
				for {
					done, err := tr.Load(1-r, epoch, testTag, dst, false, &st)
					if done || err != nil {
						return err
					}
					idle.Idle(tr)
				}
			}
			for range b.N {
				start := time.Now()
				var err error
				if r == 0 {
					if err = tr.Store(1, epoch, testTag, msg); err == nil {
						err = load()
					}
				} else if err = load(); err == nil {
					err = tr.Store(0, epoch, testTag, msg)
				}
				if err != nil {
					errs[r] = err
					return
				}
				if r == 0 {
					rtts = append(rtts, time.Since(start))
				}
				epoch = transport.NextEpoch(epoch)
			}
		})
	}
	wg.Wait()
	if err := transporttest.FirstErr(errs); err != nil {
		b.Fatal(err)
	}
	reportP50(b, rtts)
}

// BenchmarkStream sends frames one way as fast as the receiver takes them:
// through bounce buffers from Go heap memory (bcopy), or from a registered
// AllocBuffer-style mapping (zcopy, ZCopyBytes 1), to find where zero-copy
// pays.
func BenchmarkStream(b *testing.B) {
	for _, mode := range []string{"bcopy", "zcopy"} {
		for _, size := range []int{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20} {
			b.Run(fmt.Sprintf("%s/%d", mode, size), func(b *testing.B) {
				p := labProvider()
				p.ZCopyBytes = -1
				src := transporttest.Pattern(2, size)
				if mode == "zcopy" {
					p.ZCopyBytes = 1
					src = mapBuffer(b, size)
				}
				ts := newClusterWith(b, p, 2, 1)
				dst := make([]byte, size)
				var wg sync.WaitGroup
				errs := make([]error, 2)
				b.SetBytes(int64(size))
				b.ResetTimer()
				for r := range 2 {
					wg.Go(func() {
						tr, c := ts[r], ts[r].Conn(1-r, 0)
						var s transport.SendOp
						var rv transport.RecvOp
						for i := range b.N {
							h := transporttest.Hdr(0, 0, 0, uint64(i+1))
							var err error
							if r == 0 {
								s.Reset(h, src)
								_, err = transporttest.Progress(tr, c, &s, nil)
							} else {
								rv.Reset(h, dst, false)
								_, err = transporttest.Progress(tr, c, nil, &rv)
							}
							if err != nil {
								errs[r] = err
								return
							}
						}
					})
				}
				wg.Wait()
				if err := transporttest.FirstErr(errs); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}
