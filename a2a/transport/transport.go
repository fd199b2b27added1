// Package transport defines how the engine moves bytes between ranks, independent
// of the medium. A Transport gives, for every peer, several ordered streams (Conn)
// carrying framed messages. Every operation is non-blocking: the engine posts a
// SendOp or RecvOp and calls TrySend/TryRecv until it reports done, progressing
// many operations from one goroutine. When nothing can progress the engine spins,
// then yields, then parks in Transport.Wait. This keeps latency low on machines
// where waking a parked core costs tens of microseconds, and it lets TCP, shared
// memory and RDMA verbs plug into the same engine.
//
// One-sided puts (the window abstraction used by the LL protocol and RDMA WRITE)
// are SendOps of kind OpPut whose Aux field is the byte offset in the target's
// window; the target completes them with a RecvOp whose Window is set. See
// docs/ARCHITECTURE.md for how shm and verbs map these operations.
package transport

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// OpKind names the collective a frame belongs to, so that ranks calling
// different collectives detect it instead of exchanging wrong data.
type OpKind uint8

// Operation kinds carried in frame headers.
const (
	OpNone OpKind = iota
	OpAllToAllV
	OpAllToAll
	OpCounts // in-band counts exchange that precedes an AllToAllV
	OpBarrier
	OpAllReduce
	OpReduceScatter
	OpAllGather
	OpBroadcast
	OpReduce
	OpGather
	OpScatter
	OpSendRecv
	OpPut
	OpProbe // connection-level probes (link measurement)
)

var opNames = [...]string{"none", "alltoallv", "alltoall", "counts", "barrier", "allreduce",
	"reducescatter", "allgather", "broadcast", "reduce", "gather", "scatter", "sendrecv", "put", "probe"}

func (k OpKind) String() string {
	if int(k) < len(opNames) {
		return opNames[k]
	}
	return fmt.Sprintf("op(%d)", uint8(k))
}

// Frame header layout (little endian, HeaderSize bytes):
//
//	0  magic u32     4 version u8   5 kind u8   6 algo u8   7 flags u8
//	8  stream u16   10 comm u16     12 epoch u32
//	16 src u32      20 round u32
//	24 seq u64      32 len u64      40 aux u64
const (
	HeaderSize = 48
	Magic      = 0xA2A0F4A3
	Version    = 1
)

// FlagLast marks the last frame of a message cut into several frames, so a
// receiver expecting a different total length detects it on the first frame
// where the two cuts disagree.
const FlagLast uint8 = 1

// TransportFlags are the bits of the flags byte (offset 7) a transport keeps
// for itself (shm: its record kind); Decode leaves them out of Flags.
const TransportFlags uint8 = 0xf0

// Header describes one frame. The receiver compares it with the header it
// expects; any difference is a mismatch between the ranks' collective calls.
type Header struct {
	Kind   OpKind
	Algo   uint8  // algorithm id, so ranks running different algorithms detect it
	Flags  uint8  // FlagLast marks the final frame of a message
	Stream uint16 // stream index within the peer pair
	// Comm names the communicator among those sharing the data plane
	// (Demux): 0 for the one that joined, others for Split and Dup.
	Comm  uint16
	Epoch uint32 // membership epoch of the communicator
	Src   uint32 // sending rank
	Round uint32 // index of this frame among the op's frames on this (src, dst, stream)
	Seq   uint64 // operation sequence number within the communicator
	Len   uint64 // payload bytes that follow the header
	Aux   uint64 // tag for point-to-point, window offset for puts
}

// Encode writes h into b[:HeaderSize].
func (h *Header) Encode(b []byte) {
	_ = b[HeaderSize-1]
	binary.LittleEndian.PutUint32(b[0:], Magic)
	b[4] = Version
	b[5] = byte(h.Kind)
	b[6] = h.Algo
	b[7] = h.Flags
	binary.LittleEndian.PutUint16(b[8:], h.Stream)
	binary.LittleEndian.PutUint16(b[10:], h.Comm)
	binary.LittleEndian.PutUint32(b[12:], h.Epoch)
	binary.LittleEndian.PutUint32(b[16:], h.Src)
	binary.LittleEndian.PutUint32(b[20:], h.Round)
	binary.LittleEndian.PutUint64(b[24:], h.Seq)
	binary.LittleEndian.PutUint64(b[32:], h.Len)
	binary.LittleEndian.PutUint64(b[40:], h.Aux)
}

