package verbs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
	ibv "github.com/a2a-moe/a2a/verbs"
)

func TestMain(m *testing.M) {
	// libibverbs opens what it keeps for the process (its device list,
	// netlink) on first use; do that before taking the baseline.
	if l, err := ibv.Load(); err == nil {
		l.Devices()
	}
	os.ReadFile("/proc/self/stat")
	os.Exit(transporttest.RunLeakChecked(m))
}

// Without the library, or with no device, Listen says why and matches
// ibv.ErrUnavailable, so that auto selection leaves verbs out.
func TestListenUnavailable(t *testing.T) {
	cases := []struct {
		name string
		p    Provider
		want string
	}{
		{"no library", Provider{Library: "libibverbs-a2a-missing.so.1"}, "cannot load"},
		{"no such device", Provider{IB: &ibv.Config{HCA: "=nonexistent0", GIDIndex: -1}}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ep, err := tc.p.Listen(context.Background(), testSelf(t, 0, 2, 2))
			if err == nil {
				ep.Close()
				t.Fatal("Listen succeeded")
			}
			if !errors.Is(err, ibv.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Listen: %v, want ErrUnavailable saying %q", err, tc.want)
			}
		})
	}
	if os.Getenv("A2A_RDMA_LAB") != "1" {
		// No RDMA here (the lab's case is TestExchange): the default provider
		// must not be usable either.
		if ep, err := (Provider{}).Listen(context.Background(), testSelf(t, 0, 2, 2)); err == nil {
			ep.Close()
			t.Log("this machine has RDMA devices outside the lab")
		} else if !errors.Is(err, ibv.ErrUnavailable) {
			t.Fatalf("Listen without devices: %v, want ErrUnavailable", err)
		}
	}
}

func TestGeometry(t *testing.T) {
	for _, tc := range []struct {
		p    Provider
		ok   bool
		want geometry
	}{
		{Provider{}, true, geometry{Size: 4, Streams: 2, ChunkBytes: DefaultChunkBytes, RingSlots: DefaultRingSlots, SlotBytes: DefaultSlotBytes}},
		{Provider{SlotBytes: -1, ChunkBytes: 4096, RingSlots: 1}, true, geometry{Size: 4, Streams: 2, ChunkBytes: 4096, RingSlots: 1}},
		{Provider{ChunkBytes: 100}, false, geometry{}},
		{Provider{RingSlots: 5000}, false, geometry{}},
		{Provider{SlotBytes: 2 << 20}, false, geometry{}},
	} {
		g, err := tc.p.geometry(testSelf(t, 0, 4, 2))
		if tc.ok != (err == nil) || (tc.ok && g != tc.want) {
			t.Errorf("%+v: %+v, %v", tc.p, g, err)
		}
		if !tc.ok && !errors.Is(err, fault.ErrInvalidArgument) {
			t.Errorf("%+v: %v, want ErrInvalidArgument", tc.p, err)
		}
	}
}

func TestAddressRoundTrip(t *testing.T) {
	a := address{geometry: geometry{Size: 3, Streams: 2, ChunkBytes: 1 << 16, RingSlots: 8, SlotBytes: 512}}
	for i := range 2 {
		e := remoteEndpoint{LinkLayer: ibv.LinkEthernet, MTU: ibv.MTU1024, LID: uint16(i), PSN: 0xabcdef,
			RingAddr: 1 << 40, RingKey: 77, WinAddr: 1<<41 + 8, WinKey: 78, QPN: []uint32{1, 2, 3, 4, 5, uint32(6 + i)}}
		e.GID[15] = byte(i + 1)
		a.Endpoints = append(a.Endpoints, e)
	}
	b := a.encode()
	got, err := decodeAddress(1, b)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(*got) != fmt.Sprint(a) {
		t.Fatalf("decoded %+v, want %+v", *got, a)
	}
	for _, bad := range [][]byte{nil, b[:10], b[:len(b)-1], append([]byte{9}, b[1:]...)} {
		var fe *fault.Error
		if _, err := decodeAddress(1, bad); !errors.Is(err, fault.ErrMismatch) || !errors.As(err, &fe) || fe.Rank != 1 {
			t.Errorf("decoding %d bytes: %v, want ErrMismatch naming rank 1", len(bad), err)
		}
	}
}

