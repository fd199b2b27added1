package shm

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

// progress is transporttest.Progress: one send and one receive driven
// with the engine's idle policy.
func progress(tr *Transport, c transport.Conn, s *transport.SendOp, r *transport.RecvOp) (int, error) {
	return transporttest.Progress(tr, c, s, r)
}

// mustProgress is progress failing b on error.
func mustProgress(b *testing.B, tr *Transport, c transport.Conn, s *transport.SendOp, r *transport.RecvOp) int {
	parks, err := progress(tr, c, s, r)
	if err != nil {
		b.Error(err)
	}
	return parks
}

// BenchmarkPingPong8B measures the round trip of an 8-byte frame between two
// in-process ranks, each on its own goroutine spinning on its conn (one op is
// one round trip). Besides the mean it reports the median (p50-ns), which
// other tenants of a shared machine disturb less.
func BenchmarkPingPong8B(b *testing.B) {
	ts := newCluster(b, 2, 1, 0)
	a, c := ts[0].Conn(1, 0), ts[1].Conn(0, 0)
	ping, pong := make([]byte, 8), make([]byte, 8)
	var s0, s1 transport.SendOp
	var r0, r1 transport.RecvOp
	n := b.N
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			r1.Reset(hdr(0, 0, 0, uint64(i)), pong, false)
			spin(b, c, nil, &r1)
			s1.Reset(hdr(1, 0, 0, uint64(i)), pong)
			spin(b, c, &s1, nil)
		}
	}()
	rtt := make([]time.Duration, n)
	b.SetBytes(8)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range n {
		start := time.Now()
		s0.Reset(hdr(0, 0, 0, uint64(i)), ping)
		spin(b, a, &s0, nil)
		r0.Reset(hdr(1, 0, 0, uint64(i)), ping, false)
		spin(b, a, nil, &r0)
		rtt[i] = time.Since(start)
	}
	b.StopTimer()
	<-done
	slices.Sort(rtt)
	b.ReportMetric(float64(rtt[n/2].Nanoseconds()), "p50-ns")
}

// spin tries s or r on c until it is done, failing b on error.
func spin(b *testing.B, c transport.Conn, s *transport.SendOp, r *transport.RecvOp) {
	if err := spinOp(c, s, r); err != nil {
		b.Error(err)
	}
}

// spinOp tries s or r on c until it is done, yielding to other goroutines
// now and then only, so that a rank alone on its core reacts at once.
func spinOp(c transport.Conn, s *transport.SendOp, r *transport.RecvOp) error {
	for idle := 1; ; idle++ {
		var done bool
		var err error
		if s != nil {
			done, err = c.TrySend(s)
		} else {
			done, err = c.TryRecv(r)
		}
		if err != nil || done {
			return err
		}
		if idle%1024 == 0 {
			runtime.Gosched()
		}
	}
}

// BenchmarkPingPongProcs is BenchmarkPingPong8B with rank 1 in another
// process.
func BenchmarkPingPongProcs(b *testing.B) {
	group := testGroup(b)
	h := startHelper(b, "pong", group, DefaultDir, 0, false, false, fmt.Sprintf("%s=%d:%d:%d", helperBench, 8, b.N, 0))
	tr := openRank0(b, group, DefaultDir, 0)
	c := tr.Conn(1, 0)
	ping := make([]byte, 8)
	var s transport.SendOp
	var r transport.RecvOp
	rtt := make([]time.Duration, b.N)
	b.SetBytes(8)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		s.Reset(hdr(0, 0, 0, uint64(i)), ping)
		spin(b, c, &s, nil)
		r.Reset(hdr(1, 0, 0, uint64(i)), ping, false)
		spin(b, c, nil, &r)
		rtt[i] = time.Since(start)
	}
	b.StopTimer()
	h.expect(b, "done")
	slices.Sort(rtt)
	b.ReportMetric(float64(rtt[b.N/2].Nanoseconds()), "p50-ns")
}

