package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

// testSlot is the slot size of the LL tests that need more than the default.
const testSlot = 8 << 10

// llSizes are the message sizes of the LL tests: empty, partial and whole
// words, several lines, a full slot.
var llSizes = []int{0, 1, 3, 4, 5, 7, 8, 63, 64, 65, 1000, testSlot}

// withSlot sets the slot size of a test cluster.
func withSlot(n int) func(*Config) { return func(c *Config) { c.SlotBytes = n } }

// fill returns n bytes of 0xEE, so that a test sees which bytes a load wrote.
func fill(n int) []byte { return bytes.Repeat([]byte{0xEE}, n) }

// loadOnce loads what peer stored for epoch in one call, which must finish.
func loadOnce(t *testing.T, tr *Transport, peer int, epoch uint32, dst []byte, anyLen bool) int {
	t.Helper()
	var st transport.SlotLoad
	done, err := tr.Load(peer, epoch, testTag, dst, anyLen, &st)
	if err != nil || !done {
		t.Fatalf("rank %d loading epoch %d from rank %d: done %v, err %v (state %+v)", tr.rank, epoch, peer, done, err, st)
	}
	return st.Len
}

// TestLLRoundTrip has every rank of three store a message to each other rank
// and load theirs, for every size and both parities: each pair's slots are its
// own, and every byte arrives.
func TestLLRoundTrip(t *testing.T) {
	const n = 3
	if got := newCluster(t, 2, 1, ringOnly)[0].SlotBytes(1); got != DefaultSlotBytes {
		t.Fatalf("default SlotBytes(1) = %d, want %d", got, DefaultSlotBytes)
	}
	ts := newCluster(t, n, 1, ringOnly, withSlot(testSlot))
	if got := ts[0].SlotBytes(2); got != testSlot {
		t.Fatalf("SlotBytes(2) = %d, want %d", got, testSlot)
	}
	seed := func(e uint32, src, dst int) uint64 { return uint64(e)<<8 | uint64(src)<<4 | uint64(dst) }
	var wantBytes uint64 // rank 0 to rank 1
	epoch := transport.FirstEpoch
	for _, size := range llSizes {
		for range 2 { // both parities
			for src := range n {
				for dst := range n {
					if src != dst {
						if err := ts[src].Store(dst, epoch, testTag, pattern(seed(epoch, src, dst), size)); err != nil {
							t.Fatalf("size %d epoch %d: rank %d storing to %d: %v", size, epoch, src, dst, err)
						}
					}
				}
			}
			wantBytes += uint64(8 * (1 + (size+7)/8)) // packed: the payload in whole words
			for dst := range n {
				for src := range n {
					if src == dst {
						continue
					}
					got := fill(size)
					loadOnce(t, ts[dst], src, epoch, got, false)
					if !bytes.Equal(got, pattern(seed(epoch, src, dst), size)) {
						t.Fatalf("size %d epoch %d: rank %d got a corrupted message from rank %d", size, epoch, dst, src)
					}
				}
			}
			epoch = transport.NextEpoch(epoch)
		}
	}
	if s, r := ts[0].Stats().BytesSent[1], ts[1].Stats().BytesReceived[0]; s != wantBytes || r != wantBytes {
		t.Errorf("stats: rank 0 sent %d bytes to rank 1, rank 1 received %d; want %d", s, r, wantBytes)
	}
}

