package a2a

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/tcp"
)

// spanCase is one AllToAllVSpans workload that every rank can recompute: the
// send buffer and span lists of any rank, and where any rank's bytes land.
type spanCase struct {
	n, bufBytes, maxSpan, maxSpans int
	seed                           uint64
}

// sendBuf is rank r's send buffer.
func (sc spanCase) sendBuf(r int) []byte {
	rng := rand.New(rand.NewPCG(sc.seed, uint64(r)))
	b := make([]byte, sc.bufBytes)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// sendSpans is what rank r sends rank j: random spans anywhere in its
// buffer, empty ones and overlapping ones included.
func (sc spanCase) sendSpans(r, j int) []Span {
	rng := rand.New(rand.NewPCG(sc.seed, uint64(r)<<32|uint64(j)|1<<62))
	spans := make([]Span, rng.IntN(sc.maxSpans+1))
	for i := range spans {
		l := rng.IntN(sc.maxSpan + 1)
		if rng.IntN(5) == 0 {
			l = 0
		}
		spans[i] = Span{Off: rng.IntN(sc.bufBytes - l + 1), Len: l}
	}
	return spans
}

// gathered is the message rank r sends rank j, packed.
func (sc spanCase) gathered(r, j int) []byte {
	buf := sc.sendBuf(r)
	var out []byte
	for _, s := range sc.sendSpans(r, j) {
		out = append(out, buf[s.Off:s.Off+s.Len]...)
	}
	return out
}

// recvLayout scatters what rank me receives: every source's bytes cut into
// random pieces (empty ones included), the pieces of all sources shuffled
// over the receive buffer with gaps between them. It returns the spans by
// source and the buffer size.
func (sc spanCase) recvLayout(me int) ([][]Span, int) {
	rng := rand.New(rand.NewPCG(sc.seed, uint64(me)|1<<61))
	type piece struct{ src, idx, len int }
	var pieces []piece
	spans := make([][]Span, sc.n)
	for src := range sc.n {
		left := len(sc.gathered(src, me))
		for left > 0 || rng.IntN(3) == 0 {
			l := min(left, rng.IntN(2*sc.maxSpan+1))
			pieces = append(pieces, piece{src, len(spans[src]), l})
			spans[src] = append(spans[src], Span{})
			left -= l
		}
	}
	rng.Shuffle(len(pieces), func(a, b int) { pieces[a], pieces[b] = pieces[b], pieces[a] })
	off := 0
	for _, p := range pieces {
		off += rng.IntN(3) // a gap the call must not write
		spans[p.src][p.idx] = Span{Off: off, Len: p.len}
		off += p.len
	}
	return spans, off + 1
}

// runSpans runs sc on comms and checks every byte each rank received, and
// that no byte outside the receive spans changed.
func runSpans(t *testing.T, comms []*Comm, sc spanCase) {
	t.Helper()
	const fill = 0xEE
	recvs := make([][]byte, sc.n)
	layouts := make([][][]Span, sc.n)
	mustAll(t, onAll(comms, func(c *Comm) error {
		me := c.Rank()
		send := sc.sendBuf(me)
		sendSpans := make([][]Span, sc.n)
		for j := range sendSpans {
			sendSpans[j] = sc.sendSpans(me, j)
		}
		spans, size := sc.recvLayout(me)
		recv := bytes.Repeat([]byte{fill}, size)
		recvs[me], layouts[me] = recv, spans
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return c.AllToAllVSpans(ctx, send, sendSpans, recv, spans)
	}))
	for me, recv := range recvs {
		written := make([]bool, len(recv))
		for src, spans := range layouts[me] {
			var got []byte
			for _, s := range spans {
				got = append(got, recv[s.Off:s.Off+s.Len]...)
				for i := s.Off; i < s.Off+s.Len; i++ {
					written[i] = true
				}
			}
			if want := sc.gathered(src, me); !bytes.Equal(got, want) {
				t.Fatalf("rank %d from rank %d: %d bytes differ from the %d sent (first difference at %d)", me, src, len(got), len(want), firstDiff(got, want))
			}
		}
		for i, w := range written {
			if !w && recv[i] != fill {
				t.Fatalf("rank %d: byte %d outside every receive span changed to %#x", me, i, recv[i])
			}
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestAllToAllVSpans checks the gather-send AllToAllV byte for byte over TCP
// and shared memory at 2 to 5 ranks: random spans (empty and overlapping send
// spans included) gathered from one buffer and scattered into another, small
// messages and large ones (frames cut across spans; on shm, ring copies
// straight from and to the spans, or CMA for long slices), several
// calls on one group, by pairwise
// and fullmesh.
func TestAllToAllVSpans(t *testing.T) {
	url := startNATS(t)
	ranks := []int{2, 3, 5}
	if raceEnabled {
		// 5 ranks are half the test's time under the race detector
		// (16 of 33 s), and the longest test of make test's race run;
		// 2 and 3 ranks run the same code, and the run without the race
		// detector still runs 5.
		ranks = ranks[:2]
	}
	for _, tr := range []string{"tcp", "shm"} {
		for _, n := range ranks {
			for _, a := range []string{"fullmesh", "pairwise"} {
				if a == "pairwise" && n != 3 {
					continue // the algorithm is orthogonal to the rank count
				}
				t.Run(fmt.Sprintf("%s/%d/%s", tr, n, a), func(t *testing.T) {
					comms := group(t, url, n, func(c *Config) { c.Transport, c.Algo = tr, a })
					if got := comms[0].TransportName(); got != tr {
						t.Fatalf("transport %q, want %q", got, tr)
					}
					cases := []spanCase{
						{n: n, bufBytes: 4 << 10, maxSpan: 300, maxSpans: 12, seed: 1},       // small: ring copies, LL-sized blocks
						{n: n, bufBytes: 1 << 20, maxSpan: 64 << 10, maxSpans: 40, seed: 2},  // large: CMA, frames over span boundaries
						{n: n, bufBytes: 64 << 10, maxSpan: 2 << 10, maxSpans: 600, seed: 3}, // many rows: iovec lists cut per call
						{n: n, bufBytes: 16 << 10, maxSpan: 64, maxSpans: 5000, seed: 5},     // tiny spans: more than one call's iovecs per frame
						{n: n, bufBytes: 100, maxSpan: 0, maxSpans: 3, seed: 4},              // empty messages only
					}
					for _, sc := range cases {
						runSpans(t, comms, sc)
					}
				})
			}
		}
	}
}

// TestAllToAllVSpansBadArguments: spans outside their buffer, negative
// lengths, missing lists and overlapping receive spans fail with
// ErrInvalidArgument (ErrOverlap for the overlap) on the rank that gave them,
// a receive total that differs from what the sender sends with ErrMismatch,
// and every other rank is released.
func TestAllToAllVSpansBadArguments(t *testing.T) {
	url := startNATS(t)
	const n = 3
	cases := []struct {
		name string
		bad  func(send, recv [][]Span) ([][]Span, [][]Span)
		kind error
	}{
		{"send span past the end", func(s, r [][]Span) ([][]Span, [][]Span) {
			s[2] = append(s[2], Span{Off: 60, Len: 5})
			return s, r
		}, ErrInvalidArgument},
		{"negative offset", func(s, r [][]Span) ([][]Span, [][]Span) {
			s[0] = []Span{{Off: -1, Len: 1}}
			return s, r
		}, ErrInvalidArgument},
		{"negative length", func(s, r [][]Span) ([][]Span, [][]Span) {
			r[0] = []Span{{Off: 1, Len: -1}}
			return s, r
		}, ErrInvalidArgument},
		{"recv span past the end", func(s, r [][]Span) ([][]Span, [][]Span) {
			r[2] = []Span{{Off: 90, Len: 20}}
			return s, r
		}, ErrInvalidArgument},
		{"missing list", func(s, r [][]Span) ([][]Span, [][]Span) { return s[:2], r }, ErrInvalidArgument},
		{"overlapping receive", func(s, r [][]Span) ([][]Span, [][]Span) {
			r[0] = []Span{{Off: 0, Len: 10}}
			r[2] = []Span{{Off: 5, Len: 10}}
			return s, r
		}, ErrOverlap},
		{"overlapping receive out of order", func(s, r [][]Span) ([][]Span, [][]Span) {
			r[0] = []Span{{Off: 40, Len: 5}, {Off: 0, Len: 5}}
			r[2] = []Span{{Off: 20, Len: 1}, {Off: 4, Len: 5}}
			return s, r
		}, ErrOverlap},
		{"receive total differs from the sender's", func(s, r [][]Span) ([][]Span, [][]Span) {
			r[0] = []Span{{Off: 0, Len: 7}}
			return s, r
		}, ErrMismatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			comms := group(t, url, n, nil)
			errs := onAll(comms, func(c *Comm) error {
				send, recv := make([]byte, 64), make([]byte, 100)
				ss, rs := make([][]Span, n), make([][]Span, n)
				for j := range n {
					ss[j] = []Span{{Off: 8 * j, Len: 8}}
					rs[j] = []Span{{Off: 20 * j, Len: 8}}
				}
				if c.Rank() == 1 {
					ss, rs = tc.bad(ss, rs)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				return c.AllToAllVSpans(ctx, send, ss, recv, rs)
			})
			if !errors.Is(errs[1], tc.kind) {
				t.Fatalf("rank 1: got %v, want %v", errs[1], tc.kind)
			}
			if errors.Is(tc.kind, ErrOverlap) && !errors.Is(errs[1], ErrInvalidArgument) {
				t.Errorf("rank 1: %v does not match ErrInvalidArgument", errs[1])
			}
			var fe *Error
			if !errors.As(errs[1], &fe) {
				t.Errorf("rank 1: %T is not an *a2a.Error", errs[1])
			}
			for _, r := range []int{0, 2} {
				if errs[r] != nil && !errors.Is(errs[r], ErrAborted) {
					t.Errorf("rank %d: got %v, want nil or ErrAborted", r, errs[r])
				}
			}
		})
	}
}

// TestAllToAllVSpansAllocatesNothing: a steady-state AllToAllVSpans of many
// row-sized spans allocates nothing on any rank, over TCP and shm.
func TestAllToAllVSpansAllocatesNothing(t *testing.T) {
	url := startNATS(t)
	const n, rows, row = 3, 64, 2 << 10
	for _, tr := range []string{"tcp", "shm"} {
		t.Run(tr, func(t *testing.T) {
			comms := group(t, url, n, func(c *Config) {
				c.Transport = tr
				c.HeartbeatInterval, c.PeerTimeout, c.Report = 10*time.Second, 30*time.Second, -1
			})
			ctx := context.Background()
			type rankBufs struct {
				send, recv   []byte
				sends, recvs [][]Span
			}
			bufs := make([]rankBufs, n)
			for r := range bufs {
				b := &bufs[r]
				b.send, b.recv = make([]byte, rows*row), make([]byte, n*rows*row)
				b.sends, b.recvs = make([][]Span, n), make([][]Span, n)
				for j := range n {
					for k := range rows {
						// Every other row, backwards: nothing contiguous.
						b.sends[j] = append(b.sends[j], Span{Off: ((rows - 1 - k + j) % rows) * row, Len: row / 2})
						b.recvs[j] = append(b.recvs[j], Span{Off: (j*rows + k) * row, Len: row / 2})
					}
				}
			}
			run := func(iters int) {
				mustAll(t, onAll(comms, func(c *Comm) error {
					b := &bufs[c.Rank()]
					for range iters {
						if err := c.AllToAllVSpans(ctx, b.send, b.sends, b.recv, b.recvs); err != nil {
							return err
						}
					}
					return nil
				}))
			}
			run(5)
			const iters = 50
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			run(iters)
			runtime.ReadMemStats(&after)
			if perOp := (float64(after.Mallocs-before.Mallocs) - 64) / float64(n*iters); perOp > 0.1 {
				t.Errorf("%.2f allocations per call per rank, want 0", perOp)
			}
		})
	}
}

// plainProvider hides vectored I/O from its transport's Conns, as a
// transport without it (verbs today) looks to the engine.
type plainProvider struct{ transport.Provider }

type plainEndpoint struct{ transport.Endpoint }

type plainTransport struct{ transport.Transport }

type plainConn struct{ transport.Conn }

func (p plainProvider) Listen(ctx context.Context, self transport.Self) (transport.Endpoint, error) {
	ep, err := p.Provider.Listen(ctx, self)
	if err != nil {
		return nil, err
	}
	return plainEndpoint{ep}, nil
}

func (e plainEndpoint) Connect(ctx context.Context, g transport.Group, peers []int) (transport.Transport, error) {
	tr, err := e.Endpoint.Connect(ctx, g, peers)
	if err != nil {
		return nil, err
	}
	return plainTransport{tr}, nil
}

func (t plainTransport) Conn(peer, stream int) transport.Conn {
	return plainConn{t.Transport.Conn(peer, stream)}
}

// TestAllToAllVSpansPacksForPlainTransports: over a transport whose Conns
// do not move vectored payloads, the engine packs the gathered bytes into
// staging and unpacks what lands, and every byte still arrives.
func TestAllToAllVSpansPacksForPlainTransports(t *testing.T) {
	url := startNATS(t)
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			comms := group(t, url, n, func(c *Config) {
				c.Providers = []transport.Provider{plainProvider{tcp.Provider{}}}
			})
			if _, vec := comms[0].tr.Conn(1, 0).(transport.VecConn); vec {
				t.Fatal("the wrapped transport's Conns still move vectors")
			}
			runSpans(t, comms, spanCase{n: n, bufBytes: 1 << 20, maxSpan: 64 << 10, maxSpans: 40, seed: 6})
			runSpans(t, comms, spanCase{n: n, bufBytes: 4 << 10, maxSpan: 300, maxSpans: 12, seed: 7})
		})
	}
}
