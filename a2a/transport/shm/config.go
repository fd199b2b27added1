// Package shm is the shared-memory data plane of a2a for ranks on one host.
//
// Layout: every local rank creates its own segment, a file in Config.Dir
// (/dev/shm) named after the group, epoch and its world rank, holding the
// rings it receives on (one single-producer single-consumer ring per local
// source and stream) and its doorbell (a futex word). It then maps the segment
// of every other local rank, whose rings it sends on. The owner of a ring
// reads it and its source writes it, so every word of a ring has one writer:
// the sender publishes fragments with stamps, the receiver frees space by
// advancing head, both with sync/atomic on the mapped memory.
//
// Frames: the ring carries the same frames as TCP, the 48-byte
// transport.Header followed by the payload, in fragments: a cache-line
// aligned stamp word, then up to chunkBytes of the frame. The sender writes a
// fragment, then stores its stamp; the receiver polls the stamp of the
// fragment it expects, so a small message costs the receiver one cache miss
// (stamp, header and payload share a line) and a few plain copies and atomic
// stores on either side, no syscall. A header always travels whole in its
// frame's first fragment. A payload larger than the ring streams through it:
// the receiver copies one fragment out while the sender copies the next one
// in, and the receiver frees each fragment's space as it finishes it.
//
// Large messages (ZCopy): a message of at least Config.ZCopyThreshold bytes
// travels as a descriptor (the address of the sender's buffer) in the ring.
// The receiver copies the payload straight from the sender's memory into its
// destination with process_vm_readv (cross-memory attach, CMA), a single copy,
// and acknowledges it in the ring's control block; the sender's op completes on
// the acknowledgment, since its buffer must stay untouched until then. Whether
// CMA works is decided per source at Open: the receiver reads the source's
// segment header through process_vm_readv (this fails under a restrictive
// Yama ptrace scope, seccomp filters, or across user namespaces). A failure at
// run time with EPERM or ENOSYS (the kernel's policy changed, or the probe was
// not conclusive) makes the receiver refuse the descriptor; the sender then
// streams the payload through the ring, and the receiver turns CMA off for the
// rest of the transport's life.
//
// The descriptor names memory of the sender's op: an op abandoned in flight
// (the engine failed) must not have its buffer reused before the transport is
// closed, or a receiver may copy the new contents. Close marks the segment
// closed first, and a receiver that sees the mark after its copy fails with
// fault.ErrPeerLost instead of delivering the bytes. In-process ranks (tests)
// use CMA on their own process, which works the same way.
//
// Mapped copies (mapped.go): a large message from a shareable buffer
// (a2a.AllocBuffer memory, a sealed memfd) travels as a recMap descriptor,
// which adds the memfd's number, generation and size and the offset of the
// bytes to the CMA descriptor. The receiver takes the memfd once with
// pidfd_getfd(2), under the same ptrace check as process_vm_readv, checks
// its name, size and seals, maps it read-only, and copies from the mapping
// with Go's copy until the sender frees the buffer or Config.MapCache
// mappings push it out; the acknowledgment is CMA's. When the kernel refuses
// pidfd_getfd, the receiver reads the same bytes by CMA.
//
// LL window (transport.Slots): after the rings, a segment holds two slots
// (epoch parities 0 and 1) per local source, each a length word and
// ceil(SlotBytes/4) data words of 8 bytes, starting on a cache-line pair. Like
// the rings, the owner reads them and their source writes them. A word is 4
// payload bytes (little endian) in its low half and the LL epoch in its high
// half; the length word carries the payload length. Store writes the data
// words with plain 8-byte stores (atomic on amd64) and the length word last
// with a release store; in a batch (BeginBatch) nothing waits for the peer's
// line to arrive, and a parked peer is woken when the batch waits or ends.
// Load takes, with atomic
// loads, the words that carry its epoch, so a message needs no stamp, no ring
// head and no acknowledgment, and the receiver's wait is one cache miss on a
// line the sender just wrote. No word is ever cleared (see transport.Slots).
//
// Waiting: the engine spins and yields; Transport.Wait is the park, a futex
// wait on the rank's doorbell. A rank publishing data, freeing ring space or
// acknowledging a descriptor bumps the peer's doorbell and wakes it, but only
// when the peer announced that it sleeps, so the busy path makes no syscalls.
// A peer's Close wakes it too; a peer killed outright is noticed when the
// park ends (the engine parks for at most 10 ms at a time). With more ranks
// than CPUs, every rank publishes the CPU it polls on in its segment, and
// Rebalance moves a rank off a CPU that holds two more ranks than another.
//
// Cleanup: segment files never outlive Open. Mappings of peers' buffers go
// when the peer frees the buffer (it lists the generation in its segment),
// when the peer is lost, and at Close; a memfd is never a file in Dir. Every rank marks itself attached
// in each peer's segment once it mapped it, and a rank unlinks its own file as
// soon as all local peers are attached, before Open returns; the mappings stay
// valid, so a rank killed afterwards leaves nothing in Config.Dir. A rank
// killed during Open leaves its file behind: the next Open of the same group
// removes segments of other epochs whose creator is gone (the creator's pid
// and start time are in the header), a rank reopening its own name replaces a
// stale file, and Sweep removes every stale a2a segment of a directory.
//
// All local ranks must run under one user (segments are mode 0600) and in one
// pid namespace (headers name processes by pid, and CMA and pidfd_getfd need
// it too). A rank maps no memory of a peer it could not read by CMA.
//
// Peer loss: a peer that closes its transport sets a flag in its segment and
// wakes its peers; one that dies is noticed through a pidfd, polled by Wait
// and by a stream that made no progress for a while. Either way the streams to
// it fail with fault.ErrPeerLost once they cannot progress; bytes the peer
// published before it went are still delivered.
package shm