// TestLLEpochWrap runs epochs across the wrap of the epoch counter with
// messages of changing sizes: a load of an epoch not stored yet takes nothing
// from the message two epochs older in the same slot, and a shorter message
// does not pick up the older one's leftover words.
func TestLLEpochWrap(t *testing.T) {
	ts := newCluster(t, 2, 1, ringOnly, withSlot(testSlot))
	sizes := []int{1000, 5, 64, 3, 0, 777, 8, 1, 1000, 2}
	epoch := ^uint32(0) - 3
	for k, size := range sizes {
		msg := pattern(uint64(epoch), size)
		// Not stored yet: the slot holds the message of epoch-2.
		for _, anyLen := range []bool{false, true} {
			dst := fill(size)
			if anyLen {
				dst = fill(2000)
			}
			var st transport.SlotLoad
			done, err := ts[1].Load(0, epoch, testTag, dst, anyLen, &st)
			if done || err != nil || st != (transport.SlotLoad{}) || !bytes.Equal(dst, fill(len(dst))) {
				t.Fatalf("epoch %d before the store (anyLen %v): done %v err %v state %+v, dst touched %v",
					epoch, anyLen, done, err, st, !bytes.Equal(dst, fill(len(dst))))
			}
		}
		if err := ts[0].Store(1, epoch, testTag, msg); err != nil {
			t.Fatal(err)
		}
		// Into a larger buffer: the length bounds what is written.
		dst := fill(2000)
		if n := loadOnce(t, ts[1], 0, epoch, dst, true); n != size {
			t.Fatalf("epoch %d: length %d, want %d", epoch, n, size)
		}
		if !bytes.Equal(dst[:size], msg) || !bytes.Equal(dst[size:], fill(2000-size)) {
			t.Fatalf("epoch %d (message %d, %d bytes): wrong bytes", epoch, k, size)
		}
		next := transport.NextEpoch(epoch)
		if next%2 == epoch%2 || next < transport.FirstEpoch {
			t.Fatalf("NextEpoch(%d) = %d", epoch, next)
		}
		epoch = next
	}
	if epoch != transport.FirstEpoch+uint32(len(sizes))-4 {
		t.Fatalf("ended at epoch %d: the test did not cross the wrap", epoch)
	}
}

// TestLLTornWrite writes a packed message into a slot by hand, a word at a
// time, in the orders a reader could see it being written, and checks that
// Load takes nothing until the length word of its epoch is there, not even
// payload words that look like LL words of that epoch, then the whole
// message at once; and that Stored follows the length word alone.
func TestLLTornWrite(t *testing.T) {
	const size = 30 // 4 words, the last one 6/8 full
	for _, tc := range []struct {
		name     string
		anyLen   bool
		disguise bool // the payload words carry the epoch in their high half
	}{
		{"exact length", false, false},
		{"any length", true, false},
		{"payload that looks like the word form", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newCluster(t, 2, 1, ringOnly)
			old := pattern(1, 60)
			const e0 = transport.FirstEpoch + 5
			if err := ts[0].Store(1, e0, testTag, old); err != nil {
				t.Fatal(err)
			}
			loadOnce(t, ts[1], 0, e0, make([]byte, len(old)), false)
			e := e0 + 2 // the slot of e0, which still holds old
			msg := pattern(2, size)
			if tc.disguise {
				for j := 0; j+8 <= size; j += 8 {
					binary.LittleEndian.PutUint32(msg[j+4:], e)
				}
			}
			slot := ts[1].ll[0].rx[e&1]
			dstLen := size
			if tc.anyLen {
				dstLen = 100
			}
			dst := fill(dstLen)
			var st transport.SlotLoad
			var b [8]byte
			for j := range transport.PackedWords(size) { // the payload, in words, last to first
				j = transport.PackedWords(size) - 1 - j
				clear(b[:])
				copy(b[:], msg[8*j:])
				slot[1+j] = binary.LittleEndian.Uint64(b[:])
				done, err := ts[1].Load(0, e, testTag, dst, tc.anyLen, &st)
				if done || err != nil || st.Known || !bytes.Equal(dst, fill(dstLen)) {
					t.Fatalf("payload word %d written: done %v err %v state %+v, dst touched %v; want nothing taken", j, done, err, st, !bytes.Equal(dst, fill(dstLen)))
				}
				if ts[1].Stored(0, e) {
					t.Fatalf("payload word %d written: Stored reports the message before its length word", j)
				}
			}
			slot[0] = uint64(size) | testTag<<transport.SlotLenBits | uint64(e)<<32
			if !ts[1].Stored(0, e) {
				t.Fatal("length word written: Stored does not report it")
			}
			done, err := ts[1].Load(0, e, testTag, dst, tc.anyLen, &st)
			want := fill(dstLen)
			copy(want, msg)
			if !done || err != nil || st.Len != size || !bytes.Equal(dst, want) {
				t.Fatalf("length word written: done %v err %v state %+v, dst %x; want the message %x", done, err, st, dst, want)
			}
		})
	}
}

