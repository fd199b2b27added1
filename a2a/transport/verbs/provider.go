package verbs

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
	ibv "github.com/a2a-moe/a2a/verbs"
)

// Defaults of the Provider's sizes.
const (
	// DefaultChunkBytes is a ring slot: a frame travels as RDMA WRITEs of
	// up to this many bytes (the header in the first). Larger chunks mean
	// fewer work requests and completions per frame.
	DefaultChunkBytes = 64 << 10
	// DefaultRingSlots is the chunks one stream may have in flight to a
	// peer (the credits): 512 KiB, one AllToAllV block, per stream.
	DefaultRingSlots = 8
	// DefaultSlotBytes is the LL slot's payload, as shm's.
	DefaultSlotBytes = 512
	// DefaultZCopyBytes is the payload from which a frame of AllocBuffer
	// memory is sent from that memory instead of through a bounce buffer.
	// A zero-copy frame is done only once the device has read it (its
	// writes acknowledged), a bounce-buffer frame once it is copied, so
	// zero-copy pays only where the copy costs more than that wait: on the
	// lab's Soft-RoCE guest, one stream of frames, bounce buffers ran 15-20
	// MB/s from 4 KiB to 256 KiB where zero-copy ran 2-10, and zero-copy
	// 16.4 MB/s at 1 MiB and 4 MiB where bounce buffers ran 10 (make
	// bench-rdma). The AllToAllV frame, 512 KiB, sits at the crossover.
	DefaultZCopyBytes = 512 << 10
)

// Provider is the RDMA verbs data plane as a transport.Provider. It reaches
// the ranks that announced a verbs address on a port of the same link layer
// (RoCE with RoCE, InfiniBand with InfiniBand). Zero fields take the
// defaults.
type Provider struct {
	// IB selects devices, ports and GIDs; nil reads A2A_IB_HCA and
	// A2A_IB_GID_INDEX (ibv.ConfigFromEnv).
	IB *ibv.Config
	// Library is the libibverbs to load (ibv.DefaultLibrary).
	Library string
	// ChunkBytes is a ring slot (DefaultChunkBytes); at least 4 KiB.
	ChunkBytes int
	// RingSlots is the ring slots per stream (DefaultRingSlots), 1-4096.
	RingSlots int
	// SlotBytes is the LL slot payload (DefaultSlotBytes); negative: no
	// LL window, LL messages travel as frames.
	SlotBytes int
	// ZCopyBytes is where zero-copy sends start (DefaultZCopyBytes);
	// negative: never.
	ZCopyBytes int
}

var _ transport.Provider = Provider{}

// Name is "verbs".
func (Provider) Name() string { return "verbs" }

// Capabilities: a verbs link is priced as a 100 Gb/s NIC, 3 us per message
// and 10 GB/s (Soft-RoCE is far slower: measure it with a2ad tune); its LL
// slots hold SlotBytes (DefaultSlotBytes), written by RDMA WRITE.
func (p Provider) Capabilities() transport.Capabilities {
	return transport.Capabilities{Cost: transport.Cost{Alpha: 3e-6, Beta: 1 / 10e9, Lanes: 1}, SlotBytes: transport.SlotSize(p.SlotBytes, DefaultSlotBytes)}
}

func (p Provider) geometry(self transport.Self) (geometry, error) {
	g := geometry{Size: self.Size, Streams: self.Streams, ChunkBytes: p.ChunkBytes, RingSlots: p.RingSlots, SlotBytes: p.SlotBytes}
	if g.ChunkBytes == 0 {
		g.ChunkBytes = DefaultChunkBytes
	}
	if g.RingSlots == 0 {
		g.RingSlots = DefaultRingSlots
	}
	g.SlotBytes = transport.SlotSize(g.SlotBytes, DefaultSlotBytes)
	switch {
	case g.Size < 1 || g.Streams < 1 || g.Streams > 1<<15:
		return g, fault.New(fault.ErrInvalidArgument, -1, "verbs: %d ranks, %d streams", g.Size, g.Streams)
	case g.ChunkBytes < 4096 || g.ChunkBytes > 1<<30:
		return g, fault.New(fault.ErrInvalidArgument, -1, "verbs: chunk of %d bytes: want 4 KiB to 1 GiB", g.ChunkBytes)
	case g.RingSlots < 1 || g.RingSlots > 4096:
		return g, fault.New(fault.ErrInvalidArgument, -1, "verbs: %d ring slots (messages in flight per stream): want 1 to 4096", g.RingSlots)
	case g.SlotBytes > 1<<20:
		return g, fault.New(fault.ErrInvalidArgument, -1, "verbs: small-message mailbox (LL slot) of %d bytes: at most 1 MiB", g.SlotBytes)
	}
	return g, nil
}