func TestLocalRanks(t *testing.T) {
	hosts := []string{"a", "b", "a", "a", "b"}
	peers := make([]transport.Peer, len(hosts))
	for r, h := range hosts {
		peers[r] = transport.Peer{Rank: r, Host: h}
	}
	if got := fmt.Sprint(localRanks(peers)); got != "[0 0 1 2 1]" {
		t.Fatalf("local ranks %s", got)
	}
}

// frameSizes cover empty frames, frames up to and past the inline limit, a
// chunk exactly, and frames of many chunks (testChunk is 8 KiB).
var frameSizes = []int{0, 1, 48, maxInline - hdrSize, maxInline - hdrSize + 1, testChunk - hdrSize, testChunk, 64<<10 + 3, 1 << 20}

// TestExchange sends every frame size from every rank to every peer on every
// stream, all at once, and checks every byte and the byte counters.
func TestExchange(t *testing.T) {
	for _, tc := range []struct{ n, streams int }{{2, 1}, {2, 2}, {3, 2}, {4, 2}} {
		t.Run(fmt.Sprintf("ranks%d_streams%d", tc.n, tc.streams), func(t *testing.T) {
			ts := newCluster(t, tc.n, tc.streams)
			transporttest.Exchange(t, ts, frameSizes)
			for r, tr := range ts {
				if dev, want := tr.Device().Device, fmt.Sprintf("rxe%d", r%2); dev != want {
					t.Errorf("rank %d on %s, want %s (local rank modulo devices)", r, dev, want)
				}
			}
		})
	}
}

func TestHeaderMismatch(t *testing.T) {
	needLab(t)
	transporttest.HeaderMismatch(t, func(t testing.TB, n, streams int) []*Transport { return newCluster(t, n, streams) }, false)
}

func TestAnyLenAndWindow(t *testing.T) {
	needLab(t)
	transporttest.AnyLenAndWindow(t, func(t testing.TB, n, streams int) []*Transport { return newCluster(t, n, streams) }, 100<<10, false)
}

// A message larger than the ring (4 chunks of 8 KiB) cannot be taken or
// delivered in one try.
func TestOneOpPerDirection(t *testing.T) {
	transporttest.OneOpPerDirection(t, newCluster(t, 2, 1), transporttest.Pattern(7, 1<<20), false)
}

func TestWakeAndClose(t *testing.T) {
	ts := newCluster(t, 2, 1)
	transporttest.WakeAndClose(t, ts[0])
}