// TestLLErrors checks the refusals of Store and Load.
func TestLLErrors(t *testing.T) {
	is := func(t *testing.T, what string, err, kind error, rank int) {
		t.Helper()
		var fe *fault.Error
		if !errors.Is(err, kind) || !errors.As(err, &fe) || fe.Rank != rank {
			t.Errorf("%s: %v, want %v naming rank %d", what, err, kind, rank)
		}
	}
	e := transport.FirstEpoch
	t.Run("arguments", func(t *testing.T) {
		ts := newCluster(t, 2, 1, ringOnly, withSlot(100))
		for _, peer := range []int{-1, 0, 2} {
			if n := ts[0].SlotBytes(peer); n != 0 {
				t.Errorf("SlotBytes(%d) = %d, want 0", peer, n)
			}
			is(t, fmt.Sprintf("Store to rank %d", peer), ts[0].Store(peer, e, testTag, nil), fault.ErrInvalidArgument, peer)
			_, err := ts[0].Load(peer, e, testTag, nil, false, new(transport.SlotLoad))
			is(t, fmt.Sprintf("Load from rank %d", peer), err, fault.ErrInvalidArgument, peer)
		}
		if n := ts[0].SlotBytes(1); n != 100 {
			t.Errorf("SlotBytes(1) = %d, want 100", n)
		}
		is(t, "Store of 101 bytes", ts[0].Store(1, e, testTag, make([]byte, 101)), fault.ErrInvalidArgument, 1)
		is(t, "Store at epoch 1", ts[0].Store(1, 1, testTag, nil), fault.ErrInvalidArgument, 1)
		_, err := ts[1].Load(0, e, testTag, make([]byte, 101), false, new(transport.SlotLoad))
		is(t, "Load of 101 bytes", err, fault.ErrInvalidArgument, 0)
		_, err = ts[1].Load(0, 0, testTag, nil, false, new(transport.SlotLoad))
		is(t, "Load at epoch 0", err, fault.ErrInvalidArgument, 0)
		// The refusals stored nothing: a full slot still works.
		msg := pattern(3, 100)
		if err := ts[0].Store(1, e, testTag, msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 1000) // a larger buffer is fine with anyLen
		if n := loadOnce(t, ts[1], 0, e, got, true); n != 100 || !bytes.Equal(got[:n], msg) {
			t.Fatalf("got %d bytes", n)
		}
	})
	t.Run("length", func(t *testing.T) {
		ts := newCluster(t, 2, 1, ringOnly)
		if err := ts[0].Store(1, e, testTag, pattern(4, 10)); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			dst    int
			anyLen bool
			ok     bool
		}{{12, false, false}, {8, false, false}, {10, false, true}, {12, true, true}, {10, true, true}, {8, true, false}} {
			var st transport.SlotLoad
			done, err := ts[1].Load(0, e, testTag, make([]byte, tc.dst), tc.anyLen, &st)
			what := fmt.Sprintf("10 bytes into %d (anyLen %v)", tc.dst, tc.anyLen)
			if tc.ok {
				if !done || err != nil || st.Len != 10 {
					t.Errorf("%s: done %v, err %v, length %d", what, done, err, st.Len)
				}
			} else {
				is(t, what, err, fault.ErrMismatch, 0)
			}
		}
	})
	t.Run("disabled", func(t *testing.T) {
		ts := newCluster(t, 2, 1, ringOnly, withSlot(-1))
		if n := ts[0].SlotBytes(1); n != 0 {
			t.Errorf("SlotBytes(1) = %d without LL slots", n)
		}
		is(t, "Store without LL slots", ts[0].Store(1, e, testTag, nil), fault.ErrInvalidArgument, 1)
		exchangeOnce(t, ts) // the rings still work
	})
	t.Run("peer closed", func(t *testing.T) {
		ts := newCluster(t, 2, 1, ringOnly)
		msg := pattern(5, 300)
		if err := ts[0].Store(1, e, testTag, msg); err != nil {
			t.Fatal(err)
		}
		var st transport.SlotLoad
		if done, err := ts[0].Load(1, e, testTag, make([]byte, 8), false, &st); done || err != nil {
			t.Fatalf("load of a message never stored: done %v, err %v", done, err)
		}
		ts[0].Close()
		// Stored before the close: still delivered.
		got := make([]byte, len(msg))
		loadOnce(t, ts[1], 0, e, got, false)
		if !bytes.Equal(got, msg) {
			t.Fatal("message stored before the close corrupted")
		}
		_, err := ts[1].Load(0, e+1, testTag, make([]byte, 8), false, new(transport.SlotLoad))
		is(t, "Load from a closed peer", err, fault.ErrPeerLost, 0)
		is(t, "Store to a closed peer", ts[1].Store(0, e+1, testTag, nil), fault.ErrPeerLost, 0)
		_, err = ts[0].Load(1, e, testTag, make([]byte, 8), false, &st)
		if !errors.Is(err, fault.ErrClosed) {
			t.Errorf("Load on a closed transport: %v, want ErrClosed", err)
		}
		if err := ts[0].Store(1, e, testTag, nil); !errors.Is(err, fault.ErrClosed) {
			t.Errorf("Store on a closed transport: %v, want ErrClosed", err)
		}
	})
	t.Run("frame while waiting", func(t *testing.T) {
		ts := newCluster(t, 2, 2, ringOnly)
		var st transport.SlotLoad
		dst := make([]byte, 16)
		if done, err := ts[1].Load(0, e, testTag, dst, false, &st); done || err != nil {
			t.Fatalf("load before anything arrived: done %v, err %v", done, err)
		}
		frame := []byte("another operation")
		s := sendJob(ts[0].Conn(1, 0), hdr(0, 0, 0, 1), frame)
		if done, err := s.C.TrySend(s.Send); !done || err != nil {
			t.Fatalf("send: done %v, err %v", done, err)
		}
		_, err := ts[1].Load(0, e, testTag, dst, false, &st)
		is(t, "Load with a frame waiting", err, fault.ErrMismatch, 0)
		// The frame itself is intact.
		r := recvJob(ts[1].Conn(0, 0), hdr(0, 0, 0, 1), make([]byte, len(frame)))
		if err := drive(ts[1], []job{r}, 5*time.Second); err != nil || !bytes.Equal(r.Recv.Dst, frame) {
			t.Fatalf("receiving the frame: %v", err)
		}
		// A message stored before a frame is complete when the frame shows.
		msg := pattern(6, 16)
		if err := ts[0].Store(1, e+1, testTag, msg); err != nil {
			t.Fatal(err)
		}
		s = sendJob(ts[0].Conn(1, 0), hdr(0, 0, 0, 2), frame)
		if done, err := s.C.TrySend(s.Send); !done || err != nil {
			t.Fatalf("send: done %v, err %v", done, err)
		}
		loadOnce(t, ts[1], 0, e+1, dst, false)
		if !bytes.Equal(dst, msg) {
			t.Fatal("message corrupted")
		}
	})
}

