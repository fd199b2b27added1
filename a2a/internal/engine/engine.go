// Package engine executes schedules (package algo) on a transport: the one
// engine every AllToAllV algorithm and every collective of a2a runs on.
//
// It posts all steps of a round as non-blocking transport operations and
// progresses them from the calling goroutine: busy-poll, then give the core
// away with sched_yield, then park in Transport.Wait (see Waiting). Local
// copies and reductions of a round fill the gaps of its transfers. LL
// messages (one-sided stores into a peer's slot) are polled ahead of the
// frames. Buffers and operations are reused across runs, so a steady-state
// run allocates nothing.
//
// The engine depends only on algo, transport, reduce and fault: what a run
// means to the communicator (op sequence numbers, aborts, reports) stays in
// package a2a, which hands the engine a Stopped function to check while it
// waits.
package engine

import (
	"context"
	"time"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// Options make an Engine (New).
type Options struct {
	Transport transport.Transport
	// Conns gives the streams to the peers when they are not Transport's
	// own (a communicator sharing its data plane, transport.Demux).
	Conns   transport.Conns
	Rank    int    // this rank
	Size    int    // world size
	Streams int    // ordered streams per peer pair
	Epoch   uint32 // membership epoch, carried in every frame header
	Waiting Waiting
	// Hosts gives every rank's host ordinal: traffic with ranks of this
	// rank's host is also counted apart (Traffic).
	Hosts []int
	// Timeout bounds an operation without a deadline, from when it first
	// waits (Config.Timeout).
	Timeout time.Duration
	// Stopped returns why the running operation must stop (an abort, a
	// departed peer, Close), or nil; the engine checks it while it waits.
	Stopped func() error
}

// Engine executes schedules on one transport for one rank. It is used by
// one goroutine at a time (the communicator's driver).
type Engine struct {
	tr      transport.Transport
	conns   transport.Conns // Options.Conns, else tr
	rank    int
	size    int
	streams int
	epoch   uint32
	wait    Waiting
	timeout time.Duration
	stopped func() error
	// placer spreads this host's ranks over its CPUs (nil if the transport
	// cannot); placed is when this rank last asked it to.
	placer transport.Placer
	placed time.Time

	round   round        // the round being posted and progressed
	ll      llState      // the one-sided window and the LL epoch
	frames  frameSeq     // frame numbers of the running operation
	op      opState      // the running operation's figures and deadline
	scr     scratchState // BufScratch, grown to the largest ScratchBytes seen
	vec     vecState     // gathered and scattered buffers (vec.go)
	reducer reduction    // dtype and operator of the running schedule
	// aux is the collective signature carried in every frame of the
	// running operation (0 for AllToAllV).
	aux uint64
	// inPlace counts the RecvReduce frames the transport reduced where
	// they lay (RecvOp.Combine), with no landing copy.
	inPlace uint64
}

// reduction is the element type and operator of the running schedule's
// reduce steps.
type reduction struct {
	dtype reduce.DType
	op    reduce.Op
}

// reductionOf is the reduction schedule s was planned for.
func reductionOf(s *algo.Schedule) reduction {
	return reduction{reduce.DType(s.DType), reduce.Op(s.Op)}
}

// frameSeq numbers the frames of one operation by peer and stream, in each
// direction: the receiver checks the number in every header.
type frameSeq struct {
	sent, received []uint32 // by peer*streams+stream
}

// next returns the number of the next frame on (peer, stream) in one
// direction and counts it.
func (f *frameSeq) next(send bool, slot int) uint32 {
	if send {
		n := f.sent[slot]
		f.sent[slot]++
		return n
	}
	n := f.received[slot]
	f.received[slot]++
	return n
}

// New makes the engine of one rank.
func New(o Options) *Engine {
	e := &Engine{
		tr: o.Transport, rank: o.Rank, size: o.Size, streams: o.Streams, epoch: o.Epoch,
		wait: o.Waiting, timeout: o.Timeout, stopped: o.Stopped,
		frames: frameSeq{sent: make([]uint32, o.Size*o.Streams), received: make([]uint32, o.Size*o.Streams)},
		ll:     newLLState(o.Transport, o.Rank, o.Size),
		op:     opState{sameHost: sameHost(o.Hosts, o.Rank)},
	}
	if e.conns = o.Conns; e.conns == nil {
		e.conns = o.Transport
	}
	e.placer, _ = o.Transport.(transport.Placer)
	return e
}

// sameHost marks the ranks other than rank that share its host.
func sameHost(hosts []int, rank int) []bool {
	out := make([]bool, len(hosts))
	for r, h := range hosts {
		out[r] = r != rank && h == hosts[rank]
	}
	return out
}

// Transport is the transport the engine runs on.
func (e *Engine) Transport() transport.Transport { return e.tr }

// Conn is the stream-th stream to peer.
func (e *Engine) Conn(peer, stream int) transport.Conn { return e.conns.Conn(peer, stream) }

// Epoch is the membership epoch frames carry.
func (e *Engine) Epoch() uint32 { return e.epoch }

// Waiting is the wait policy in force.
func (e *Engine) Waiting() Waiting { return e.wait }

// Timeout bounds an operation without a deadline, from when it first waits.
func (e *Engine) Timeout() time.Duration { return e.timeout }

// InPlaceReductions is how many received frames were reduced straight from
// the sender's memory (a mapping of its registered buffer) instead of from
// a landing copy, since the engine was made.
func (e *Engine) InPlaceReductions() uint64 { return e.inPlace }

// SameHost reports whether peer shares this rank's host.
func (e *Engine) SameHost(peer int) bool { return e.op.sameHost[peer] }

// Buffers are the buffers a schedule's spans address, indexed by algo.Buf.
// BufScratch is the engine's own.
type Buffers [3][]byte

func (b *Buffers) span(s algo.Span) ([]byte, error) {
	// Unsigned compares: also false for a negative offset or length.
	if buf := b[s.Buf]; uint(s.Off) <= uint(len(buf)) && uint(s.Len) <= uint(len(buf)-s.Off) {
		return buf[s.Off : s.Off+s.Len], nil
	}
	return nil, b.spanError(s)
}

// spanError is span's error, apart so that span inlines: every step of
// every operation resolves its spans.
func (b *Buffers) spanError(s algo.Span) error {
	return fault.New(fault.ErrInvalidArgument, -1, "schedule addresses %s[%d:%d] of a %d-byte buffer", s.Buf, s.Off, s.End(), len(b[s.Buf]))
}

// srcDst resolves a local step's source and destination spans.
func (b *Buffers) srcDst(st *algo.Step) (src, dst []byte, err error) {
	if src, err = b.span(st.Src); err != nil {
		return nil, nil, err
	}
	dst, err = b.span(st.Dst)
	return src, dst, err
}

// Run executes s for the operation (kind, seq) and returns when every step
// of every round is done, or at the first error. aux is the collective
// signature every frame carries (0: none). StartOp must have been called
// for the operation.
func (e *Engine) Run(ctx context.Context, kind transport.OpKind, seq, aux uint64, s *algo.Schedule, bufs *Buffers) error {
	clear(e.frames.sent)
	clear(e.frames.received)
	e.reducer, e.aux = reductionOf(s), aux
	e.ll.tag = uint32(kind)
	bufs[algo.BufScratch] = e.scratchFor(s.ScratchBytes)
	if w := e.ll.window; w != nil {
		if !w.BeginBatch() {
			return fault.New(fault.ErrClosed, -1, "transport closed")
		}
		defer w.EndBatch()
	}
	for r := 0; r < s.NumRounds(); r++ {
		if err := e.post(opID{kind, seq, s.Algo}, s.Round(r), bufs); err != nil {
			return err
		}
		if err := e.progress(ctx); err != nil {
			return err
		}
	}
	return nil
}
