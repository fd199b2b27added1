package a2a

import (
	"context"
	"errors"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"a2a/a2a/algo"
	"a2a/a2a/internal/fault"
	"a2a/a2a/transport"
)

// maxPark bounds one park in Transport.Wait, so a parked rank re-checks its
// context, deadline and abort state at least this often.
const maxPark = 10 * time.Millisecond

// engine executes schedules on a transport: the one engine every algorithm and
// collective runs on. It posts all steps of a round as non-blocking transport
// operations and progresses them from the calling goroutine: busy-poll for
// spin, then give the core away with sched_yield for yield, then park in
// Transport.Wait. Its buffers are reused across operations, so a steady-state
// operation allocates nothing.
type engine struct {
	tr      transport.Transport
	rank    int
	size    int
	streams int
	epoch   uint32
	spin    time.Duration
	yield   time.Duration
	stopped func() error // abort cause or nil, checked while waiting

	sendOps    []transport.SendOp
	recvOps    []transport.RecvOp
	active     []activeOp
	copies     []localCopy // copies of the current round, done while the network is idle
	copied     int         // copies[:copied] are done
	sendFrames []uint32    // frames sent this op, by peer*streams+stream
	recvFrames []uint32

	// Wait attribution for the last op: the peer whose data arrived last.
	lastPeer int
	lastWait time.Duration
}

// localCopy is a copy step still to do; it shrinks as chunks are copied.
type localCopy struct{ dst, src []byte }

// copyChunk bounds the local copying done between two passes over the
// network operations, so that copying never delays reading a socket for long.
const copyChunk = 256 << 10

type activeOp struct {
	send   bool
	done   bool
	peer   int
	stream int
	idx    int
	conn   transport.Conn
}

func newEngine(tr transport.Transport, rank, size, streams int, epoch uint32, spin, yield time.Duration, stopped func() error) *engine {
	return &engine{
		tr: tr, rank: rank, size: size, streams: streams, epoch: epoch,
		spin: spin, yield: yield, stopped: stopped,
		sendFrames: make([]uint32, size*streams),
		recvFrames: make([]uint32, size*streams),
	}
}

// opBuffers are the buffers a schedule's spans address.
type opBuffers [3][]byte

func (b *opBuffers) span(s algo.Span) ([]byte, error) {
	buf := b[s.Buf]
	if s.Off < 0 || s.Len < 0 || s.End() > len(buf) {
		return nil, fault.New(fault.ErrInvalidArgument, -1, "schedule addresses %s[%d:%d] of a %d-byte buffer", s.Buf, s.Off, s.End(), len(buf))
	}
	return buf[s.Off:s.End()], nil
}

// run executes s for the operation (kind, seq) and returns when every step of
// every round is done, or at the first error.
func (e *engine) run(ctx context.Context, kind transport.OpKind, seq uint64, s *algo.Schedule, bufs *opBuffers, deadline time.Time) error {
	clear(e.sendFrames)
	clear(e.recvFrames)
	e.lastPeer, e.lastWait = -1, 0
	start := time.Now()
	for r := 0; r < s.NumRounds(); r++ {
		if err := e.post(kind, seq, s.Algo, s.Round(r), bufs); err != nil {
			return err
		}
		if err := e.progress(ctx, deadline, start); err != nil {
			return err
		}
	}
	return nil
}

// post turns the steps of one round into transport operations; copies happen at once.
func (e *engine) post(kind transport.OpKind, seq uint64, a algo.Algo, steps []algo.Step, bufs *opBuffers) error {
	e.active = e.active[:0]
	e.copies, e.copied = e.copies[:0], 0
	nSend, nRecv := 0, 0
	for i := range steps {
		st := &steps[i]
		switch st.Kind {
		case algo.StepCopy:
			src, err := bufs.span(st.Src)
			if err != nil {
				return err
			}
			dst, err := bufs.span(st.Dst)
			if err != nil {
				return err
			}
			if len(dst) > 0 {
				e.copies = append(e.copies, localCopy{dst: dst, src: src})
			}
		case algo.StepSend, algo.StepRecv:
			if st.Peer < 0 || st.Peer >= e.size || st.Peer == e.rank || st.Stream < 0 || st.Stream >= e.streams {
				return fault.New(fault.ErrInvalidArgument, st.Peer, "schedule step %s to peer %d stream %d", st.Kind, st.Peer, st.Stream)
			}
			h := transport.Header{Kind: kind, Algo: uint8(a), Stream: uint16(st.Stream), Epoch: e.epoch, Seq: seq}
			if st.Last {
				h.Flags = transport.FlagLast
			}
			slot := st.Peer*e.streams + st.Stream
			if st.Kind == algo.StepSend {
				data, err := bufs.span(st.Src)
				if err != nil {
					return err
				}
				h.Src = uint32(e.rank)
				h.Round = e.sendFrames[slot]
				e.sendFrames[slot]++
				if nSend == len(e.sendOps) {
					e.sendOps = append(e.sendOps, transport.SendOp{})
				}
				e.sendOps[nSend].Reset(h, data)
				e.active = append(e.active, activeOp{send: true, peer: st.Peer, stream: st.Stream, idx: nSend, conn: e.tr.Conn(st.Peer, st.Stream)})
				nSend++
			} else {
				dst, err := bufs.span(st.Dst)
				if err != nil {
					return err
				}
				h.Src = uint32(st.Peer)
				h.Round = e.recvFrames[slot]
				e.recvFrames[slot]++
				if nRecv == len(e.recvOps) {
					e.recvOps = append(e.recvOps, transport.RecvOp{})
				}
				e.recvOps[nRecv].Reset(h, dst, false)
				e.active = append(e.active, activeOp{peer: st.Peer, stream: st.Stream, idx: nRecv, conn: e.tr.Conn(st.Peer, st.Stream)})
				nRecv++
			}
		default:
			return fault.New(fault.ErrInvalidArgument, -1, "schedule step kind %s not supported by the engine", st.Kind)
		}
	}
	return nil
}

