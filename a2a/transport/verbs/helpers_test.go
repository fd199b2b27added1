package verbs

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
	"github.com/a2a-moe/a2a/internal/rdmalab"
	ibv "github.com/a2a-moe/a2a/verbs"
)

// Most tests here need RDMA devices: the lab of scripts/rdma-lab.sh (make
// test-rdma), where rxe0 and rxe1 sit on the two ends of a veth pair. The
// lab sets A2A_RDMA_LAB=1, and there a missing device fails the tests;
// elsewhere they skip, saying so. make test runs make test-rdma where it can
// (root), which runs them for real.
func needLab(t testing.TB) {
	t.Helper()
	if os.Getenv("A2A_RDMA_LAB") != "1" {
		t.Skip("needs RDMA devices: runs in the lab (make test-rdma sets A2A_RDMA_LAB=1)")
	}
}

var testSecret = []byte("a2a-verbs-test-secret-0123456789")

// labProvider is the provider of the tests: both lab devices, RoCE v2 GIDs.
func labProvider() Provider {
	return Provider{IB: &ibv.Config{HCA: "rxe", GIDIndex: -1}}
}

// testSelf is rank's view before the group forms. All ranks share the host
// "lab", so local rank = rank and the ranks alternate between rxe0 and rxe1:
// pairs of ranks of different parity cross the veth pair, the others loop
// back inside one device.
func testSelf(t testing.TB, rank, size, streams int) transport.Self {
	return transport.Self{Group: "verbs-test", Rank: rank, Size: size, Host: "lab", Streams: streams,
		Secret: testSecret, Logger: transporttest.Logger(t)}
}

// listenAll prepares an endpoint per rank with p.
func listenAll(t testing.TB, p Provider, n, streams int) ([]transport.Endpoint, []transport.Peer) {
	t.Helper()
	eps := make([]transport.Endpoint, n)
	peers := make([]transport.Peer, n)
	for r := range n {
		ep, err := p.Listen(context.Background(), testSelf(t, r, n, streams))
		if err != nil {
			for _, e := range eps[:r] {
				e.Close()
			}
			t.Fatalf("Listen rank %d: %v", r, err)
		}
		eps[r] = ep
		peers[r] = transport.Peer{Rank: r, Host: "lab", PID: os.Getpid(), Address: ep.Address()}
	}
	return eps, peers
}

// connectAll connects every endpoint to every other rank concurrently, as
// the ranks of a job do after the rendezvous.
func connectAll(ctx context.Context, eps []transport.Endpoint, peers []transport.Peer) ([]*Transport, []error) {
	n := len(eps)
	ts := make([]*Transport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		others := make([]int, 0, n-1)
		for q := range n {
			if q != r {
				others = append(others, q)
			}
		}
		g := transport.Group{Rank: r, Size: n, Epoch: transporttest.Epoch, Peers: peers}
		wg.Go(func() {
			tr, err := eps[r].Connect(ctx, g, others)
			if err == nil {
				ts[r] = tr.(*Transport)
			}
			errs[r] = err
		})
	}
	wg.Wait()
	return ts, errs
}

// newClusterWith starts n connected transports of provider p, closed at
// cleanup.
func newClusterWith(t testing.TB, p Provider, n, streams int) []*Transport {
	t.Helper()
	needLab(t)
	eps, peers := listenAll(t, p, n, streams)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ts, errs := connectAll(ctx, eps, peers)
	t.Cleanup(func() {
		for _, tr := range ts {
			if tr != nil {
				tr.Close()
			}
		}
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("Connect rank %d: %v", r, err)
		}
	}
	return ts
}

// testChunk is the ring slot of most tests: small, so that frames take many
// chunks and the ring wraps often.
const testChunk = 8 << 10

func newCluster(t testing.TB, n, streams int) []*Transport {
	p := labProvider()
	p.ChunkBytes, p.RingSlots = testChunk, 4
	return newClusterWith(t, p, n, streams)
}

// rdmaResources counts the verbs objects the kernel holds per device
// (`rdma resource show`): what a leak would leave behind.
func rdmaResources(t testing.TB) map[string]map[string]int {
	t.Helper()
	m, err := rdmalab.Resources()
	if err != nil {
		t.Fatal(err)
	}
	return m
}
