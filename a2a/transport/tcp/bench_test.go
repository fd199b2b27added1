package tcp

import (
	"slices"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

// progress drives one send and one receive on c with the engine's idle
// policy (transporttest.Progress), failing b on error.
func progress(b *testing.B, tr *Transport, c transport.Conn, s *transport.SendOp, r *transport.RecvOp) {
	if _, err := transporttest.Progress(tr, c, s, r); err != nil {
		b.Error(err)
	}
}

// BenchmarkPingPong8B measures the round trip of an 8-byte frame between two
// ranks (one op is one round trip). Besides the mean it reports the median
// round trip (p50-ns), which other tenants of a shared machine disturb less.
func BenchmarkPingPong8B(b *testing.B) {
	ts := newCluster(b, 2, 1)
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
			progress(b, ts[1], c, nil, &r1)
			s1.Reset(hdr(1, 0, 0, uint64(i)), pong)
			progress(b, ts[1], c, &s1, nil)
		}
	}()
	rtt := make([]time.Duration, n)
	b.SetBytes(8)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range n {
		start := time.Now()
		s0.Reset(hdr(0, 0, 0, uint64(i)), ping)
		progress(b, ts[0], a, &s0, nil)
		r0.Reset(hdr(1, 0, 0, uint64(i)), ping, false)
		progress(b, ts[0], a, nil, &r0)
		rtt[i] = time.Since(start)
	}
	b.StopTimer()
	<-done
	slices.Sort(rtt)
	b.ReportMetric(float64(rtt[n/2].Nanoseconds()), "p50-ns")
}

// BenchmarkExchange1MiB measures two ranks exchanging 1 MiB each way at once
// on one stream (bytes are per rank, so MB/s is the algbw of the exchange).
func BenchmarkExchange1MiB(b *testing.B) {
	const size = 1 << 20
	ts := newCluster(b, 2, 1)
	bufs := [2][2][]byte{{pattern(1, size), make([]byte, size)}, {pattern(2, size), make([]byte, size)}}
	var sends [2]transport.SendOp
	var recvs [2]transport.RecvOp
	n := b.N
	run := func(r int) {
		c := ts[r].Conn(1-r, 0)
		for i := range n {
			sends[r].Reset(hdr(r, 0, 0, uint64(i)), bufs[r][0])
			recvs[r].Reset(hdr(1-r, 0, 0, uint64(i)), bufs[r][1], false)
			progress(b, ts[r], c, &sends[r], &recvs[r])
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(1)
	}()
	b.SetBytes(size)
	b.ReportAllocs()
	b.ResetTimer()
	run(0)
	b.StopTimer()
	<-done
}