// TestLLSlotLimit checks that a slot size over the limit is refused (ranks
// disagreeing on the slot size: TestOpenMismatch).
func TestLLSlotLimit(t *testing.T) {
	group := testGroup(t)
	tr, err := Open(context.Background(), Config{Group: group, Size: 2, SlotBytes: maxSlotBytes + 1})
	if tr != nil {
		tr.Close()
	}
	if !errors.Is(err, fault.ErrInvalidArgument) {
		t.Errorf("slot of %d bytes: %v, want ErrInvalidArgument", maxSlotBytes+1, err)
	}
	checkNoFiles(t, DefaultDir, group)
}

// TestLLWaitWakes parks a rank in Wait on a load that cannot finish and
// checks that a Store of the awaited message ends the park promptly: one
// made while it sleeps (the doorbell) and one made between the load and the
// park (the watch).
func TestLLWaitWakes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before bool // store before the park
		close  bool // the peer closes instead
	}{{"store while parked", false, false}, {"store before the park", true, false}, {"peer closes", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newCluster(t, 2, 1, ringOnly)
			const e = transport.FirstEpoch + 1
			msg := pattern(7, 500)
			dst := make([]byte, len(msg))
			var st transport.SlotLoad
			if done, err := ts[1].Load(0, e, testTag, dst, false, &st); done || err != nil {
				t.Fatalf("load: done %v, err %v", done, err)
			}
			act := func() {
				if tc.close {
					ts[0].Close()
				} else if err := ts[0].Store(1, e, testTag, msg); err != nil {
					t.Error(err)
				}
			}
			if tc.before {
				act()
			}
			woke := make(chan time.Duration, 1)
			start := time.Now()
			go func() {
				ts[1].Wait(time.Second)
				woke <- time.Since(start)
			}()
			const delay = 20 * time.Millisecond
			if !tc.before {
				time.Sleep(delay)
				act()
			}
			took := <-woke
			if took > 500*time.Millisecond {
				t.Fatalf("Wait returned after %v", took)
			}
			if !tc.before && took < delay*3/4 {
				t.Fatalf("Wait returned after %v, before rank 0 acted", took)
			}
			t.Logf("Wait returned after %v", took)
			done, err := ts[1].Load(0, e, testTag, dst, false, &st)
			if tc.close {
				if !errors.Is(err, fault.ErrPeerLost) {
					t.Fatalf("load after the peer closed: %v, want ErrPeerLost", err)
				}
			} else if !done || err != nil || !bytes.Equal(dst, msg) {
				t.Fatalf("load after the wake-up: done %v err %v", done, err)
			}
			if w := ts[1].ll[0].watch.Load(); w != 0 {
				t.Errorf("watch %#x left after the load finished", w)
			}
			// Nothing to wait for now: Wait sleeps its timeout.
			start = time.Now()
			if ts[1].Wait(5 * time.Millisecond); time.Since(start) < 5*time.Millisecond {
				t.Errorf("idle Wait returned after %v", time.Since(start))
			}
		})
	}
}