// Listen loads libibverbs, selects the ports (A2A_IB_HCA, A2A_IB_GID_INDEX)
// and prepares a QP for every (rank, stream) on each, with the receive
// rings and the LL window registered. A rank learns which port it and each
// peer use only when the group has formed (they spread over a host's ports
// by local rank), so every port announces its own. It fails with an error
// matching ibv.ErrUnavailable, saying why, where there is no library, no
// device or no usable port, and with ErrResource wrapping ibv.ErrMemlock
// where RLIMIT_MEMLOCK forbids the registrations.
func (p Provider) Listen(ctx context.Context, self transport.Self) (transport.Endpoint, error) {
	g, err := p.geometry(self)
	if err != nil {
		return nil, err
	}
	name := p.Library
	if name == "" {
		name = ibv.DefaultLibrary
	}
	lib, err := ibv.LoadLibrary(name)
	if err != nil {
		return nil, err
	}
	cfg := ibv.Config{GIDIndex: -1}
	if p.IB != nil {
		cfg = *p.IB
	} else if cfg, err = ibv.ConfigFromEnv(); err != nil {
		return nil, fault.Wrap(fault.ErrInvalidArgument, self.Rank, err, "verbs")
	}
	eps, err := lib.Endpoints(cfg)
	if err != nil {
		return nil, err
	}
	if err := ibv.CheckMemlock(uint64(len(eps)) * memlockNeed(g)); err != nil {
		return nil, fault.Wrap(fault.ErrResource, self.Rank, err, "verbs: rank %d, %d ranks x %d streams on %d ports", self.Rank, g.Size, g.Streams, len(eps))
	}
	e := &endpoint{p: p, self: self, geo: g}
	for _, ep := range eps {
		if err := ctx.Err(); err != nil {
			e.Close()
			return nil, err
		}
		d, err := openDevice(lib, ep, g)
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("verbs: preparing %v: %w", ep, err)
		}
		e.devs = append(e.devs, d)
	}
	a := address{geometry: g}
	for _, d := range e.devs {
		re := remoteEndpoint{LinkLayer: d.ep.LinkLayer, MTU: d.ep.MTU, LID: d.ep.LID, GID: d.ep.GID, PSN: d.psn,
			RingAddr: d.rings.mr.Addr(), RingKey: d.rings.mr.RKey(), QPN: make([]uint32, len(d.qps))}
		if d.window.mr != nil {
			re.WinAddr, re.WinKey = d.window.mr.Addr(), d.window.mr.RKey()
		}
		for i, qp := range d.qps {
			re.QPN[i] = qp.QPN()
		}
		a.Endpoints = append(a.Endpoints, re)
	}
	e.addr = a.encode()
	return e, nil
}

type endpoint struct {
	p    Provider
	self transport.Self
	geo  geometry
	devs []*device
	addr []byte
}

func (e *endpoint) Address() []byte { return e.addr }

// Reaches decodes peer's address and checks that its geometry is this
// rank's and that some port of it has a link layer of one of this rank's.
func (e *endpoint) Reaches(_, peer transport.Peer) error {
	if len(peer.Address) == 0 {
		return fault.New(fault.ErrInvalidArgument, peer.Rank, "verbs: rank %d announced no verbs address", peer.Rank)
	}
	a, err := decodeAddress(peer.Rank, peer.Address)
	if err != nil {
		return err
	}
	if a.geometry != e.geo {
		return fault.New(fault.ErrMismatch, peer.Rank, "verbs: rank %d has rings %+v, this rank %+v", peer.Rank, a.geometry, e.geo)
	}
	for _, re := range a.Endpoints {
		for _, d := range e.devs {
			if re.LinkLayer == d.ep.LinkLayer {
				return nil
			}
		}
	}
	return fault.New(fault.ErrInvalidArgument, peer.Rank, "verbs: rank %d's ports have another link layer than this rank's", peer.Rank)
}

// localRanks numbers every rank among the ranks of its host, in rank order.
func localRanks(peers []transport.Peer) []int {
	seen := map[string]int{}
	out := make([]int, len(peers))
	for r, p := range peers {
		out[r] = seen[p.Host]
		seen[p.Host]++
	}
	return out
}

