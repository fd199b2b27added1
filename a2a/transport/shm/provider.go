package shm

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"fmt"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// Provider is the shared-memory data plane as a transport.Provider: it
// reaches the ranks of this host (equal host identity) that announced the
// same segment layout. Its fields are as in Config; zero values take the
// defaults.
type Provider struct {
	RingBytes      int
	SlotBytes      int
	Dir            string
	ZCopyThreshold int
}

var _ transport.Provider = Provider{}

// Name is "shm".
func (Provider) Name() string { return "shm" }

// mappedCost is the built-in price of a mapped copy (a message from a
// registered buffer, copied from the receiver's mapping of it): the
// descriptor and its acknowledgment cost a few us, the copy runs near one
// core's memcpy (2 ranks, one 4 MiB message each way between processes:
// 23 GB/s per direction, docs/PERFORMANCE.md).
var mappedCost = transport.Cost{Alpha: 3e-6, Beta: 1 / 20e9, Lanes: 1}

// Capabilities: a shared-memory link costs about 1 us per message and moves
// 8 GB/s (process_vm_readv for large messages), a mapped copy from a
// registered buffer mappedCost; its LL slots hold SlotBytes
// (DefaultSlotBytes) and the ranks it links share a host, so they may map
// each other's memory.
func (p Provider) Capabilities() transport.Capabilities {
	return transport.Capabilities{Cost: transport.Cost{Alpha: 1e-6, Beta: 1 / 8e9, Lanes: 1}, MappedCost: mappedCost,
		SlotBytes: transport.SlotSize(p.SlotBytes, DefaultSlotBytes), PackedSlots: true, MapsMemory: true, PeerDescriptors: 1}
}

// Listen prepares nothing yet: segments are made at Connect, when the
// epoch and the local ranks are known. Its address names the segment
// layout and carries a tag of the job's secret (a MAC of the group name: it
// reveals nothing of the secret), so ranks of different versions or of
// different secrets never map each other.
func (p Provider) Listen(_ context.Context, self transport.Self) (transport.Endpoint, error) {
	mac := hmac.New(sha256.New, self.Secret)
	mac.Write([]byte("a2a shm " + self.Group))
	return &endpoint{p: p, self: self, addr: fmt.Appendf(nil, "shm/v%d/%x", segVersion, mac.Sum(nil)[:16])}, nil
}

type endpoint struct {
	p    Provider
	self transport.Self
	addr []byte
}

func (e *endpoint) Address() []byte { return e.addr }

func (e *endpoint) Reaches(self, peer transport.Peer) error {
	switch {
	case len(peer.Address) == 0:
		return fault.New(fault.ErrInvalidArgument, peer.Rank, "shm: rank %d announced no shared memory", peer.Rank)
	case self.Host != peer.Host:
		return fault.New(fault.ErrInvalidArgument, peer.Rank, "shm: rank %d is on another host (%s, this rank %s)", peer.Rank, peer.Host, self.Host)
	case !bytes.Equal(peer.Address, e.addr):
		return fault.New(fault.ErrMismatch, peer.Rank, "shm: rank %d has another segment layout or job secret (%q, this rank %q)", peer.Rank, peer.Address, e.addr)
	}
	return nil
}

func (e *endpoint) Connect(ctx context.Context, g transport.Group, peers []int) (transport.Transport, error) {
	local := append([]int{g.Rank}, peers...)
	t, err := Open(ctx, Config{Group: e.self.Group, Epoch: g.Epoch, Rank: g.Rank, Size: g.Size, Local: local,
		Streams: e.self.Streams, RingBytes: e.p.RingBytes, SlotBytes: e.p.SlotBytes, Dir: e.p.Dir,
		ZCopyThreshold: e.p.ZCopyThreshold, Logger: e.self.Logger})
	if err != nil {
		return nil, err
	}
	return t, nil
}

func (e *endpoint) Close() error { return nil }