// TestLLKilledPeer kills a helper process that never stores while this rank
// loads from it: the load fails with ErrPeerLost naming it, promptly.
func TestLLKilledPeer(t *testing.T) {
	group := testGroup(t)
	h := startHelper(t, "idle", group, DefaultDir, ringOnly, false, false)
	tr := openRank0(t, group, DefaultDir, ringOnly)
	h.expect(t, "ready")
	errc := make(chan error, 1)
	go func() {
		var st transport.SlotLoad
		_, err := loadLL(tr, 1, transport.FirstEpoch, make([]byte, 8), &st, 10*time.Second)
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	h.killExpectLost(t, errc)
}

// loadLL loads exactly len(dst) bytes until done, idling like the engine
// (spin, yield, park); it returns how often it parked. It gives up with
// ErrTimeout after timeout without progress.
func loadLL(tr *Transport, peer int, epoch uint32, dst []byte, st *transport.SlotLoad, timeout time.Duration) (parks int, err error) {
	return loadLLAny(tr, peer, epoch, dst, false, st, timeout)
}

// loadLLAny is loadLL with a choice of anyLen.
func loadLLAny(tr *Transport, peer int, epoch uint32, dst []byte, anyLen bool, st *transport.SlotLoad, timeout time.Duration) (parks int, err error) {
	var d transporttest.Idler
	for {
		words := st.Words
		done, err := tr.Load(peer, epoch, testTag, dst, anyLen, st)
		if done || err != nil {
			return d.Parks, err
		}
		if st.Words != words {
			d.Moved()
			continue
		}
		if d.Idle(tr) > timeout {
			return d.Parks, fault.New(fault.ErrTimeout, peer, "LL load from rank %d: no message", peer)
		}
	}
}

// TestLLZeroAllocs checks that a warmed-up Store and Load allocate nothing.
func TestLLZeroAllocs(t *testing.T) {
	ts := newCluster(t, 2, 1, ringOnly, withSlot(testSlot))
	msg, dst := pattern(8, 1000), make([]byte, 1000)
	e := transport.FirstEpoch
	var st transport.SlotLoad
	one := func() {
		if err := ts[0].Store(1, e, testTag, msg); err != nil {
			panic(err)
		}
		st = transport.SlotLoad{}
		if done, err := ts[1].Load(0, e, testTag, dst, false, &st); !done || err != nil {
			panic(fmt.Sprint(done, err))
		}
		e = transport.NextEpoch(e)
	}
	one()
	if allocs := testing.AllocsPerRun(200, one); allocs != 0 {
		t.Fatalf("%v allocations per Store+Load, want 0", allocs)
	}
	if !bytes.Equal(dst, msg) {
		t.Fatal("payload corrupted")
	}
}

// TestLLConcurrent has two ranks exchange LL messages of changing sizes on
// their own goroutines for many epochs, so that loads meet stores in
// progress: every message arrives whole, and none is taken from an older
// epoch.
func TestLLConcurrent(t *testing.T) {
	ts := newCluster(t, 2, 1, ringOnly, withSlot(4096))
	const epochs = 3000
	size := func(i int) int { return (i * 2654435761) % 4097 }
	errs := make([]error, 2)
	done := make(chan struct{})
	for r := range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			in := make([]byte, 4096)
			e := ^uint32(0) - 100 // crosses the wrap
			for i := range epochs {
				if err := ts[r].Store(1-r, e, testTag, pattern(uint64(i<<1|r), size(i))); err != nil {
					errs[r] = err
					return
				}
				var st transport.SlotLoad
				dst := in[:size(i)]
				anyLen := i%3 == 0
				if anyLen {
					dst = in
				}
				if _, err := loadLLAny(ts[r], 1-r, e, dst, anyLen, &st, 5*time.Second); err != nil {
					errs[r] = fmt.Errorf("epoch %d (message %d): %w", e, i, err)
					return
				}
				if st.Len != size(i) || !bytes.Equal(in[:st.Len], pattern(uint64(i<<1|(1-r)), size(i))) {
					errs[r] = fmt.Errorf("epoch %d (message %d): %d bytes, want %d, or corrupted", e, i, st.Len, size(i))
					return
				}
				e = transport.NextEpoch(e)
			}
		}()
	}
	<-done
	<-done
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// benchSlot is the slot size of the LL benchmarks: every size they run fits.
const benchSlot = 16 << 10