// TestWaitAfterAnotherPoll: a frame's completion that a poll for another
// peer takes (here a Load from rank 2, as the engine polls for every
// pending op in turn) after the caller last looked at the frame's stream
// still ends the next Wait at once: its event, which Wait drains, counts as
// progress. Otherwise the frame would wait out the timeout.
func TestWaitAfterAnotherPoll(t *testing.T) {
	ts := newCluster(t, 3, 1)
	ts[1].Wait(0) // take the events of the hellos: the CQ is armed, nothing pending
	data := transporttest.Pattern(9, 100)
	if err := transporttest.Drive(ts[0], []transporttest.Job{
		transporttest.SendJob(ts[0].Conn(1, 0), transporttest.Hdr(0, 0, 0, 1), data),
	}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	seen := func() uint64 {
		ts[1].mu.Lock()
		defer ts[1].mu.Unlock()
		return ts[1].seen
	}
	var st transport.SlotLoad
	for before, end := seen(), time.Now().Add(5*time.Second); seen() == before; {
		if time.Now().After(end) {
			t.Fatal("the frame's completion did not arrive")
		}
		if _, err := ts[1].Load(2, transport.FirstEpoch, testTag, nil, false, &st); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	if err := ts[1].Wait(waitBound); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > waitBound/2 {
		t.Fatalf("Wait slept %v with a frame waiting whose completion another poll took", took)
	}
	got := make([]byte, len(data))
	if err := transporttest.Drive(ts[1], []transporttest.Job{
		transporttest.RecvJob(ts[1].Conn(0, 0), transporttest.Hdr(0, 0, 0, 1), got),
	}, 10*time.Second); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the frame: %v, equal %v", err, bytes.Equal(got, data))
	}
}

// mapBuffer maps n bytes and records them as an AllocBuffer mapping would
// be, until cleanup, which releases them as FreeBuffer does.
func mapBuffer(t testing.TB, n int) []byte {
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	transport.AddBuffer(mem)
	t.Cleanup(func() {
		transport.RemoveBuffer(mem)
		unix.Munmap(mem)
	})
	return mem
}

// Frames from AllocBuffer memory of at least ZCopyBytes go zero-copy: the
// mapping is registered once, the data arrives intact, and releasing the
// mapping (FreeBuffer) deregisters it. Go heap buffers never are.
func TestZeroCopy(t *testing.T) {
	p := labProvider()
	p.ChunkBytes, p.RingSlots, p.ZCopyBytes = testChunk, 4, 4096
	ts := newClusterWith(t, p, 2, 1)
	src := mapBuffer(t, 4<<20)
	heap := transporttest.Pattern(3, 256<<10)
	copy(src, transporttest.Pattern(2, len(src)))
	dst := make([]byte, 4<<20)
	round := 0
	send := func(data []byte) {
		t.Helper()
		errs := transporttest.DriveAll(ts, [][]transporttest.Job{
			{transporttest.SendJob(ts[0].Conn(1, 0), transporttest.Hdr(0, 0, round, 1), data)},
			{transporttest.RecvJob(ts[1].Conn(0, 0), transporttest.Hdr(0, 0, round, 1), dst[:len(data)])},
		}, 20*time.Second)
		round++
		if err := transporttest.FirstErr(errs); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(dst[:len(data)], data) {
			t.Fatalf("%d bytes: data differs", len(data))
		}
	}
	send(heap)
	if n := len(ts[0].regs); n != 0 {
		t.Fatalf("%d registrations after a Go heap send, want 0", n)
	}
	for _, n := range []int{100, 4096, 3<<20 + 5} {
		send(src[1000 : 1000+n])
	}
	send(src[len(src)-8192:])
	if n := len(ts[0].regs); n != 1 || ts[0].regs[0].size != len(src) {
		t.Fatalf("registrations %+v, want the one mapping", ts[0].regs)
	}
	transport.RemoveBuffer(src) // FreeBuffer's part
	if n := len(ts[0].regs); n != 0 {
		t.Fatalf("%d registrations after the mapping's release, want 0", n)
	}
	send(heap)
}

// A peer that closes its transport says goodbye: the survivor's operations
// fail with ErrPeerLost naming it at once, not after the retries.
func TestPeerClose(t *testing.T) {
	for _, tc := range []struct {
		name string
		dies int
	}{{"receiver closes", 1}, {"sender closes", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newCluster(t, 2, 1)
			data := transporttest.Pattern(9, 1<<20)
			jobs := [][]transporttest.Job{
				{transporttest.SendJob(ts[0].Conn(1, 0), transporttest.Hdr(0, 0, 0, 1), data)},
				{transporttest.RecvJob(ts[1].Conn(0, 0), transporttest.Hdr(0, 0, 0, 1), make([]byte, len(data)))},
			}
			survivor := 1 - tc.dies
			// Only the survivor drives its op: the sender runs out of
			// credits, the receiver waits for more than comes, until the
			// close.
			errc := make(chan error, 1)
			go func() { errc <- transporttest.Drive(ts[survivor], jobs[survivor], 20*time.Second) }()
			time.Sleep(100 * time.Millisecond)
			closed := time.Now()
			if err := ts[tc.dies].Close(); err != nil {
				t.Fatal(err)
			}
			err := <-errc
			var fe *fault.Error
			if !errors.Is(err, fault.ErrPeerLost) || !errors.As(err, &fe) || fe.Rank != tc.dies {
				t.Fatalf("survivor: %v, want ErrPeerLost naming rank %d", err, tc.dies)
			}
			if d := time.Since(closed); d > time.Second {
				t.Fatalf("survivor noticed after %v", d)
			}
		})
	}
}