// Decode fills h from b[:HeaderSize]. A short b, a wrong magic or version is
// a protocol error (ErrMismatch): the peer is not speaking this protocol (or
// the stream lost framing).
func (h *Header) Decode(b []byte) error {
	if len(b) < HeaderSize {
		return fault.New(fault.ErrMismatch, -1, "data-plane message header (frame header) of %d bytes, want %d: the peer is not an a2a rank of this version", len(b), HeaderSize)
	}
	if m := binary.LittleEndian.Uint32(b[0:]); m != Magic {
		return fault.New(fault.ErrMismatch, -1, "data-plane message header (frame) with magic %#x: the peer is not an a2a rank", m)
	}
	if b[4] != Version {
		return fault.New(fault.ErrMismatch, -1, "data-plane protocol version %d, this rank speaks %d: run the same a2a version on every rank", b[4], Version)
	}
	h.Kind = OpKind(b[5])
	h.Algo = b[6]
	h.Flags = b[7] &^ TransportFlags
	h.Stream = binary.LittleEndian.Uint16(b[8:])
	h.Comm = binary.LittleEndian.Uint16(b[10:])
	h.Epoch = binary.LittleEndian.Uint32(b[12:])
	h.Src = binary.LittleEndian.Uint32(b[16:])
	h.Round = binary.LittleEndian.Uint32(b[20:])
	h.Seq = binary.LittleEndian.Uint64(b[24:])
	h.Len = binary.LittleEndian.Uint64(b[32:])
	h.Aux = binary.LittleEndian.Uint64(b[40:])
	return nil
}

// Check compares a received header got with the expected header want. When
// anyLen is set the length may be anything up to want.Len (point-to-point
// receives into a larger buffer; window puts). It returns an ErrMismatch
// *fault.Error naming the first differing field.
func (want *Header) Check(got *Header, anyLen bool) error {
	var field string
	var w, g uint64
	switch {
	case got.Comm != want.Comm:
		field, w, g = "communicator", uint64(want.Comm), uint64(got.Comm)
	case got.Epoch != want.Epoch:
		field, w, g = "epoch", uint64(want.Epoch), uint64(got.Epoch)
	case got.Seq != want.Seq:
		field, w, g = "op sequence", want.Seq, got.Seq
	case got.Kind != want.Kind:
		return fault.New(fault.ErrMismatch, int(got.Src), "rank %d sent %s, this rank expects %s (op %d)", got.Src, got.Kind, want.Kind, want.Seq)
	case got.Algo != want.Algo:
		field, w, g = "algorithm", uint64(want.Algo), uint64(got.Algo)
	case got.Src != want.Src:
		field, w, g = "source rank", uint64(want.Src), uint64(got.Src)
	case got.Stream != want.Stream:
		field, w, g = "stream", uint64(want.Stream), uint64(got.Stream)
	case got.Round != want.Round:
		field, w, g = "round", uint64(want.Round), uint64(got.Round)
	case got.Flags != want.Flags:
		return fault.New(fault.ErrMismatch, int(got.Src), "%s op %d: rank %d sends a message of a different length than this rank expects (part %d): recvCounts must equal what the sender passes in sendCounts", want.Kind, want.Seq, got.Src, got.Round)
	case got.Kind != OpPut && got.Aux != want.Aux:
		field, w, g = "tag", want.Aux, got.Aux
	case !anyLen && got.Len != want.Len:
		return fault.New(fault.ErrMismatch, int(got.Src), "%s op %d: rank %d sends %d bytes, this rank expects %d", want.Kind, want.Seq, got.Src, got.Len, want.Len)
	case anyLen && got.Len > want.Len:
		return fault.New(fault.ErrMismatch, int(got.Src), "%s op %d: rank %d sends %d bytes, buffer holds %d", want.Kind, want.Seq, got.Src, got.Len, want.Len)
	default:
		return nil
	}
	return fault.New(fault.ErrMismatch, int(got.Src), "%s op %d from rank %d: %s %d, expected %d", want.Kind, want.Seq, got.Src, field, g, w)
}