// llBenchSizes are the message sizes of the LL benchmarks.
var llBenchSizes = []int{8, 64, 256, 512, 1 << 10, 2 << 10, 4 << 10, 8 << 10, 16 << 10}

// BenchmarkLLExchange measures two in-process ranks exchanging one message
// each way, as an LL message (Store, then Load until done) or as a frame
// (TrySend/TryRecv with the default settings: ring, CMA from
// DefaultZCopyThreshold), with the engine's idle policy. It reports the
// median exchange time (p50-us): the data behind DefaultSlotBytes.
func BenchmarkLLExchange(b *testing.B) {
	for _, size := range llBenchSizes {
		b.Run(fmt.Sprintf("ll/%dB", size), func(b *testing.B) { benchLLExchange(b, size) })
		b.Run(fmt.Sprintf("frame/%dB", size), func(b *testing.B) { benchExchange(b, size, 0, 0) })
	}
}

// BenchmarkLLExchangeProcs is BenchmarkLLExchange with rank 1 in another
// process, as in a real job.
func BenchmarkLLExchangeProcs(b *testing.B) {
	for _, size := range llBenchSizes {
		b.Run(fmt.Sprintf("ll/%dB", size), func(b *testing.B) { benchLLExchangeProcs(b, size) })
		b.Run(fmt.Sprintf("frame/%dB", size), func(b *testing.B) { benchExchangeProcs(b, size, 0, DefaultRingBytes) })
	}
}

