package verbs_test

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/a2a-moe/a2a/verbs"
	"golang.org/x/sys/unix"
)

// The benchmarks in this file take apart the cost of an 8 B message in the lab, where
// every system call and cgo call costs microseconds (TCG): the primitives alone, ping-pongs
// of one 8 B RDMA WRITE each way between rxe0 and rxe1 as ib_write_lat does them (the
// receiver polls the last byte; the figure is half the median round trip, ib_write_lat's
// t_typical), variants of how the message is sent and detected, and the exchange of an
// AllToAll of two ranks: both sides write at once and wait for the other's write (the
// figure is the median round). Run them with the package's test binary in the lab
// (bin/rdma-tests/verbs.test; make bench-rdma runs the exchange).

// BenchmarkLabPrimitives times one call of each primitive on an idle connection.
func BenchmarkLabPrimitives(b *testing.B) {
	a, _ := labPair(b, 1<<16)
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"poll-empty", func() error { _, err := a.cq.Poll(a.wc); return err }},
		{"arm", func() error { return a.cq.Arm(false) }},
		{"drain-empty", func() error { _, err := a.ch.Drain(); return err }},
		{"clock", func() error { time.Now(); return nil }},
		{"sched-yield", func() error { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0); return nil }},
	} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				if err := c.call(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// pingMode is how one variant sends and detects a message.
type pingMode struct {
	op       verbs.Opcode
	byCQ     bool // detect arrival by the receive completion, not by polling memory
	armEvery bool // arm the CQ after every message and drain its event (a transport ready to park)
	// What the waiting side does on each pass besides looking at memory: poll the CQ (a
	// cgo call; without it, as ib_write_lat, the CQ is polled once the message is there),
	// read the clock, give the core away.
	poll, clock, yield bool
	// exchange: both sides write at once and wait for the other's write.
	exchange bool
}

// BenchmarkLabWriteLat runs the ping-pongs and the exchanges; ns/op is a round.
func BenchmarkLabWriteLat(b *testing.B) {
	imm := verbs.OpRDMAWriteWithImm
	for _, c := range []struct {
		name string
		m    pingMode
	}{
		{"pingpong/write", pingMode{op: verbs.OpRDMAWrite}},
		{"pingpong/write-poll", pingMode{op: verbs.OpRDMAWrite, poll: true}},
		{"pingpong/write-poll-clock", pingMode{op: verbs.OpRDMAWrite, poll: true, clock: true}},
		{"pingpong/write-poll-yield", pingMode{op: verbs.OpRDMAWrite, poll: true, yield: true}},
		{"pingpong/imm", pingMode{op: imm, poll: true}},
		{"pingpong/imm-cq", pingMode{op: imm, poll: true, byCQ: true}},
		{"pingpong/imm-armed", pingMode{op: imm, poll: true, armEvery: true}},
		{"exchange/write", pingMode{op: verbs.OpRDMAWrite, poll: true, exchange: true}},
		{"exchange/imm", pingMode{op: imm, poll: true, exchange: true}},
	} {
		b.Run(c.name, func(b *testing.B) { pingPong(b, c.m) })
	}
}

func pingPong(b *testing.B, m pingMode) {
	x, y := labPair(b, 1<<16)
	ps := [2]*pinger{{side: x, peer: y, m: m}, {side: y, peer: x, m: m}}
	var ready, wg sync.WaitGroup
	ready.Add(2)
	errs := make([]error, 2)
	b.ResetTimer()
	for r := range ps {
		wg.Go(func() {
			if errs[r] = ps[r].prepare(); errs[r] != nil {
				ready.Done()
				return
			}
			ready.Done()
			ready.Wait()
			errs[r] = ps[r].run(b.N, r == 0)
		})
	}
	wg.Wait()
	b.StopTimer()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	rounds := ps[0].rounds
	if len(rounds) != b.N {
		b.Fatalf("%d rounds timed, want %d", len(rounds), b.N)
	}
	slices.Sort(rounds)
	p50 := float64(rounds[len(rounds)/2].Nanoseconds()) / 1e3
	if m.exchange {
		b.ReportMetric(p50, "us-round-p50")
	} else {
		b.ReportMetric(p50/2, "us-one-way-p50")
	}
}

// pinger is one side of a ping-pong or exchange. The message is the round number, written
// from offset out of its buffer into the first 8 bytes of the peer's.
type pinger struct {
	*side
	peer     *side
	m        pingMode
	recvs    int // receives posted
	unreaped int // signaled sends not completed
	rounds   []time.Duration
}

const pingOut = 4096

// prepare posts the receives a write with immediate consumes.
func (p *pinger) prepare() error {
	if p.m.op != verbs.OpRDMAWriteWithImm {
		return nil
	}
	for ; p.recvs < 32; p.recvs++ {
		if err := p.qp.PostRecv(9, []verbs.SGE{p.mr.SGE(0, 0)}); err != nil {
			return err
		}
	}
	return nil
}

// run does n rounds; first says this side writes first (and times the rounds).
func (p *pinger) run(n int, first bool) error {
	for v := uint64(1); v <= uint64(n); v++ {
		start := time.Now()
		if first || p.m.exchange {
			if err := p.send(v); err != nil {
				return err
			}
		}
		if err := p.await(v); err != nil {
			return err
		}
		if !first && !p.m.exchange {
			if err := p.send(v); err != nil {
				return err
			}
		}
		if first {
			p.rounds = append(p.rounds, time.Since(start))
		}
	}
	return nil
}

func (p *pinger) send(v uint64) error {
	binary.LittleEndian.PutUint64(p.buf[pingOut:], v)
	p.unreaped++
	wr := verbs.SendWR{ID: 1, Op: p.m.op, Flags: verbs.SendSignaled | verbs.SendInline, Imm: uint32(v),
		RemoteAddr: p.peer.mr.Addr(), RKey: p.peer.mr.RKey()}
	return p.qp.PostSend(wr, []verbs.SGE{p.mr.SGE(pingOut, 8)})
}

// await waits for round v's message (or a later one: an exchanging peer may be a round
// ahead), then reposts receives and rearms as the mode says.
func (p *pinger) await(v uint64) error {
	in := (*uint64)(unsafe.Pointer(&p.buf[0]))
	for {
		got := !p.m.byCQ && atomic.LoadUint64(in) >= v
		if !got && !p.m.poll {
			continue
		}
		if p.m.clock {
			time.Now()
		}
		if p.m.yield {
			unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		}
		imm, err := p.reap()
		if err != nil {
			return err
		}
		if got || p.m.byCQ && imm >= v {
			return p.after()
		}
	}
}

// reap polls the CQ once and returns the largest immediate it found.
func (p *pinger) reap() (uint64, error) {
	k, err := p.cq.Poll(p.wc)
	if err != nil {
		return 0, err
	}
	var imm uint64
	for _, w := range p.wc[:k] {
		if err := w.Err(); err != nil {
			return 0, err
		}
		switch w.Opcode {
		case verbs.WCRecvRDMAWithImm:
			p.recvs--
			imm = max(imm, uint64(w.Imm()))
		case verbs.WCRDMAWrite:
			p.unreaped--
		default:
			return 0, fmt.Errorf("unexpected completion %v", w.Opcode)
		}
	}
	return imm, nil
}

func (p *pinger) after() error {
	if p.recvs < 16 {
		if err := p.prepare(); err != nil {
			return err
		}
	}
	if p.unreaped > 16 {
		return fmt.Errorf("%d send completions not reaped", p.unreaped)
	}
	if !p.m.armEvery {
		return nil
	}
	if err := p.cq.Arm(false); err != nil {
		return err
	}
	_, err := p.ch.Drain()
	return err
}