// SendOp is one framed message on its way out. The engine fills Hdr and Data;
// the rest is progress state owned by the transport while the op is in flight.
type SendOp struct {
	Hdr  Header
	Data []byte
	// Vec, when not nil, is the payload instead of Data: its slices in
	// order (a gather-send, see VecConn). Only VecConns get such ops.
	Vec [][]byte

	Wire     [HeaderSize]byte // encoded header (transport-owned)
	Progress int              // bytes of header+data already handed off (transport-owned)
	Started  bool             // transport-owned
}

// Reset prepares op for a new message.
func (op *SendOp) Reset(h Header, data []byte) {
	op.Hdr = h
	op.Hdr.Len = uint64(len(data))
	op.Data = data
	op.Vec = nil
	op.Progress = 0
	op.Started = false
}

// ResetVec prepares op for a new message whose payload is the slices of vec
// in order.
func (op *SendOp) ResetVec(h Header, vec [][]byte) {
	op.Reset(h, nil)
	op.Hdr.Len = uint64(VecLen(vec))
	op.Vec = vec
}

// PayloadLen is the length of op's payload, Data or Vec.
func (op *SendOp) PayloadLen() int {
	if op.Vec != nil {
		return int(op.Hdr.Len)
	}
	return len(op.Data)
}

// RecvOp is one framed message being received. Want is the expected header
// (Want.Len the exact length unless AnyLen); the payload lands in Dst, or, for a
// put (Window non-nil), at Window[Got.Aux:]. Got holds the received header once
// the op is done.
type RecvOp struct {
	Want   Header
	AnyLen bool
	Dst    []byte
	// DstVec, when not nil, is where an exact-length payload lands instead
	// of Dst: its slices in order (a scattered receive, see VecConn).
	DstVec [][]byte
	Window []byte
	// Route, when set, decides where a frame's payload lands instead of
	// Want, Dst and Window: Land returns what it returns. Demux receives
	// every frame of a shared Conn through such an op.
	Route func(peer int) ([]byte, error)
	Got   Header
	N     int // payload bytes received (valid when done)
	// Combine, when not nil, offers a transport that reads the payload in
	// place (shm's mapping of the sender's registered buffer) to reduce it
	// into its final destination instead of copying it to Dst: it calls
	// Combine.Combine(CombineID, off, src) for the payload's bytes from
	// off, in order, and sets Combined. Every piece but the last is a
	// multiple of CombinePiece bytes, so no element is cut. A transport
	// that cannot lands the payload in Dst as usual, and the caller
	// reduces from there. Only for an exact-length receive into Dst.
	Combine   Combiner
	CombineID int
	Combined  bool // transport-owned: the payload went to Combine

	Wire     [HeaderSize]byte // transport-owned
	Progress int              // transport-owned
	Started  bool             // transport-owned
}

// Combiner reduces received bytes into their destination in place of a
// copy (RecvOp.Combine); id is the RecvOp's CombineID and off the offset of
// src in the payload. An error fails the receive.
type Combiner interface {
	Combine(id, off int, src []byte) error
}

// CombinePiece divides every piece but the last that a transport passes to
// a Combiner: a multiple of every element size.
const CombinePiece = 4096

// Reset prepares op to receive a message matching want into dst.
func (op *RecvOp) Reset(want Header, dst []byte, anyLen bool) {
	op.Want = want
	op.Want.Len = uint64(len(dst))
	op.AnyLen = anyLen
	op.Dst = dst
	op.DstVec = nil
	op.Window = nil
	op.Got = Header{}
	op.N = 0
	op.Progress = 0
	op.Started = false
	op.Combine, op.CombineID, op.Combined = nil, 0, false
}

// ResetVec prepares op to receive a message of exactly VecLen(vec) bytes
// matching want, scattered over the slices of vec in order.
func (op *RecvOp) ResetVec(want Header, vec [][]byte) {
	op.Reset(want, nil, false)
	op.Want.Len = uint64(VecLen(vec))
	op.DstVec = vec
}