func benchLLExchange(b *testing.B, size int) {
	ts := newCluster(b, 2, 1, 0, withSlot(benchSlot))
	var epochs [2]uint32
	epochs[0], epochs[1] = transport.FirstEpoch, transport.FirstEpoch
	benchPair(b, size, func(r, _ int, out, in []byte) (int, error) {
		e := epochs[r]
		epochs[r] = transport.NextEpoch(e)
		if err := ts[r].Store(1-r, e, testTag, out); err != nil {
			return 0, err
		}
		var st transport.SlotLoad
		return loadLL(ts[r], 1-r, e, in, &st, 10*time.Second)
	})
}

func benchLLExchangeProcs(b *testing.B, size int) {
	group := testGroup(b)
	h := startHelper(b, "llbench", group, DefaultDir, 0, false, false,
		fmt.Sprintf("%s=%d:%d:%d", helperBench, size, b.N, DefaultRingBytes), fmt.Sprintf("%s=%d", helperSlot, benchSlot))
	tr := openRank0(b, group, DefaultDir, 0, func(c *Config) { c.RingBytes = DefaultRingBytes; c.SlotBytes = benchSlot })
	out, in := pattern(1, size), make([]byte, size)
	lat := make([]time.Duration, b.N)
	parks := 0
	e := transport.FirstEpoch
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if err := tr.Store(1, e, testTag, out); err != nil {
			b.Fatal(err)
		}
		var st transport.SlotLoad
		p, err := loadLL(tr, 1, e, in, &st, 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		parks += p
		lat[i] = time.Since(start)
		e = transport.NextEpoch(e)
	}
	b.StopTimer()
	h.expect(b, "done")
	reportExchange(b, lat, float64(parks))
}

// BenchmarkLLStoreLoad measures the processor cost of an LL message: one
// goroutine stores it and loads it on the other side, so no cache line
// crosses cores (compare BenchmarkSendRecv8B).
func BenchmarkLLStoreLoad(b *testing.B) {
	for _, size := range []int{8, 1 << 10, 8 << 10} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			ts := newCluster(b, 2, 1, ringOnly, withSlot(benchSlot))
			out, in := pattern(1, size), make([]byte, size)
			e := transport.FirstEpoch
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				if err := ts[0].Store(1, e, testTag, out); err != nil {
					b.Fatal(err)
				}
				var st transport.SlotLoad
				if done, err := ts[1].Load(0, e, testTag, in, false, &st); !done || err != nil {
					b.Fatal(done, err)
				}
				e = transport.NextEpoch(e)
			}
		})
	}
}

// testTag is the operation tag the tests' LL messages carry.
const testTag = 0x5a

// TestLLTagMismatch: a load expecting another operation's tag fails with
// ErrMismatch instead of taking the message.
func TestLLTagMismatch(t *testing.T) {
	ts := newCluster(t, 2, 1, ringOnly)
	e := transport.FirstEpoch
	if err := ts[0].Store(1, e, 3, pattern(1, 16)); err != nil {
		t.Fatal(err)
	}
	var st transport.SlotLoad
	_, err := ts[1].Load(0, e, 4, make([]byte, 16), false, &st)
	if !errors.Is(err, fault.ErrMismatch) {
		t.Fatalf("load with another tag: %v, want ErrMismatch", err)
	}
	if err := ts[0].Store(1, e, 1<<transport.SlotTagBits, nil); !errors.Is(err, fault.ErrInvalidArgument) {
		t.Fatalf("oversized tag: %v, want ErrInvalidArgument", err)
	}
}