import (
	"log/slog"
	"math"
	"slices"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// Defaults applied by Open to zero Config fields.
const (
	DefaultDir = "/dev/shm"
	// DefaultRingBytes is the data capacity of one ring. Measured with 2
	// processes exchanging 1 MiB through the ring (BenchmarkExchangeProcs,
	// p50): 16 KiB rings take 277 us, 64 KiB 152 us, 256 KiB 142 us, 1 MiB
	// 148 us. From 64 KiB on, copy-in and copy-out pipeline fully; 256 KiB
	// lets a sender run further ahead of a receiver that is not scheduled
	// (more ranks than cores) at little cost, since the memory a ring
	// touches is what its messages touch.
	DefaultRingBytes = 256 << 10
	// DefaultZCopyThreshold is the message size from which CMA replaces the
	// ring when the kernel allows it. Measured with 2 processes exchanging
	// a message each way (BenchmarkExchangeProcs, p50, ring vs CMA): 4 KiB
	// 1.20 vs 1.25 us, 8 KiB 1.76 vs 1.34 us, 16 KiB 3.0 vs 1.6 us, 64 KiB
	// 7.8 vs 3.6 us, 1 MiB 140 vs 57 us. Below the crossover the syscall and
	// the acknowledgment round trip cost more than the second copy.
	DefaultZCopyThreshold = 8 << 10
	// DefaultZCopyVecSlice is the default ZCopyVecSlice. process_vm_readv
	// pins the sender's memory iovec by iovec: 512 KiB in 2 KiB rows read at
	// 4-4.5 GB/s, in one iovec or 64 KiB ones at 7-13 GB/s (in-process
	// microbenchmark on the 2-core EPYC VM), so rows of MoE size are
	// cheaper as two ring copies.
	DefaultZCopyVecSlice = 64 << 10
	// DefaultSlotBytes is the payload capacity of one LL slot, so the
	// largest message that may travel by LL (a2a.DefaultLLBytes is the
	// same). In the word form (4 payload bytes per 8-byte store) LL and
	// frames crossed at ~512 B (BenchmarkLLExchangeProcs, p50: 512 B 0.59
	// vs 0.57 us, 4 KiB 3.9 vs 1.15). The packed form copies the payload as
	// it is and is ahead of a frame to 4 KiB (measured under load, in the
	// VM's fast and slow modes: 1 KiB 0.16-0.23 vs 0.36-0.49 us, 2 KiB
	// 0.25-1.27 vs 0.49-2.1, 4 KiB 0.50-2.8 vs 0.77-3.5), and so is an
	// AllToAllV of LL blocks against pairwise or fullmesh frames at 2, 4 and
	// 8 ranks (a2ad bench, docs/PERFORMANCE.md). Larger blocks from
	// registered buffers go by mapped copies from 8 KiB (ZCopyThreshold).
	DefaultSlotBytes = 4096
	// DefaultMapCache is the default MapCache: a collective sends from a
	// send buffer and a few scratch buffers, and an MoE layer's buffers
	// are a handful per stream, so 16 mappings keep them all mapped.
	DefaultMapCache = 16
)

// Limits.
const (
	maxStreams   = math.MaxUint16 + 1 // the frame header's stream field is a u16
	maxLocal     = 512                // attached flags fit the header page, before offFreed
	minRingBytes = pageSize
	maxRingBytes = 1 << 30
	maxSegBytes  = 1 << 40
	maxSlotBytes = 1 << 20
)

// Config configures one rank's shared-memory transport. Group, Epoch, Size,
// Local, Streams, RingBytes and SlotBytes must be identical on every local
// rank.
type Config struct {
	Group string // job name; part of the segment names
	Epoch uint32 // membership epoch; part of the segment names
	Rank  int    // this rank's world rank, in [0, Size)
	Size  int    // world size

	// Local lists the world ranks on this host that this transport connects,
	// including Rank, in any order. Conn panics for other ranks. Nil means
	// every rank of the world.
	Local []int
	// Streams is the number of streams per peer pair, each its own ring
	// (>= 1; 0 means 1).
	Streams int
	// RingBytes is the data capacity of each ring: a power of two of at
	// least 4096 (0 means DefaultRingBytes).
	RingBytes int
	// SlotBytes is the payload capacity of one LL slot (transport.Slots):
	// 0 means DefaultSlotBytes, a negative value gives no LL window
	// (SlotBytes reports 0 for every peer). At most 1 MiB.
	SlotBytes int
	// Dir is where the segment files live (default DefaultDir).
	Dir string
	// ZCopyThreshold is the size from which messages travel by CMA when the
	// kernel allows it: 0 means DefaultZCopyThreshold, a negative value
	// disables CMA (in both directions, since the receiver decides).
	ZCopyThreshold int
	// ZCopyVecSlice is the smallest average slice of a gather-send
	// (SendOp.Vec) that travels by CMA; shorter slices go through the ring,
	// copied straight from them. 0 means DefaultZCopyVecSlice.
	ZCopyVecSlice int
	// MapCache is how many mappings of a peer's shareable buffers
	// (a2a.AllocBuffer memory) each stream keeps, for messages that go by
	// CMA: those from such a buffer are copied from a mapping of it
	// instead of by process_vm_readv. 0 means DefaultMapCache; a negative
	// value sends no mapped descriptors (messages from shareable buffers
	// go by CMA like others).
	MapCache int
	// Logger receives setup and peer events; nil discards them.
	Logger *slog.Logger

	// noProbe skips the CMA probe at Open and assumes CMA works, so that
	// tests reach the run-time fallback with a real EPERM.
	noProbe bool
}

// normalize validates c and fills in defaults. The Local list comes back
// sorted and owned by the transport.
func (c Config) normalize() (Config, error) {
	if err := c.checkRanges(); err != nil {
		return Config{}, err
	}
	local, err := localRanks(c.Local, c.Size, c.Rank)
	if err != nil {
		return Config{}, err
	}
	c.Local = local
	c.setDefaults()
	if segBytes(len(c.Local), c.Streams, c.RingBytes, c.SlotBytes) > maxSegBytes {
		return Config{}, configError("%d local ranks x %d streams x %d-byte rings exceed the segment limit", len(c.Local), c.Streams, c.RingBytes)
	}
	return c, nil
}

// configError is the error of a Config that Open refuses.
func configError(format string, args ...any) error {
	return fault.New(fault.ErrInvalidArgument, -1, "shm: "+format, args...)
}

// checkRanges checks the numeric fields against their limits.
func (c *Config) checkRanges() error {
	switch {
	case c.Size < 1:
		return configError("world size %d", c.Size)
	case uint64(c.Size) > math.MaxUint32:
		return configError("world size %d too large", c.Size)
	case c.Rank < 0 || c.Rank >= c.Size:
		return configError("rank %d outside world of size %d", c.Rank, c.Size)
	case c.Streams < 0 || c.Streams > maxStreams:
		return configError("%d streams per peer (want 1..%d)", c.Streams, maxStreams)
	case c.RingBytes != 0 && (c.RingBytes < minRingBytes || c.RingBytes > maxRingBytes || c.RingBytes&(c.RingBytes-1) != 0):
		return configError("ring of %d bytes (want a power of two in [%d, %d])", c.RingBytes, minRingBytes, maxRingBytes)
	case c.SlotBytes > maxSlotBytes:
		return configError("small-message mailbox (LL slot) of %d bytes (max %d)", c.SlotBytes, maxSlotBytes)
	}
	return nil
}

// localRanks returns Config.Local sorted, in a copy of its own (every rank
// of the world when local is nil), after checking that its ranks are
// distinct, in the world of size ranks, and include rank.
func localRanks(local []int, size, rank int) ([]int, error) {
	if local == nil {
		local = make([]int, size)
		for i := range local {
			local[i] = i
		}
	} else {
		local = slices.Clone(local)
		slices.Sort(local)
	}
	if len(local) > maxLocal {
		return nil, configError("%d local ranks (max %d)", len(local), maxLocal)
	}
	for i, r := range local {
		if r < 0 || r >= size {
			return nil, configError("local rank %d outside world of size %d", r, size)
		}
		if i > 0 && local[i-1] == r {
			return nil, configError("local rank %d listed twice", r)
		}
	}
	if _, ok := slices.BinarySearch(local, rank); !ok {
		return nil, configError("local ranks %v do not include rank %d", local, rank)
	}
	return local, nil
}

// setDefaults fills in the zero fields.
func (c *Config) setDefaults() {
	if c.Streams == 0 {
		c.Streams = 1
	}
	if c.RingBytes == 0 {
		c.RingBytes = DefaultRingBytes
	}
	// From here on SlotBytes is the slot capacity itself, 0 for no LL
	// window, as the segment header records it and peers compare it.
	c.SlotBytes = transport.SlotSize(c.SlotBytes, DefaultSlotBytes)
	if c.Dir == "" {
		c.Dir = DefaultDir
	}
	if c.ZCopyThreshold == 0 {
		c.ZCopyThreshold = DefaultZCopyThreshold
	}
	if c.MapCache == 0 {
		c.MapCache = DefaultMapCache
	}
	if c.ZCopyVecSlice <= 0 {
		c.ZCopyVecSlice = DefaultZCopyVecSlice
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}