// progress drives the posted operations to completion.
func (e *engine) progress(ctx context.Context, deadline, opStart time.Time) error {
	var idleStart time.Time
	for {
		pending, moved := 0, false
		for i := range e.active {
			a := &e.active[i]
			if a.done {
				continue
			}
			var done bool
			var err error
			var before, after int
			if a.send {
				op := &e.sendOps[a.idx]
				before = op.Progress
				done, err = a.conn.TrySend(op)
				after = op.Progress
			} else {
				op := &e.recvOps[a.idx]
				before = op.Progress
				done, err = a.conn.TryRecv(op)
				after = op.Progress
			}
			if err != nil {
				return e.peerError(a.peer, err)
			}
			if done {
				a.done, moved = true, true
				if !a.send {
					if w := time.Since(opStart); w >= e.lastWait {
						e.lastPeer, e.lastWait = a.peer, w
					}
				}
				continue
			}
			if after != before {
				moved = true
			}
			pending++
		}
		if pending == 0 {
			for e.copySome() {
			}
			return nil
		}
		if moved || e.copySome() {
			idleStart = time.Time{}
			continue
		}
		now := time.Now()
		if idleStart.IsZero() {
			idleStart = now
		}
		idle := now.Sub(idleStart)
		if idle < e.spin {
			// Other ranks may be goroutines of this process (tests, in-process
			// groups): let them run instead of spinning a whole time slice.
			runtime.Gosched()
			continue
		}
		if err := e.checkStop(ctx, deadline, now); err != nil {
			return err
		}
		if idle < e.spin+e.yield {
			schedYield() // let an oversubscribed peer rank run on this core
			continue
		}
		park := min(deadline.Sub(now), maxPark)
		if err := e.tr.Wait(park); err != nil {
			return err
		}
	}
}

// copySome does up to copyChunk bytes of the round's local copies and
// reports whether there was anything to copy. The engine calls it when the
// network has nothing for it, so local copies fill the gaps of the transfers.
func (e *engine) copySome() bool {
	if e.copied == len(e.copies) {
		return false
	}
	c := &e.copies[e.copied]
	n := copy(c.dst[:min(len(c.dst), copyChunk)], c.src)
	c.dst, c.src = c.dst[n:], c.src[n:]
	if len(c.dst) == 0 {
		e.copied++
	}
	return true
}

// schedYield gives the core to another runnable thread of any process; Go's
// runtime.Gosched only yields to goroutines of this process.
func schedYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// checkStop reports why the operation must stop waiting: abort, cancellation or deadline.
func (e *engine) checkStop(ctx context.Context, deadline, now time.Time) error {
	if err := e.stopped(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return ctxError(err)
	}
	if !now.Before(deadline) {
		return fault.Wrap(fault.ErrTimeout, -1, context.DeadlineExceeded, "operation did not complete within its deadline")
	}
	return nil
}

// peerError makes sure a transport failure names the peer it concerns.
func (e *engine) peerError(peer int, err error) error {
	var fe *fault.Error
	if errors.As(err, &fe) {
		return err
	}
	return fault.Wrap(fault.ErrPeerLost, peer, err, "transport")
}

// ctxError maps a context error to an a2a error that still matches it.
func ctxError(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fault.Wrap(fault.ErrTimeout, -1, err, "context deadline")
	}
	return fault.Wrap(fault.ErrAborted, -1, err, "context canceled")
}