// Connect picks this rank's port (its local rank modulo its ports, so a
// host's ranks spread over its devices) and each peer's the same way,
// connects one QP per (peer, stream) INIT→RTR→RTS, releases every other
// port and QP, and exchanges a hello on every QP: a MAC under the job's
// secret of (group, epoch, ranks, stream), so Connect returns once every
// peer's QPs are up and are the ones this job set up for this pair.
func (e *endpoint) Connect(ctx context.Context, g transport.Group, peers []int) (tr transport.Transport, err error) {
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	if g.Size != e.geo.Size || g.Rank < 0 || g.Rank >= g.Size {
		return nil, fault.New(fault.ErrInvalidArgument, g.Rank, "verbs: group of %d ranks (rank %d), endpoint prepared for %d", g.Size, g.Rank, e.geo.Size)
	}
	local := localRanks(g.Peers)
	me := e.devs[local[g.Rank]%len(e.devs)]
	S := e.geo.Streams
	want := make([]bool, len(me.qps))
	remotes := make([]remoteEndpoint, g.Size)
	for _, q := range peers {
		a, err := decodeAddress(q, g.Peers[q].Address)
		if err != nil {
			return nil, err
		}
		if a.geometry != e.geo {
			return nil, fault.New(fault.ErrMismatch, q, "verbs: rank %d has rings %+v, this rank %+v", q, a.geometry, e.geo)
		}
		remotes[q] = a.Endpoints[local[q]%len(a.Endpoints)]
		if remotes[q].LinkLayer != me.ep.LinkLayer {
			return nil, fault.New(fault.ErrInvalidArgument, q, "verbs: rank %d uses a %v port, rank %d %v", q, remotes[q].LinkLayer, g.Rank, me.ep.LinkLayer)
		}
		for s := range S {
			want[q*S+s] = true
		}
	}
	// The peers' QPs first: a peer whose hello this rank's QPs are not up
	// for yet has it retried only after an ACK timeout. Releasing the
	// rest comes after.
	for _, q := range peers {
		for s := range S {
			if err := me.qps[q*S+s].Connect(me.ep, me.psn, remoteAddr(remotes[q], g.Rank, s, S), connectOptions); err != nil {
				return nil, fault.Wrap(fault.ErrPeerLost, q, err, "verbs: connecting stream %d to rank %d", s, q)
			}
		}
	}
	t, err := newTransport(e, me, g, peers, remotes)
	if err != nil {
		return nil, err
	}
	for i, d := range e.devs {
		if d == me {
			e.devs[i] = nil // the transport owns it now
		}
	}
	if err := t.hello(ctx, e.self.Group, e.self.Secret, g.Epoch); err != nil {
		t.Close()
		return nil, err
	}
	if err := e.Close(); err != nil {
		t.Close()
		return nil, err
	}
	if err := me.dropQPs(func(i int) bool { return want[i] }); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// remoteAddr is what this rank's QP for stream s needs of rank's peer whose
// port is re.
func remoteAddr(re remoteEndpoint, rank, s, streams int) ibv.Addr {
	return ibv.Addr{QPN: re.QPN[rank*streams+s], PSN: re.PSN, GID: re.GID, LID: re.LID, MTU: re.MTU}
}

// Close releases every prepared port.
func (e *endpoint) Close() error {
	var errs []error
	for i, d := range e.devs {
		if d != nil {
			errs = append(errs, d.close())
			e.devs[i] = nil
		}
	}
	return errors.Join(errs...)
}

// Describe says what the provider finds here, one line per usable port, or
// why verbs is unavailable: for logs and a2ad.
func (p Provider) Describe() string {
	name := p.Library
	if name == "" {
		name = ibv.DefaultLibrary
	}
	lib, err := ibv.LoadLibrary(name)
	if err != nil {
		return err.Error()
	}
	cfg := ibv.Config{GIDIndex: -1}
	if p.IB != nil {
		cfg = *p.IB
	} else if cfg, err = ibv.ConfigFromEnv(); err != nil {
		return err.Error()
	}
	eps, err := lib.Endpoints(cfg)
	if err != nil {
		return err.Error()
	}
	lines := make([]string, len(eps))
	for i, ep := range eps {
		lines[i] = ep.String()
	}
	return strings.Join(lines, "\n")
}