// Conn is one ordered stream to one peer. A Conn progresses one SendOp and one
// RecvOp at a time: the first op passed to TrySend (TryRecv) owns the
// direction until it reports done, and other ops get (false, nil) meanwhile.
// Neither method blocks.
type Conn interface {
	// TrySend hands as much of op to the medium as it can without blocking.
	TrySend(op *SendOp) (done bool, err error)
	// TryRecv takes as much of op from the medium as it can without blocking.
	// A header that differs from op.Want fails with fault.ErrMismatch.
	TryRecv(op *RecvOp) (done bool, err error)
}

// Conns gives the streams to the peers: a Transport, or the view of one
// that a communicator sharing it has (Demux).
type Conns interface {
	// Conn returns the stream-th stream to peer (never self).
	Conn(peer, stream int) Conn
}

// Stats are a transport's cumulative counters.
type Stats struct {
	BytesSent     []uint64 // by peer rank
	BytesReceived []uint64 // by peer rank
	Rejected      uint64   // connections refused (bad hello, wrong secret, strangers)
}

// CounterStats is the Stats of a transport that counts bytes in one
// counter per peer rank and direction.
func CounterStats(sent, recvd []atomic.Uint64) Stats {
	s := Stats{BytesSent: make([]uint64, len(sent)), BytesReceived: make([]uint64, len(recvd))}
	for i := range sent {
		s.BytesSent[i] = sent[i].Load()
	}
	for i := range recvd {
		s.BytesReceived[i] = recvd[i].Load()
	}
	return s
}

// Transport connects one rank with all its peers.
type Transport interface {
	// Name is "tcp", "shm" or "verbs".
	Name() string
	// Streams is the number of streams per peer pair.
	Streams() int
	// Conn returns the stream-th stream to peer (never self).
	Conn(peer, stream int) Conn
	// Wait parks until some Conn may progress, Wake is called, or timeout passes.
	Wait(timeout time.Duration) error
	// Wake makes a concurrent or the next Wait return at once (abort, cancel).
	Wake()
	// Stats returns a snapshot of the counters.
	Stats() Stats
	// Close releases every resource; in-flight operations fail.
	Close() error
}

// Land checks op.Got (already decoded) against what op expects and returns
// where its payload goes: op.Dst[:Got.Len], or for a put op.Window at the
// offset Got.Aux; nil for a scattered receive (op.DstVec, exact length). Every transport calls it once a frame's header is in, so
// that all of them accept and refuse frames alike. peer is the sending rank.
func (op *RecvOp) Land(peer int) ([]byte, error) {
	if op.Route != nil {
		return op.Route(peer)
	}
	got := &op.Got
	switch {
	case op.Window != nil:
		want := op.Want
		want.Len = uint64(len(op.Window))
		if err := want.Check(got, true); err != nil {
			return nil, err
		}
		w := uint64(len(op.Window))
		if got.Aux > w || got.Len > w-got.Aux {
			return nil, fault.New(fault.ErrMismatch, peer, "%s op %d: rank %d puts %d bytes at offset %d of a %d-byte window",
				op.Want.Kind, op.Want.Seq, peer, got.Len, got.Aux, w)
		}
		return op.Window[got.Aux : got.Aux+got.Len], nil
	case op.DstVec != nil:
		return nil, op.Want.Check(got, false)
	default:
		if err := op.Want.Check(got, op.AnyLen); err != nil {
			return nil, err
		}
		return op.Dst[:got.Len], nil
	}
}