// A peer whose QP breaks without a goodbye (a killed process's QPs stop
// answering) is ErrPeerLost once the device gives up its retries, within
// about a second (connectOptions; longer on a loaded lab guest).
func TestPeerVanishes(t *testing.T) {
	ts := newCluster(t, 2, 1)
	// Rank 1's QP to rank 0 disappears, as a killed process's do: packets
	// to it are dropped, nothing answers.
	ts[1].conns[0].gone = true
	if err := ts[1].dev.qps[0].Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := transporttest.Drive(ts[0], []transporttest.Job{
		transporttest.SendJob(ts[0].Conn(1, 0), transporttest.Hdr(0, 0, 0, 1), make([]byte, 1000)),
		transporttest.RecvJob(ts[0].Conn(1, 0), transporttest.Hdr(1, 0, 0, 1), make([]byte, 10)),
	}, 10*time.Second)
	var fe *fault.Error
	if !errors.Is(err, fault.ErrPeerLost) || !errors.As(err, &fe) || fe.Rank != 1 {
		t.Fatalf("%v, want ErrPeerLost naming rank 1", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("noticed after %v", d)
	}
	t.Logf("noticed after %v: %v", time.Since(start), err)
}

// A hello carrying another job's MAC (another secret) fails Connect with
// ErrMismatch naming the peer: QPs talk only to the rank of the job they
// were set up for.
func TestHelloOtherSecret(t *testing.T) {
	needLab(t)
	p := labProvider()
	eps := make([]transport.Endpoint, 2)
	peers := make([]transport.Peer, 2)
	for r := range 2 {
		self := testSelf(t, r, 2, 1)
		if r == 1 {
			self.Secret = []byte("another job's secret")
		}
		ep, err := p.Listen(context.Background(), self)
		if err != nil {
			t.Fatal(err)
		}
		eps[r] = ep
		peers[r] = transport.Peer{Rank: r, Host: "lab", Address: ep.Address()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ts, errs := connectAll(ctx, eps, peers)
	for _, tr := range ts {
		if tr != nil {
			tr.Close()
		}
	}
	for r, err := range errs {
		var fe *fault.Error
		if !errors.Is(err, fault.ErrMismatch) || !errors.As(err, &fe) || fe.Rank != 1-r {
			t.Errorf("rank %d: %v, want ErrMismatch naming rank %d", r, err, 1-r)
		}
	}
}

// 100 cycles of Listen, Connect, an exchange and Close on both devices
// leave no verbs object and no descriptor behind.
func TestCloseLeavesNothing(t *testing.T) {
	needLab(t)
	before := rdmaResources(t)
	start := time.Now()
	for i := range 100 {
		ts := newCluster(t, 2, 1)
		if i == 0 {
			during := rdmaResources(t)
			if during["rxe0"]["qp"] <= before["rxe0"]["qp"] || during["rxe1"]["mr"] <= before["rxe1"]["mr"] {
				t.Fatalf("the count does not see the transports: %v, before %v", during, before)
			}
		}
		transporttest.Exchange(t, ts, []int{100, 70 << 10})
		for _, tr := range ts {
			if err := tr.Close(); err != nil {
				t.Fatalf("cycle %d: %v", i, err)
			}
		}
	}
	t.Logf("%v per cycle", time.Since(start)/100)
	after := rdmaResources(t)
	for _, dev := range []string{"rxe0", "rxe1"} {
		for k, v := range before[dev] {
			if after[dev][k] != v {
				t.Errorf("%s %s: %d before, %d after 100 cycles", dev, k, v, after[dev][k])
			}
		}
	}
}

// waitBound is the timeout of a Wait that must return early: a lost wake-up
// sleeps all of it, while a lab guest under load may stall a rank for a
// second or so, so a Wait that took more than half of it failed.
const waitBound = 10 * time.Second
