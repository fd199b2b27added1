package shm

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

// sharedBuf returns n bytes of a shareable buffer (as a2a.AllocBuffer makes
// them), holding pattern seed, freed at cleanup.
func sharedBuf(t testing.TB, n int, seed uint64) []byte {
	t.Helper()
	b, err := transport.AllocShared(n, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	copy(b, pattern(seed, n))
	t.Cleanup(func() {
		if err := transport.FreeShared(b); err != nil {
			t.Error(err)
		}
	})
	return b
}

// mappedCount is how many messages rank r's streams took from mappings,
// and how many mappings they made.
func mappedCount(tr *Transport) (msgs, maps uint64) {
	for _, c := range tr.list {
		msgs += c.rmapped
		maps += c.rmaps.maps
	}
	return msgs, maps
}

// TestMappedExchange sends from shareable buffers, every rank to every peer
// on every stream at once, into contiguous and scattered receives, with
// mapping on and off, and checks every byte, that the mapped mode took the
// mappings (one per sending buffer and stream, however many messages) and
// that the other mode did not.
func TestMappedExchange(t *testing.T) {
	sizes := []int{1, 8 << 10, 100<<10 + 7, 1 << 20, 3<<20 + 5}
	for _, tc := range []struct {
		n, streams, mapCache int
	}{
		{2, 1, 0}, {2, 2, 0}, {3, 1, 0}, {4, 1, 0}, {2, 1, -1}, {3, 2, -1},
	} {
		mapped := tc.mapCache >= 0
		t.Run(fmt.Sprintf("ranks%d_streams%d_mapped%v", tc.n, tc.streams, mapped), func(t *testing.T) {
			ts := newCluster(t, tc.n, tc.streams, cmaAll, func(c *Config) { c.MapCache = tc.mapCache })
			rng := rand.New(rand.NewPCG(uint64(tc.n), uint64(tc.streams)))
			total := 0
			for _, s := range sizes {
				total += s + 64
			}
			src := make([][]byte, tc.n)
			for r := range src {
				src[r] = sharedBuf(t, total, uint64(r))
			}
			jobs := make([][]job, tc.n)
			type check struct{ want, got []byte }
			var checks []check
			for r := range tc.n {
				for p := range tc.n {
					if p == r {
						continue
					}
					for s := range tc.streams {
						off := 0
						for k, size := range sizes {
							off += rng.IntN(64) // unaligned offsets in the buffer
							msg := src[r][off : off+size]
							off += size
							h := hdr(r, s, k, 1)
							jobs[r] = append(jobs[r], sendJob(ts[r].Conn(p, s), h, msg))
							got := bytes.Repeat([]byte{0xEE}, size)
							rv := new(transport.RecvOp)
							if k%2 == 0 {
								rv.ResetVec(h, cutVec(rng, got, 100<<10))
							} else {
								rv.Reset(h, got, false)
							}
							jobs[p] = append(jobs[p], job{C: ts[p].Conn(r, s), Recv: rv})
							checks = append(checks, check{msg, got})
						}
					}
				}
			}
			if err := firstErr(driveAll(ts, jobs, 30*time.Second)); err != nil {
				t.Fatal(err)
			}
			for i, c := range checks {
				if !bytes.Equal(c.got, c.want) {
					t.Fatalf("message %d (%d bytes) differs", i, len(c.want))
				}
			}
			for r, tr := range ts {
				msgs, maps := mappedCount(tr)
				want := uint64((tc.n - 1) * tc.streams)
				if !mapped {
					if msgs != 0 || maps != 0 {
						t.Errorf("rank %d: %d messages from %d mappings with mapping off", r, msgs, maps)
					}
					continue
				}
				if msgs != want*uint64(len(sizes)) || maps != want {
					t.Errorf("rank %d: %d messages from %d mappings, want %d from %d", r, msgs, maps, want*uint64(len(sizes)), want)
				}
			}
		})
	}
}

// exchangeFrom sends msg from rank 0 to rank 1 and checks it arrived.
func exchangeFrom(t *testing.T, ts []*Transport, round int, msg []byte) {
	t.Helper()
	got := make([]byte, len(msg))
	h := hdr(0, 0, round, 1)
	err := firstErr(driveAll(ts, [][]job{
		{sendJob(ts[0].Conn(1, 0), h, msg)},
		{recvJob(ts[1].Conn(0, 0), h, got)},
	}, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("round %d: %d bytes differ", round, len(msg))
	}
}

// TestMappedGeneration frees a buffer a peer has mapped and sends from a
// new one, usually behind the same memfd number: the peer tells them apart
// by generation, unmaps the old one and reads the new bytes.
func TestMappedGeneration(t *testing.T) {
	ts := newCluster(t, 2, 1, cmaAll)
	c := ts[1].conns[0]
	for round := range 4 {
		b, err := transport.AllocShared(64<<10, pageSize)
		if err != nil {
			t.Fatal(err)
		}
		copy(b, pattern(uint64(round), len(b)))
		exchangeFrom(t, ts, round, b[100:])
		if len(c.rmaps.ents) != 1 || c.rmaps.maps != uint64(round+1) {
			t.Fatalf("round %d: %d mappings cached, %d made; want 1 and %d", round, len(c.rmaps.ents), c.rmaps.maps, round+1)
		}
		if err := transport.FreeShared(b); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMappedEviction: a stream keeps at most MapCache mappings, unmapping
// the least recently used, and still delivers every byte.
func TestMappedEviction(t *testing.T) {
	ts := newCluster(t, 2, 1, cmaAll, func(c *Config) { c.MapCache = 2 })
	bufs := [][]byte{sharedBuf(t, 32<<10, 1), sharedBuf(t, 32<<10, 2), sharedBuf(t, 32<<10, 3)}
	c := ts[1].conns[0]
	// 0 1 0 2: the third buffer evicts 1 (0 was used since), so 0 is still
	// mapped; then 1 comes back and evicts 0.
	for round, i := range []int{0, 1, 0, 2, 0, 1} {
		exchangeFrom(t, ts, round, bufs[i])
		if len(c.rmaps.ents) > 2 {
			t.Fatalf("round %d: %d mappings cached, want at most 2", round, len(c.rmaps.ents))
		}
	}
	if c.rmaps.maps != 4 {
		t.Errorf("%d mappings made, want 4 (0, 1, 2, then 1 again)", c.rmaps.maps)
	}
}

// TestMappedInFlight: while a send from a buffer waits for its receiver,
// the buffer can be neither freed nor deregistered (ErrInvalidArgument),
// so a peer never reads freed memory; once the receive is done, both work.
func TestMappedInFlight(t *testing.T) {
	ts := newCluster(t, 2, 1, cmaAll)
	b, err := transport.AllocShared(1<<20, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	base, gen, err := transport.Pin(addrOf(b), len(b))
	if err != nil {
		t.Fatal(err)
	}
	s := sendJob(ts[0].Conn(1, 0), hdr(0, 0, 0, 1), b)
	if done, err := s.C.TrySend(s.Send); done || err != nil {
		t.Fatalf("TrySend: %v %v, want it waiting for the receiver", done, err)
	}
	if err := transport.FreeShared(b); !errors.Is(err, fault.ErrInvalidArgument) {
		t.Fatalf("FreeShared in flight: %v, want ErrInvalidArgument", err)
	}
	if err := transport.Unpin(base, gen); !errors.Is(err, fault.ErrInvalidArgument) {
		t.Fatalf("Unpin in flight: %v, want ErrInvalidArgument", err)
	}
	got := make([]byte, len(b))
	if err := firstErr(driveAll(ts, [][]job{{s}, {recvJob(ts[1].Conn(0, 0), hdr(0, 0, 0, 1), got)}}, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := transport.FreeShared(b); !errors.Is(err, fault.ErrInvalidArgument) {
		t.Fatalf("FreeShared while registered: %v, want ErrInvalidArgument", err)
	}
	if err := transport.Unpin(base, gen); err != nil {
		t.Fatal(err)
	}
	if err := transport.Unpin(base, gen); !errors.Is(err, fault.ErrInvalidArgument) {
		t.Fatalf("second Unpin: %v, want ErrInvalidArgument", err)
	}
	if err := transport.FreeShared(b); err != nil {
		t.Fatal(err)
	}
}

// TestMappedForged: a descriptor that names anything but the shareable
// buffer of the generation it claims, of the size it claims, is refused
// with ErrMismatch before anything is mapped.
func TestMappedForged(t *testing.T) {
	ts := newCluster(t, 2, 1, cmaAll)
	b := sharedBuf(t, 64<<10, 1)
	sh, ok := transport.AcquireShared(addrOf(b), len(b))
	if !ok {
		t.Fatal("a shareable buffer is not found")
	}
	defer sh.Release()
	other, err := unix.MemfdCreate("not-a2a", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(other)
	unix.Ftruncate(other, int64(len(b)))
	c := ts[1].conns[0]
	for _, tc := range []struct {
		name string
		sh   transport.Shared
		plen int
	}{
		{"other memfd", transport.Shared{FD: other, Gen: sh.Gen, Size: sh.Size}, 100},
		{"other generation", transport.Shared{FD: sh.FD, Gen: sh.Gen + 1000, Size: sh.Size}, 100},
		{"larger than the file", transport.Shared{FD: sh.FD, Gen: sh.Gen, Size: 2 * sh.Size}, 100},
		{"past the end", transport.Shared{FD: sh.FD, Gen: sh.Gen, Size: sh.Size, Off: sh.Size - 10}, 100},
		{"no such descriptor", transport.Shared{FD: 1 << 20, Gen: sh.Gen, Size: sh.Size}, 100},
	} {
		var d [descMapSize]byte
		putMapDesc(d[:], 0, &tc.sh, 1)
		if mem, err := c.mapSource(d[:], tc.plen); !errors.Is(err, fault.ErrMismatch) || mem != nil {
			t.Errorf("%s: %d bytes, %v; want ErrMismatch", tc.name, len(mem), err)
		}
	}
	if len(c.rmaps.ents) != 0 {
		t.Errorf("%d mappings made of forged descriptors", len(c.rmaps.ents))
	}
}

// sharedMappings counts this process's mappings of shareable buffers'
// memfds (its own and peers').
func sharedMappings() int {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte("/memfd:"+transport.SharedPrefix))
}

// TestMappedKilledPeer kills a helper rank while a buffer of one rank is
// mapped by the other, in the middle of a message from it: the survivor
// fails with ErrPeerLost naming the helper, unmaps the dead rank's buffer at
// once (the sender's side) or can free its own buffer (the receiver's
// side), and Close leaves no mapping and no file (TestMain checks both).
func TestMappedKilledPeer(t *testing.T) {
	for _, combine := range []bool{false, true} {
		name := "sender killed"
		if combine {
			name += ", reduced in place"
		}
		t.Run(name, func(t *testing.T) { testMappedSenderKilled(t, combine) })
	}
	t.Run("receiver killed", testMappedReceiverKilled)
}

// testMappedSenderKilled: the sender dies while this rank copies (or, with
// combine, reduces in place) from its buffer.
func testMappedSenderKilled(t *testing.T, combine bool) {
	group := testGroup(t)
	h := startHelper(t, "mapped-send-stall", group, DefaultDir, cmaAll, false, false)
	tr := openRank0(t, group, DefaultDir, cmaAll)
	c := tr.conns[1]
	first := make([]byte, 1<<20)
	if err := drive(tr, []job{recvJob(c, hdr(1, 0, 0, 1), first)}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, pattern(4, helperSize)[:1<<20]) || c.rmapped != 1 || len(c.rmaps.ents) != 1 {
		t.Fatalf("first message: equal %v, %d mapped, %d mappings", bytes.Equal(first, pattern(4, helperSize)[:1<<20]), c.rmapped, len(c.rmaps.ents))
	}
	h.expect(t, "ready")
	r := recvJob(c, hdr(1, 0, 1, 1), make([]byte, helperSize))
	x := &xorCombiner{dst: make([]byte, helperSize)}
	if combine {
		r.Recv.Combine = x
	}
	for r.Recv.Progress <= hdrSize { // the descriptor, and a first copy
		if _, err := c.TryRecv(r.Recv); err != nil {
			t.Fatal(err)
		}
	}
	h.kill(t)
	// As Wait does at its next park: the pidfd says the sender died.
	if !transporttest.WaitFor(5*time.Second, func() bool { tr.checkPeers(); return tr.dead[1].Load() }) {
		t.Fatal("the death is not noticed")
	}
	err := drive(tr, []job{r}, 5*time.Second)
	var fe *fault.Error
	if !errors.Is(err, fault.ErrPeerLost) || !errors.As(err, &fe) || fe.Rank != 1 {
		t.Fatalf("got %v, want ErrPeerLost naming rank 1", err)
	}
	if n := len(c.rmaps.ents); n != 0 {
		t.Errorf("%d mappings of the dead rank's buffers kept", n)
	}
	if combine && (!r.Recv.Combined || len(x.pieces) == 0) {
		t.Errorf("the reduction read nothing in place before the death (%d pieces)", len(x.pieces))
	}
	tr.Close()
	checkNoFiles(t, DefaultDir, group)
}

// testMappedReceiverKilled: the receiver dies while it maps this rank's
// buffer; the send fails and the buffer can be freed.
func testMappedReceiverKilled(t *testing.T) {
	group := testGroup(t)
	h := startHelper(t, "mapped-recv-stall", group, DefaultDir, cmaAll, false, false)
	tr := openRank0(t, group, DefaultDir, cmaAll)
	b, err := transport.AllocShared(helperSize, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- drive(tr, []job{sendJob(tr.Conn(1, 0), hdr(0, 0, 0, 1), b)}, 10*time.Second) }()
	if lines := h.expect(t, "ready"); len(lines) != 1 || lines[0] != "mapped=1" {
		t.Errorf("helper said %q, want mapped=1", lines)
	}
	h.killExpectLost(t, errc)
	if err := transport.FreeShared(b); err != nil {
		t.Fatalf("FreeShared after the failed send: %v", err)
	}
	tr.Close()
	checkNoFiles(t, DefaultDir, group)
}

// TestMappedFreed: a rank that frees a shareable buffer lists it in its
// segment, and a peer that mapped it unmaps it at its next mapped message,
// so the memory goes; after more frees than the list holds, the peer drops
// every mapping.
func TestMappedFreed(t *testing.T) {
	ts := newCluster(t, 2, 1, cmaAll)
	c := ts[1].conns[0]
	alloc := func(seed uint64) []byte {
		b, err := transport.AllocShared(16<<10, pageSize)
		if err != nil {
			t.Fatal(err)
		}
		copy(b, pattern(seed, len(b)))
		return b
	}
	keep := sharedBuf(t, 16<<10, 1)
	a := alloc(2)
	exchangeFrom(t, ts, 0, keep)
	exchangeFrom(t, ts, 1, a)
	if len(c.rmaps.ents) != 2 {
		t.Fatalf("%d mappings, want 2", len(c.rmaps.ents))
	}
	if err := transport.FreeShared(a); err != nil {
		t.Fatal(err)
	}
	exchangeFrom(t, ts, 2, keep)
	if len(c.rmaps.ents) != 1 || c.rmaps.ents[0].gen == 0 || c.rmaps.maps != 2 {
		t.Fatalf("after the free: %d mappings, %d made; want keep's alone, 2 made", len(c.rmaps.ents), c.rmaps.maps)
	}
	for i := range freedSlots + 1 {
		if err := transport.FreeShared(alloc(uint64(i))); err != nil {
			t.Fatal(err)
		}
	}
	exchangeFrom(t, ts, 3, keep)
	if len(c.rmaps.ents) != 1 || c.rmaps.maps != 3 {
		t.Fatalf("after %d frees: %d mappings, %d made; want keep's, mapped again", freedSlots+1, len(c.rmaps.ents), c.rmaps.maps)
	}
}

// TestMappedSoak allocates and frees shareable buffers at random between
// messages from them, both ways, with a small cache: every byte arrives,
// no stream ever holds more than MapCache mappings, and a freed buffer's
// mapping is gone by the next message (TestMain then checks that none is
// left at all).
func TestMappedSoak(t *testing.T) {
	const cache = 3
	ts := newCluster(t, 2, 1, cmaAll, func(c *Config) { c.MapCache = cache })
	rng := rand.New(rand.NewPCG(25, 2026))
	live := [2][][]byte{}
	defer func() {
		for _, bufs := range live {
			for _, b := range bufs {
				transport.FreeShared(b)
			}
		}
	}()
	var freed [2][]uint64 // generations each rank freed, not yet checked
	for round := range 300 {
		var jobs [2][]job
		var wants, gots [][]byte
		var sent [2]bool
		for r := range 2 {
			switch {
			case len(live[r]) == 0 || (len(live[r]) < 6 && rng.IntN(3) == 0):
				b, err := transport.AllocShared(8<<10+rng.IntN(300<<10), pageSize)
				if err != nil {
					t.Fatal(err)
				}
				copy(b, pattern(uint64(round), len(b)))
				live[r] = append(live[r], b)
			case rng.IntN(4) == 0:
				i := rng.IntN(len(live[r]))
				sh, _ := transport.AcquireShared(addrOf(live[r][i]), 1)
				sh.Release()
				freed[r] = append(freed[r], sh.Gen)
				if err := transport.FreeShared(live[r][i]); err != nil {
					t.Fatal(err)
				}
				live[r] = append(live[r][:i], live[r][i+1:]...)
				continue
			}
			b := live[r][rng.IntN(len(live[r]))]
			off := rng.IntN(len(b) - 8<<10)
			msg := b[off : off+8<<10+rng.IntN(len(b)-off-8<<10+1)]
			h := hdr(r, 0, round, 1)
			got := make([]byte, len(msg))
			jobs[r] = append(jobs[r], sendJob(ts[r].Conn(1-r, 0), h, msg))
			jobs[1-r] = append(jobs[1-r], recvJob(ts[1-r].Conn(r, 0), h, got))
			wants, gots = append(wants, msg), append(gots, got)
			sent[r] = true
		}
		if err := firstErr(driveAll(ts, jobs[:], 10*time.Second)); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for i := range wants {
			if !bytes.Equal(gots[i], wants[i]) {
				t.Fatalf("round %d: message %d differs", round, i)
			}
		}
		for r, tr := range ts {
			m := &tr.conns[1-r].rmaps
			if n := len(m.ents); n > cache {
				t.Fatalf("round %d: rank %d holds %d mappings, cache %d", round, r, n, cache)
			}
			if !sent[1-r] {
				continue
			}
			// A mapped message from the peer came after its frees.
			for _, gen := range freed[1-r] {
				for _, e := range m.ents {
					if e.gen == gen {
						t.Fatalf("round %d: rank %d still maps rank %d's freed buffer %d", round, r, 1-r, gen)
					}
				}
			}
			freed[1-r] = freed[1-r][:0]
		}
	}
}

// xorCombiner xors the pieces a transport hands it into dst and records
// their offsets and lengths.
type xorCombiner struct {
	dst    []byte
	id     int
	pieces [][2]int
}

func (x *xorCombiner) Combine(id, off int, src []byte) error {
	if id != x.id {
		return fmt.Errorf("combine id %d, want %d", id, x.id)
	}
	x.pieces = append(x.pieces, [2]int{off, len(src)})
	for i, b := range src {
		x.dst[off+i] ^= b
	}
	return nil
}

// TestMappedCombine: a receive that offers a Combiner gets a mapped
// message's bytes through it, read in place, in order, in pieces that cut
// no element (multiples of transport.CombinePiece but the last), with Dst
// untouched; a message that is not mapped (heap, by CMA) lands in Dst and
// leaves Combined false.
func TestMappedCombine(t *testing.T) {
	ts := newCluster(t, 2, 1, cmaAll)
	const size = 3<<20 + 8 // pieces of cmaCallBytes, and a short last one
	for round, mapped := range []bool{true, false} {
		msg := pattern(uint64(round+7), size)
		if mapped {
			msg = sharedBuf(t, size, uint64(round+7))
		}
		acc := pattern(99, size)
		want := bytes.Clone(acc)
		for i := range want {
			want[i] ^= msg[i]
		}
		landing := bytes.Repeat([]byte{0xEE}, size)
		h := hdr(0, 0, round, 1)
		rv := new(transport.RecvOp)
		rv.Reset(h, landing, false)
		x := &xorCombiner{dst: acc, id: 5}
		rv.Combine, rv.CombineID = x, 5
		err := firstErr(driveAll(ts, [][]job{
			{sendJob(ts[0].Conn(1, 0), h, msg)},
			{{C: ts[1].Conn(0, 0), Recv: rv}},
		}, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if !mapped {
			if rv.Combined || len(x.pieces) != 0 || !bytes.Equal(landing, msg) {
				t.Fatalf("heap message: combined %v, %d pieces, landed right %v", rv.Combined, len(x.pieces), bytes.Equal(landing, msg))
			}
			continue
		}
		if !rv.Combined || !bytes.Equal(acc, want) || !bytes.Equal(landing, bytes.Repeat([]byte{0xEE}, size)) {
			t.Fatalf("mapped message: combined %v, reduced right %v, landing untouched %v", rv.Combined, bytes.Equal(acc, want), bytes.Equal(landing, bytes.Repeat([]byte{0xEE}, size)))
		}
		off := 0
		for i, p := range x.pieces {
			if p[0] != off || (i < len(x.pieces)-1 && p[1]%transport.CombinePiece != 0) {
				t.Fatalf("pieces %v: not in order or cutting elements", x.pieces)
			}
			off += p[1]
		}
		if off != size || len(x.pieces) < 2 {
			t.Fatalf("pieces %v cover %d of %d bytes", x.pieces, off, size)
		}
	}
}