// BenchmarkExchange1MiB measures two ranks exchanging 1 MiB each way at once
// on one stream (bytes are per rank, so MB/s is the algbw of the exchange
// without the local slot), through the ring and by CMA.
func BenchmarkExchange1MiB(b *testing.B) {
	for _, z := range []int{ringOnly, cmaAll} {
		b.Run(modeName(z), func(b *testing.B) { benchExchange(b, 1<<20, z, 0) })
	}
}

// BenchmarkExchange sweeps message sizes and ring sizes through the ring and
// by CMA: the data behind DefaultRingBytes and DefaultZCopyThreshold.
func BenchmarkExchange(b *testing.B) {
	for _, size := range []int{4 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 1 << 20, 4 << 20} {
		for _, z := range []int{ringOnly, cmaAll} {
			b.Run(fmt.Sprintf("%s/%dKiB", modeName(z), size>>10), func(b *testing.B) { benchExchange(b, size, z, 0) })
		}
	}
	for _, ring := range []int{16 << 10, 64 << 10, 256 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("ring%dKiB/1MiB", ring>>10), func(b *testing.B) { benchExchange(b, 1<<20, ringOnly, ring) })
	}
}

// BenchmarkExchangeProcs is BenchmarkExchange with rank 1 in another
// process, as in a real job: CMA then reads another address space.
func BenchmarkExchangeProcs(b *testing.B) {
	for _, size := range []int{4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20} {
		for _, z := range []int{ringOnly, cmaAll} {
			b.Run(fmt.Sprintf("%s/%dKiB", modeName(z), size>>10), func(b *testing.B) { benchExchangeProcs(b, size, z, DefaultRingBytes) })
		}
	}
	for _, ring := range []int{16 << 10, 64 << 10, 256 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("ring%dKiB/1MiB", ring>>10), func(b *testing.B) { benchExchangeProcs(b, 1<<20, ringOnly, ring) })
	}
}

// BenchmarkMappedExchangeProcs is BenchmarkExchangeProcs by CMA from Go
// heap buffers against the same from shareable buffers (a2a.AllocBuffer),
// which the receiver maps once and copies from. BenchmarkMemcpy is the
// ceiling.
func BenchmarkMappedExchangeProcs(b *testing.B) {
	for _, size := range []int{64 << 10, 256 << 10, 1 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("cma/%dKiB", size>>10), func(b *testing.B) { benchExchangeProcs(b, size, cmaAll, DefaultRingBytes) })
		b.Run(fmt.Sprintf("mapped/%dKiB", size>>10), func(b *testing.B) {
			benchExchangeProcs(b, size, cmaAll, DefaultRingBytes, helperMap+"=1")
		})
	}
}

// BenchmarkMemcpy is one thread's copy between two buffers: in one Go copy
// (non-temporal stores from 1 MiB on) and in the pieces the mapped receive
// copies in (copyCached), which is what glibc's memcpy does at these sizes.
// The ceiling of a mapped exchange, in which both ranks copy at once, each
// on its core.
//
// The memfd modes copy, in pieces, from a shareable buffer as a mapped
// receive does: where shmem_enabled forbids huge pages to shared memory
// (the 2-core VM), its pages are 4 KiB while the Go heap's are
// transparent huge pages, so they price the TLB misses of a peer's
// mapping against the same copy from the heap.
func BenchmarkMemcpy(b *testing.B) {
	for _, size := range []int{64 << 10, 256 << 10, 1 << 20, 4 << 20} {
		for _, mode := range []string{"copy", "pieces", "pieces-memfd"} {
			b.Run(fmt.Sprintf("%s/%dKiB", mode, size>>10), func(b *testing.B) {
				src, dst := pattern(1, size), make([]byte, size)
				if mode == "pieces-memfd" {
					src = sharedBuf(b, size, 1)
				}
				b.SetBytes(int64(size))
				for b.Loop() {
					if mode == "copy" {
						copy(dst, src)
					} else {
						copyCached(dst, src)
					}
				}
			})
		}
	}
}