// Slots is the one-sided window of the LL protocol, implemented by transports
// whose ranks can store straight into a peer's memory (shm, verbs). Each
// rank's window holds, for every peer that may store into it, two slots chosen
// by the parity of the LL epoch. Verbs writes the payload as 8-byte words,
// each carrying 4 payload bytes in its low half and the epoch in its high
// half, and a length word tagged the same way (EncodeSlot); the receiver
// polls until the length word and every data word it announces carry the
// current epoch (SlotWindow.Take), since an RDMA device places words in any
// order. Shm, whose stores become visible in order, writes the packed form:
// the payload as it is, then the length word (EncodePacked); the receiver
// polls the length word alone (SlotWindow.TakePacked, which asks for a small
// message's later lines with it). No word is ever cleared: a stale length or
// data word carries an older epoch and is never taken.
//
// Epochs start at FirstEpoch and, after 2^32-1, wrap back to FirstEpoch (see
// NextEpoch), so consecutive epochs always differ in parity and a zeroed
// window matches no epoch. A slot of parity p is written again only two
// epochs later; the caller guarantees the receiver finished with it by then
// (every pair of ranks exchanges something in every epoch). Stores are made
// by one goroutine at a time, and so are Loads.
type Slots interface {
	// SlotBytes is the most payload one Store to peer may carry; 0 when
	// peer cannot be reached one-sided (a rank on another host).
	SlotBytes(peer int) int
	// Store writes data into this rank's slot in peer's window for epoch,
	// with tag (< 1<<SlotTagBits; it names the operation, so that ranks
	// running different ones detect it). It never blocks. More than
	// SlotBytes(peer) bytes fail with fault.ErrInvalidArgument; a peer that
	// is gone fails with fault.ErrPeerLost.
	Store(peer int, epoch uint32, tag uint32, data []byte) error
	// Load takes what peer stored for epoch into dst: it copies the words
	// that carry epoch, keeps its progress in st (zero it for a new load)
	// and reports done once the whole message is in; st.Len is then its
	// length. A length other than len(dst) (greater, when anyLen) or a tag
	// other than tag fails with fault.ErrMismatch, as does a frame arriving from peer on a
	// stream while the load waits (the peer runs another operation), unless
	// communicators share the Conns (Sharer: the frame may be another's). A peer
	// that is gone before storing everything fails with fault.ErrPeerLost.
	// Load never blocks; a load that cannot progress is what
	// Transport.Wait waits for.
	Load(peer int, epoch uint32, tag uint32, dst []byte, anyLen bool, st *SlotLoad) (done bool, err error)
	// BeginBatch starts a batch of Stores and Loads that one goroutine
	// makes (an operation's) and reports false once the transport is
	// closed. Until EndBatch, those calls skip their per-call guard against
	// Close (Close waits for EndBatch instead), and a Store's wake-up of a
	// parked peer waits until the batch's goroutine waits (Transport.Wait)
	// or ends the batch. Per call, each of those costs a locked instruction,
	// and a locked instruction after a store to a peer's cache line waits
	// for that line to arrive: in a batch the stores to every peer overlap
	// with what follows them. Batches do not nest, and no other goroutine
	// may Store or Load during one.
	BeginBatch() bool
	// EndBatch ends the batch BeginBatch started and wakes the parked peers
	// still due a wake-up.
	EndBatch()
}

// SlotWatcher is implemented by Slots that let a rank see, without taking
// it, that a peer stored a message it did not expect. Where a pair agrees
// that a block above the LL cutoff travels by frames alone (no length
// announcement first), the receiver watches the peer's slot while it waits
// for the first frame: a message there means the peer took the block for
// one within the cutoff, and the receiver reports the mismatch at once
// instead of waiting for frames that never come. The other disagreement, a
// frame where a Load waits, Load reports itself.
type SlotWatcher interface {
	// Stored reports whether peer has stored a message, or begun to, for
	// epoch in this rank's window. When it has not, Transport.Wait returns
	// once it does or peer is gone, as for a Load that cannot finish, until
	// the next Load from peer replaces that watch. It never blocks, and
	// runs on the goroutine that makes the Loads.
	Stored(peer int, epoch uint32) bool
}

// Placer is implemented by transports that see where the ranks of this host
// run: Rebalance moves the calling thread off a CPU that holds more of them
// than another (see shm.Transport.Rebalance). The engine calls it now and
// then while it yields on a host with more ranks than CPUs.
type Placer interface {
	Rebalance()
}

// SlotTagBits is the width of an LL message's tag.
const SlotTagBits = 8

// SlotLoad is the progress of one Slots.Load.
type SlotLoad struct {
	Len   int // message length, valid once Known
	Known bool
	Words int // data words taken so far
}

// FirstEpoch is the first LL epoch; epochs 0 and 1 are never used, so zeroed
// memory never passes for a message.
const FirstEpoch uint32 = 2

// NextEpoch is the LL epoch after e: e+1, wrapping from 2^32-1 to FirstEpoch
// (the parity still alternates, since 2^32-1 is odd and FirstEpoch even).
func NextEpoch(e uint32) uint32 {
	if e == ^uint32(0) {
		return FirstEpoch
	}
	return e + 1
}
