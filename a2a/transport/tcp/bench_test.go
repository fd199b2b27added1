package tcp

import (
	"fmt"
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

// BenchmarkExchangeSmall measures two ranks exchanging one frame each way at
// once, the wire of a 2-rank AllToAllV, for payloads up to smallMax: staged
// (one send and one recv of a contiguous copy) against iovec (a one-slice
// vectored op: sendmsg and readv of the header and the payload, the path of
// every frame before staging). Sub-benchmarks alternate in one binary, so a
// shared machine's moods fall on both; p50-ns is the median exchange, the
// slower rank's. Both ranks busy-poll, as a2a's engine does for its first
// 50 us, and each needs a core of its own.
func BenchmarkExchangeSmall(b *testing.B) {
	for _, size := range []int{8, 1 << 10, smallMax} {
		for _, mode := range []string{"staged", "iovec"} {
			b.Run(fmt.Sprintf("%d/%s", size, mode), func(b *testing.B) { benchExchange(b, size, mode == "iovec") })
		}
	}
}

func benchExchange(b *testing.B, size int, vec bool) {
	ts := newCluster(b, 2, 1)
	n := b.N
	var times [2][]time.Duration
	run := func(r int) {
		c := ts[r].Conn(1-r, 0)
		out, in := pattern(uint64(r), size), make([]byte, size)
		var s transport.SendOp
		var rv transport.RecvOp
		times[r] = make([]time.Duration, n)
		for i := range n {
			start := time.Now()
			if vec {
				s.ResetVec(hdr(r, 0, 0, uint64(i)), [][]byte{out})
				rv.ResetVec(hdr(1-r, 0, 0, uint64(i)), [][]byte{in})
			} else {
				s.Reset(hdr(r, 0, 0, uint64(i)), out)
				rv.Reset(hdr(1-r, 0, 0, uint64(i)), in, false)
			}
			if err := spinExchange(c, &s, &rv); err != nil {
				b.Error(err)
				return
			}
			times[r][i] = time.Since(start)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(1)
	}()
	b.SetBytes(int64(size))
	b.ResetTimer()
	run(0)
	b.StopTimer()
	<-done
	slower := times[0]
	for i, t := range times[1] {
		slower[i] = max(slower[i], t)
	}
	slices.Sort(slower)
	b.ReportMetric(float64(slower[n/2].Nanoseconds()), "p50-ns")
}

// spinExchange drives s and r on c to completion without ever waiting.
func spinExchange(c transport.Conn, s *transport.SendOp, r *transport.RecvOp) error {
	sDone, rDone := false, false
	for !sDone || !rDone {
		var err error
		if !sDone {
			if sDone, err = c.TrySend(s); err != nil {
				return err
			}
		}
		if !rDone {
			if rDone, err = c.TryRecv(r); err != nil {
				return err
			}
		}
	}
	return nil
}