// TestLLBatch covers a batch (BeginBatch/EndBatch): its Stores and Loads move
// the message and count in Stats like single calls, the wake-up a Store owes
// a parked peer is delivered when the batch waits or ends, and Close waits
// for the batch to end, after which no batch begins.
func TestLLBatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		wake func(tr *Transport) // what rank 0 does, batch still open, to wake rank 1
		ends bool                // the wake-up comes from EndBatch
	}{
		{"batch waits", func(tr *Transport) { tr.Wait(0) }, false},
		{"batch ends", func(tr *Transport) { tr.EndBatch() }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newCluster(t, 2, 1, ringOnly)
			const e = transport.FirstEpoch
			msg := pattern(3, 100)
			dst := make([]byte, len(msg))
			var st transport.SlotLoad
			if done, err := ts[1].Load(0, e, testTag, dst, false, &st); done || err != nil {
				t.Fatalf("load: done %v, err %v", done, err)
			}
			woke := make(chan struct{})
			go func() {
				ts[1].Wait(10 * time.Second)
				close(woke)
			}()
			time.Sleep(20 * time.Millisecond) // rank 1 parks
			if !ts[0].BeginBatch() {
				t.Fatal("BeginBatch on an open transport: false")
			}
			inBatch := true
			defer func() {
				if inBatch { // a failed check: let the cleanup's Close finish
					ts[0].EndBatch()
				}
			}()
			if err := ts[0].Store(1, e, testTag, msg); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			tc.wake(ts[0])
			inBatch = !tc.ends
			select {
			case <-woke:
				t.Logf("rank 1 woke %v after the wake-up", time.Since(start))
			case <-time.After(5 * time.Second):
				t.Fatal("the parked rank was not woken")
			}
			if done, err := ts[1].Load(0, e, testTag, dst, false, &st); !done || err != nil || !bytes.Equal(dst, msg) {
				t.Fatalf("load after the wake-up: done %v, err %v", done, err)
			}
			want := uint64(8 * (1 + transport.PackedWords(len(msg))))
			if !tc.ends {
				closed := make(chan struct{})
				go func() {
					ts[0].Close()
					close(closed)
				}()
				select {
				case <-closed:
					t.Fatal("Close returned during a batch")
				case <-time.After(50 * time.Millisecond):
				}
				if got := ts[0].Stats().BytesSent[1]; got != want {
					t.Errorf("Stats during the batch: %d bytes sent to rank 1, want %d", got, want)
				}
				ts[0].EndBatch()
				inBatch = false
				<-closed
				if ts[0].BeginBatch() {
					t.Error("BeginBatch after Close: true")
				}
			}
			if got := ts[1].Stats().BytesReceived[0]; got != want {
				t.Errorf("rank 1 received %d bytes from rank 0, want %d", got, want)
			}
		})
	}
}

// TestLLStored: Stored sees a peer's message for its epoch only, without
// taking it, and a Wait after a Stored that found nothing returns once the
// peer has stored, even before the peer rings.
func TestLLStored(t *testing.T) {
	ts := newCluster(t, 3, 1, ringOnly)
	const e = transport.FirstEpoch + 2
	if ts[1].Stored(0, e) {
		t.Fatal("Stored before any store")
	}
	if err := ts[0].Store(1, e-2, testTag, pattern(1, 40)); err != nil { // same parity, older epoch
		t.Fatal(err)
	}
	if err := ts[0].Store(1, e+1, testTag, pattern(2, 40)); err != nil { // the other parity
		t.Fatal(err)
	}
	if ts[1].Stored(0, e) {
		t.Fatal("Stored reports a message of another epoch")
	}
	// A store in a batch rings no bell until the batch waits or ends: only
	// the watch that the fruitless Stored left ends this Wait early.
	msg := pattern(3, 300)
	if !ts[0].BeginBatch() {
		t.Fatal("BeginBatch on an open transport")
	}
	if err := ts[0].Store(1, e, testTag, msg); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ts[1].Wait(time.Second)
	took := time.Since(start)
	ts[0].EndBatch()
	if took > 500*time.Millisecond {
		t.Fatalf("Wait after a fruitless Stored returned after %v, though the peer stored", took)
	}
	if !ts[1].Stored(0, e) {
		t.Fatal("Stored misses the message")
	}
	if ts[1].Stored(2, e) || ts[2].Stored(0, e) {
		t.Fatal("Stored reports a message another pair's slot holds")
	}
	dst := make([]byte, len(msg))
	if n := loadOnce(t, ts[1], 0, e, dst, false); n != len(msg) || !bytes.Equal(dst, msg) {
		t.Fatalf("load after Stored: %d bytes, equal %v", n, bytes.Equal(dst, msg))
	}
	ts[1].Close()
	if ts[1].Stored(0, e) {
		t.Error("Stored after Close")
	}
}