// benchExchangeProcs times exchanges of size bytes each way with a helper
// process; env with helperMap makes both ranks send from shareable buffers.
func benchExchangeProcs(b *testing.B, size, zcopy, ring int, env ...string) {
	group := testGroup(b)
	env = append(env, fmt.Sprintf("%s=%d:%d:%d", helperBench, size, b.N, ring))
	h := startHelper(b, "bench", group, DefaultDir, zcopy, false, false, env...)
	tr := openRank0(b, group, DefaultDir, zcopy, func(c *Config) { c.RingBytes = ring })
	c := tr.Conn(1, 0)
	out, in := pattern(1, size), make([]byte, size)
	if len(env) > 1 {
		out = sharedBuf(b, size, 1)
	}
	var s transport.SendOp
	var r transport.RecvOp
	lat := make([]time.Duration, b.N)
	parks := 0
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		s.Reset(hdr(0, 0, 0, uint64(i)), out)
		r.Reset(hdr(1, 0, 0, uint64(i)), in, false)
		parks += mustProgress(b, tr, c, &s, &r)
		lat[i] = time.Since(start)
	}
	b.StopTimer()
	h.expect(b, "done")
	reportExchange(b, lat, float64(parks))
}

func benchExchange(b *testing.B, size, zcopy, ring int) {
	ts := newCluster(b, 2, 1, zcopy, func(c *Config) { c.RingBytes = ring })
	var sends [2]transport.SendOp
	var recvs [2]transport.RecvOp
	benchPair(b, size, func(r, i int, out, in []byte) (int, error) {
		sends[r].Reset(hdr(r, 0, 0, uint64(i)), out)
		recvs[r].Reset(hdr(1-r, 0, 0, uint64(i)), in, false)
		return progress(ts[r], ts[r].Conn(1-r, 0), &sends[r], &recvs[r])
	})
}

// benchPair times exchanges between two in-process ranks: exchange(r, i,
// out, in) runs rank r's part of exchange i and returns its parks; rank 1
// runs in another goroutine, rank 0's time per exchange is reported.
func benchPair(b *testing.B, size int, exchange func(r, i int, out, in []byte) (parks int, err error)) {
	bufs := [2][2][]byte{{pattern(1, size), make([]byte, size)}, {pattern(2, size), make([]byte, size)}}
	var parks [2]int
	n := b.N
	lat := make([]time.Duration, n)
	run := func(r int) {
		for i := range n {
			start := time.Now()
			p, err := exchange(r, i, bufs[r][0], bufs[r][1])
			if err != nil {
				b.Error(err)
				return
			}
			parks[r] += p
			if r == 0 {
				lat[i] = time.Since(start)
			}
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(1)
	}()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	run(0)
	b.StopTimer()
	<-done
	reportExchange(b, lat, float64(parks[0]+parks[1]))
}

// reportExchange reports the median exchange time, which other tenants of a
// shared machine disturb less than the mean, and the parks per exchange.
func reportExchange(b *testing.B, lat []time.Duration, parks float64) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-us")
	b.ReportMetric(parks/float64(len(lat)), "parks/op")
}

// BenchmarkSendRecv8B measures the processor cost of the small-message path:
// one goroutine sends an 8-byte frame and receives it on the other side, so
// no cache line crosses cores.
func BenchmarkSendRecv8B(b *testing.B) {
	ts := newCluster(b, 2, 1, 0)
	a, c := ts[0].Conn(1, 0), ts[1].Conn(0, 0)
	out, in := make([]byte, 8), make([]byte, 8)
	var s transport.SendOp
	var r transport.RecvOp
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h := hdr(0, 0, 0, uint64(i))
		s.Reset(h, out)
		if done, err := a.TrySend(&s); !done || err != nil {
			b.Fatal(done, err)
		}
		r.Reset(h, in, false)
		if done, err := c.TryRecv(&r); !done || err != nil {
			b.Fatal(done, err)
		}
	}
}
