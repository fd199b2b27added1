package a2a

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/a2a/transport"
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
	waiting              // spin, yield, sharedProcess, crowded (see post)
	stopped func() error // abort cause or nil, checked while waiting
	// placer spreads this host's ranks over its CPUs (nil if the transport
	// cannot); placed is when this rank last asked it to.
	placer transport.Placer
	placed time.Time

	sendOps []transport.SendOp
	recvOps []transport.RecvOp
	active  []activeOp
	lls     []llLoad // the round's loads from slots; lls[:llLeft] are pending
	llLeft  int
	copies  []localCopy // copies of the current round, done while the network is idle
	copied  int         // copies[:copied] are done
	scratch []byte      // BufScratch, grown to the largest ScratchBytes seen
	dtype   reduce.DType
	op      reduce.Op
	aux     uint64 // collective signature carried in every frame

	// Bytes the last operation sent to and received from other ranks, and
	// which peers share this rank's host (for the breakdown).
	traffic    traffic
	sameHost   []bool
	sendFrames []uint32 // frames sent this op, by peer*streams+stream
	recvFrames []uint32

	// Wait attribution for the last op: the peer whose data arrived last
	// after the engine had to wait, and how long after opStart (set by the
	// Comm when the op began if it read the clock, else when the op first
	// waited).
	lastPeer int
	lastWait time.Duration
	opStart  time.Time
	// deadline ends the operation's waiting (see startOp); timeout is
	// Config.Timeout.
	deadline time.Time
	timeout  time.Duration

	// LL: the transport's one-sided window (nil without one), its slot
	// capacity by peer (0: none, the pair's LL messages go as frames), the
	// epoch of the next run, and the 8-byte length announcements by peer.
	slots  transport.Slots
	slotOf []transport.Slots // by peer: the part of slots that reaches it
	// watchOf, by peer: the part of slots that lets this rank see a message
	// it does not expect (Step.WatchLL), nil where none does.
	watchOf  []transport.SlotWatcher
	slotRoom []int
	llEpoch  uint32
	llTag    uint32 // the op kind, which LL messages carry
	countOut []byte
	countIn  []byte
	// Staging of one-sided messages that carry a collective's signature
	// after their data: the one being stored, and by peer the ones loading.
	sigOut []byte
	sigIn  [][]byte
	// Gathered and scattered buffers (engine_vec.go).
	vec engineVec
}

// localCopy is a copy or reduce step still to do; it shrinks as chunks are done.
type localCopy struct {
	dst, src []byte
	reduce   bool
	// A copy from or to a gathered buffer: the slices, the cursors and the
	// bytes left (engine_vec.go).
	sv, dv [][]byte
	sc, dc transport.VecCursor
	left   int
}

// copyChunk bounds the local copying done between two passes over the
// network operations, so that copying never delays reading a socket for long.
const copyChunk = 256 << 10

type activeOp struct {
	send        bool
	into        []byte // RecvReduce: reduce the landed frame into this span
	with        []byte // three-operand RecvReduce: into = with op landed (landed op with if landedFirst)
	landedFirst bool
	scatter     [][]byte // copy the landed staging here once the frame is in (engine_vec.go)
	done        bool
	peer        int
	stream      int
	idx         int
	conn        transport.Conn

	// An LL message that travels as a frame (recvOps[idx]): announce is
	// set when it is the announcement of a count-byte block, landing in dst.
	dst      []byte
	announce bool
	count    int
	// watchLL: until the frame begins to arrive, the peer's slot is watched
	// for an LL message it should not have stored (algo.Step.WatchLL).
	watchLL bool
}

// llLoad is an LL message awaited in a peer's slot. These sit in a list of
// their own (engine.lls), polled ahead of the frames with none of a frame's
// bookkeeping: a round of LL messages only (a small AllToAllV, Barrier, a
// small AllReduce) runs without touching activeOp.
type llLoad struct {
	peer  int
	slots transport.Slots // the part of the window that reaches peer
	// dst receives the message; sigDst, when set, is where the data goes
	// once the signature after it in dst checked out; announce is set when
	// the message is the announcement of a count-byte block.
	dst      []byte
	sigDst   []byte
	announce bool
	count    int
	load     transport.SlotLoad
}

// newEngine makes the engine of rank of size ranks on tr; hosts gives every
// rank's host, timeout is Config.Timeout.
func newEngine(tr transport.Transport, rank, size, streams int, epoch uint32, w waiting, hosts []int, timeout time.Duration, stopped func() error) *engine {
	slots, _ := tr.(transport.Slots)
	placer, _ := tr.(transport.Placer)
	// Slot capacities are fixed when the transport opens; every LL step
	// asks, so they are read once.
	room, slotOf, watchOf := make([]int, size), make([]transport.Slots, size), make([]transport.SlotWatcher, size)
	for peer := range room {
		if slots != nil && peer != rank {
			room[peer], slotOf[peer] = slots.SlotBytes(peer), slots
			if m, ok := tr.(transport.PeerSlots); ok {
				slotOf[peer] = m.SlotsOf(peer) // one hop less per store and poll
			}
			if room[peer] > 0 {
				watchOf[peer], _ = slotOf[peer].(transport.SlotWatcher)
			}
		}
	}
	sameHost := make([]bool, size)
	for r, h := range hosts {
		sameHost[r] = r != rank && h == hosts[rank]
	}
	return &engine{
		slotRoom: room,
		tr:       tr, rank: rank, size: size, streams: streams, epoch: epoch,
		waiting: w, timeout: timeout, stopped: stopped,
		sendFrames: make([]uint32, size*streams),
		recvFrames: make([]uint32, size*streams),
		slots:      slots,
		slotOf:     slotOf,
		watchOf:    watchOf,
		placer:     placer,
		llEpoch:    transport.FirstEpoch,
		countOut:   make([]byte, 8*size),
		countIn:    make([]byte, 8*size),
		sameHost:   sameHost,
	}
}

// slotBytes is what one LL store to peer may carry one-sided; 0 when the
// pair's LL messages travel as frames.
func (e *engine) slotBytes(peer int) int { return e.slotRoom[peer] }

// opBuffers are the buffers a schedule's spans address.
type opBuffers [3][]byte

func (b *opBuffers) span(s algo.Span) ([]byte, error) {
	// Unsigned compares: also false for a negative offset or length.
	if buf := b[s.Buf]; uint(s.Off) <= uint(len(buf)) && uint(s.Len) <= uint(len(buf)-s.Off) {
		return buf[s.Off : s.Off+s.Len], nil
	}
	return nil, b.spanError(s)
}

// spanError is span's error, apart so that span inlines: every step of
// every operation resolves its spans.
func (b *opBuffers) spanError(s algo.Span) error {
	return fault.New(fault.ErrInvalidArgument, -1, "schedule addresses %s[%d:%d] of a %d-byte buffer", s.Buf, s.Off, s.End(), len(b[s.Buf]))
}

// srcDst resolves a local step's source and destination spans.
func (b *opBuffers) srcDst(st *algo.Step) (src, dst []byte, err error) {
	if src, err = b.span(st.Src); err != nil {
		return nil, nil, err
	}
	dst, err = b.span(st.Dst)
	return src, dst, err
}

// run executes s for the operation (kind, seq) and returns when every step of
// every round is done, or at the first error.
func (e *engine) run(ctx context.Context, kind transport.OpKind, seq, aux uint64, s *algo.Schedule, bufs *opBuffers) error {
	clear(e.sendFrames)
	clear(e.recvFrames)
	e.dtype, e.op, e.aux = reduce.DType(s.DType), reduce.Op(s.Op), aux
	e.llTag = uint32(kind)
	if cap(e.scratch) < s.ScratchBytes {
		e.scratch = make([]byte, s.ScratchBytes)
	}
	bufs[algo.BufScratch] = e.scratch[:s.ScratchBytes]
	if e.slots != nil {
		if !e.slots.BeginBatch() {
			return fault.New(fault.ErrClosed, -1, "transport closed")
		}
		defer e.slots.EndBatch()
	}
	for r := 0; r < s.NumRounds(); r++ {
		if err := e.post(kind, seq, s.Algo, s.Round(r), bufs); err != nil {
			return err
		}
		if err := e.progress(ctx); err != nil {
			return err
		}
	}
	return nil
}

// post turns the steps of one round into transport operations; copies happen at once.
func (e *engine) post(kind transport.OpKind, seq uint64, a algo.Algo, steps []algo.Step, bufs *opBuffers) error {
	e.active, e.lls, e.llLeft = e.active[:0], e.lls[:0], 0
	e.copies, e.copied = e.copies[:0], 0
	e.vec.vecs, e.vec.stage = e.vec.vecs[:0], e.vec.stage[:0]
	nSend, nRecv := 0, 0
	oneSided := false
	for i := range steps {
		st := &steps[i]
		switch st.Kind {
		case algo.StepCopy:
			if e.vectored(st.Src.Buf) || e.vectored(st.Dst.Buf) {
				c, _, err := e.localCopyOf(st, bufs)
				if err != nil {
					return err
				}
				e.copies = append(e.copies, c)
				continue
			}
			src, dst, err := bufs.srcDst(st)
			if err != nil {
				return err
			}
			if len(dst) > 0 && &dst[0] != &src[0] { // in-place collectives copy a buffer onto itself
				e.addCopy(dst, src, false)
			}
		case algo.StepReduce:
			src, dst, err := bufs.srcDst(st)
			if err != nil {
				return err
			}
			if len(dst) != len(src) {
				return fault.New(fault.ErrInvalidArgument, -1, "schedule reduces %d bytes into %d", len(src), len(dst))
			}
			e.addCopy(dst, src, true)
		case algo.StepSend, algo.StepRecv, algo.StepRecvReduce:
			if st.Peer < 0 || st.Peer >= e.size || st.Peer == e.rank || st.Stream < 0 || st.Stream >= e.streams {
				return fault.New(fault.ErrInvalidArgument, st.Peer, "schedule step %s to peer %d stream %d", st.Kind, st.Peer, st.Stream)
			}
			h := transport.Header{Kind: kind, Algo: uint8(a), Stream: uint16(st.Stream), Epoch: e.epoch, Seq: seq, Aux: e.aux}
			if st.Last {
				h.Flags = transport.FlagLast
			}
			slot := st.Peer*e.streams + st.Stream
			conn := e.tr.Conn(st.Peer, st.Stream)
			watchLL := st.WatchLL && e.watchOf[st.Peer] != nil
			if st.Kind == algo.StepSend {
				h.Src = uint32(e.rank)
				h.Round = e.sendFrames[slot]
				e.sendFrames[slot]++
				if nSend == len(e.sendOps) {
					e.sendOps = append(e.sendOps, transport.SendOp{})
				}
				n, err := e.resetSend(&e.sendOps[nSend], h, bufs, st.Src, conn)
				if err != nil {
					return err
				}
				e.traffic.add(true, e.sameHost[st.Peer], n)
				e.active = append(e.active, activeOp{send: true, peer: st.Peer, stream: st.Stream, idx: nSend, conn: conn})
				nSend++
			} else if st.Kind == algo.StepRecv && e.vectored(st.Dst.Buf) {
				h.Src = uint32(st.Peer)
				h.Round = e.recvFrames[slot]
				e.recvFrames[slot]++
				if nRecv == len(e.recvOps) {
					e.recvOps = append(e.recvOps, transport.RecvOp{})
				}
				n, scatter, err := e.resetRecv(&e.recvOps[nRecv], h, bufs, st.Dst, conn)
				if err != nil {
					return err
				}
				e.traffic.add(false, e.sameHost[st.Peer], n)
				e.active = append(e.active, activeOp{peer: st.Peer, stream: st.Stream, idx: nRecv, scatter: scatter, conn: conn, watchLL: watchLL})
				nRecv++
			} else {
				landing := st.Dst
				if st.Kind == algo.StepRecvReduce {
					landing = st.Src
				}
				dst, err := bufs.span(landing)
				if err != nil {
					return err
				}
				var into, with []byte
				if st.Kind == algo.StepRecvReduce {
					if into, err = bufs.span(st.Dst); err != nil {
						return err
					}
					if len(into) != len(dst) {
						return fault.New(fault.ErrInvalidArgument, -1, "schedule reduces a %d-byte frame into %d bytes", len(dst), len(into))
					}
					if st.With.Len > 0 {
						if with, err = bufs.span(st.With); err != nil {
							return err
						}
						if len(with) != len(dst) {
							return fault.New(fault.ErrInvalidArgument, -1, "schedule combines a %d-byte frame with %d bytes", len(dst), len(with))
						}
					}
				}
				e.traffic.add(false, e.sameHost[st.Peer], len(dst))
				h.Src = uint32(st.Peer)
				h.Round = e.recvFrames[slot]
				e.recvFrames[slot]++
				if nRecv == len(e.recvOps) {
					e.recvOps = append(e.recvOps, transport.RecvOp{})
				}
				e.recvOps[nRecv].Reset(h, dst, false)
				e.active = append(e.active, activeOp{peer: st.Peer, stream: st.Stream, idx: nRecv, into: into, with: with,
					landedFirst: st.LandedFirst, conn: conn, watchLL: watchLL})
				nRecv++
			}
		case algo.StepStore, algo.StepLoad:
			if st.Peer < 0 || st.Peer >= e.size || st.Peer == e.rank {
				return fault.New(fault.ErrInvalidArgument, st.Peer, "schedule step %s to peer %d", st.Kind, st.Peer)
			}
			var err error
			if st.Kind == algo.StepStore && e.slotBytes(st.Peer) > 0 && e.crowded {
				oneSided = true // stored after the rest of the round
				continue
			}
			if st.Kind == algo.StepStore {
				nSend, err = e.postStore(kind, seq, st, bufs, nSend)
			} else {
				nRecv, err = e.postLoad(kind, seq, st, bufs, nRecv)
			}
			if err != nil {
				return err
			}
		default:
			return fault.New(fault.ErrInvalidArgument, -1, "schedule step kind %s not supported by the engine", st.Kind)
		}
	}
	// On a crowded host one-sided stores go last: each must fetch the
	// peer's cache line, and until the line arrives the core's later stores
	// queue behind it. After the rest of the round's bookkeeping, the
	// fetches overlap the first polls instead (4 ranks on 2 cores, 8 B
	// AllToAll: 3.58 -> 3.45 us). A rank with a core of its own stores
	// first: storing last, its first poll came too early and cost a
	// sched_yield round trip (2 ranks: 0.36 -> 0.64 us).
	if oneSided {
		for i := range steps {
			if st := &steps[i]; st.Kind == algo.StepStore && e.slotBytes(st.Peer) > 0 {
				if _, err := e.postStore(kind, seq, st, bufs, nSend); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// pushZero extends s by one zeroed element and returns it, to be filled
// field by field: appending a composite literal copies the whole struct,
// gathered-buffer fields included, with write barriers.
func pushZero[T any](s []T) ([]T, *T) {
	n := len(s)
	if n == cap(s) {
		var zero T
		s = append(s, zero)
	} else {
		s = s[:n+1]
		clear(s[n:])
	}
	return s, &s[n]
}

// addCopy adds a plain copy (or reduction) of src into dst to the round.
func (e *engine) addCopy(dst, src []byte, reduce bool) {
	var c *localCopy
	e.copies, c = pushZero(e.copies)
	c.dst, c.src, c.reduce = dst, src, reduce
}

// llHeader is the header of an LL message that travels as a frame: one per
// pair and op, on stream 0, with the LL algorithm id whatever the schedule's
// algorithm, so a peer expecting a data frame instead detects it.
func (e *engine) llHeader(kind transport.OpKind, seq uint64, src, peer int, send bool) transport.Header {
	h := transport.Header{Kind: kind, Algo: uint8(algo.AlgoLL), Flags: transport.FlagLast, Epoch: e.epoch, Seq: seq, Aux: e.aux, Src: uint32(src)}
	if send {
		h.Round = e.sendFrames[peer*e.streams]
		e.sendFrames[peer*e.streams]++
	} else {
		h.Round = e.recvFrames[peer*e.streams]
		e.recvFrames[peer*e.streams]++
	}
	return h
}

// postStore stores an LL message at once (it never waits), or posts it as a
// frame when the peer has no slot. It returns the next free send op index.
func (e *engine) postStore(kind transport.OpKind, seq uint64, st *algo.Step, bufs *opBuffers, nSend int) (int, error) {
	data, err := bufs.span(st.Src)
	if err != nil {
		return nSend, err
	}
	if st.CountOnly {
		data = e.countOut[8*st.Peer : 8*st.Peer+8]
		binary.LittleEndian.PutUint64(data, uint64(st.Src.Len))
	}
	e.traffic.add(true, e.sameHost[st.Peer], len(data))
	if room := e.slotBytes(st.Peer); room > 0 {
		if e.aux != 0 {
			// A frame carries the collective's signature in its header; a
			// one-sided message carries it after the data, so ranks that
			// run different reductions of one size are caught here too.
			e.sigOut = binary.LittleEndian.AppendUint64(append(e.sigOut[:0], data...), e.aux)
			data = e.sigOut
		}
		if len(data) > room {
			return nSend, fault.New(fault.ErrInvalidArgument, st.Peer, "LL block of %d bytes for a %d-byte slot", len(data), room)
		}
		if err := e.slotOf[st.Peer].Store(st.Peer, e.llEpoch, e.llTag, data); err != nil {
			return nSend, e.peerError(st.Peer, err)
		}
		return nSend, nil
	}
	if nSend == len(e.sendOps) {
		e.sendOps = append(e.sendOps, transport.SendOp{})
	}
	e.sendOps[nSend].Reset(e.llHeader(kind, seq, e.rank, st.Peer, true), data)
	e.active = append(e.active, activeOp{send: true, peer: st.Peer, idx: nSend, conn: e.tr.Conn(st.Peer, 0)})
	return nSend + 1, nil
}

// postLoad posts the receipt of an LL message: polled in the peer's slot, or
// a frame. It returns the next free receive op index.
func (e *engine) postLoad(kind transport.OpKind, seq uint64, st *algo.Step, bufs *opBuffers, nRecv int) (int, error) {
	dst, err := bufs.span(st.Dst)
	if err != nil {
		return nRecv, err
	}
	if st.CountOnly {
		dst = e.countIn[8*st.Peer : 8*st.Peer+8]
	}
	e.traffic.add(false, e.sameHost[st.Peer], len(dst))
	if e.slotBytes(st.Peer) > 0 {
		var l *llLoad
		e.lls, l = pushZero(e.lls)
		l.peer, l.slots, l.dst, l.announce, l.count = st.Peer, e.slotOf[st.Peer], dst, st.CountOnly, st.Dst.Len
		if e.aux != 0 { // the message ends with the signature (postStore)
			if e.sigIn == nil {
				e.sigIn = make([][]byte, e.size)
			}
			if cap(e.sigIn[st.Peer]) < len(dst)+8 {
				e.sigIn[st.Peer] = make([]byte, len(dst)+8)
			}
			l.dst, l.sigDst = e.sigIn[st.Peer][:len(dst)+8], dst
		}
		e.llLeft = len(e.lls)
		return nRecv, nil
	}
	if nRecv == len(e.recvOps) {
		e.recvOps = append(e.recvOps, transport.RecvOp{})
	}
	e.recvOps[nRecv].Reset(e.llHeader(kind, seq, st.Peer, st.Peer, false), dst, false)
	e.active = append(e.active, activeOp{peer: st.Peer, dst: dst, announce: st.CountOnly, count: st.Dst.Len, idx: nRecv, conn: e.tr.Conn(st.Peer, 0)})
	return nRecv + 1, nil
}

// checkSignature verifies the collective signature after the data of a
// one-sided message and moves the data to its destination.
func (e *engine) checkSignature(l *llLoad) error {
	n := len(l.sigDst)
	if got := binary.LittleEndian.Uint64(l.dst[n:]); got != e.aux {
		return fault.New(fault.ErrMismatch, l.peer, "collective mismatch: rank %d runs signature %#x, this rank %#x (root, operator, type or size differ)", l.peer, got, e.aux)
	}
	copy(l.sigDst, l.dst[:n])
	return nil
}

// checkCount verifies an LL length announcement from peer, landed in
// announced, against the block length this rank expects.
func checkCount(peer int, announced []byte, count int) error {
	if got := binary.LittleEndian.Uint64(announced); got != uint64(count) {
		return fault.New(fault.ErrMismatch, peer, "rank %d sends %d bytes, this rank expects %d", peer, got, count)
	}
	return nil
}

// pollLL polls the round's pending loads from slots once. It reports
// whether any made progress, and drops the finished ones from lls[:llLeft].
func (e *engine) pollLL(waited bool) (moved bool, err error) {
	for i := 0; i < e.llLeft; {
		l := &e.lls[i]
		before := l.load.Words
		if l.load.Known {
			before++
		}
		done, err := l.slots.Load(l.peer, e.llEpoch, e.llTag, l.dst, false, &l.load)
		if err != nil {
			return moved, e.peerError(l.peer, err)
		}
		if !done {
			after := l.load.Words
			if l.load.Known {
				after++
			}
			moved = moved || after != before
			i++
			continue
		}
		moved = true
		if l.announce {
			if err := checkCount(l.peer, l.dst, l.count); err != nil {
				return moved, err
			}
		}
		if l.sigDst != nil {
			if err := e.checkSignature(l); err != nil {
				return moved, err
			}
		}
		e.arrived(l.peer, waited)
		// Done: swap it past the pending ones.
		e.llLeft--
		e.lls[i], e.lls[e.llLeft] = e.lls[e.llLeft], e.lls[i]
	}
	return moved, nil
}

// arrived attributes the wait to peer, whose data just arrived.
func (e *engine) arrived(peer int, waited bool) {
	// Arrivals come in time order; without a wait since the last clock
	// read this one adds no waiting time.
	w := e.lastWait
	if waited && !e.opStart.IsZero() {
		w = time.Since(e.opStart)
	}
	if w >= e.lastWait {
		e.lastPeer, e.lastWait = peer, w
	}
}

// progress drives the posted operations to completion.
func (e *engine) progress(ctx context.Context) error {
	var idleStart time.Time
	waited := false // the engine has waited in this call: arrivals need a clock read
	// Idle passes before the first clock read, after the start and after
	// each progress. A rank that spins polls a while: small messages are
	// often a poll or two away, and a clock read between those polls
	// delays seeing them. Arrivals meanwhile add no waiting time to the
	// attribution. A crowded rank (no spin) reads the clock and yields
	// at once: yielding first, without the checks, doubled a 4-rank 8 B
	// AllToAll on 2 cores (5.5 -> 10.5 us).
	clockFree := 0
	if e.spin > 0 {
		clockFree = spinPolls
	}
	quiet := clockFree // idle passes left before the next clock read
	for {
		moved, err := e.pollLL(waited)
		if err != nil {
			return err
		}
		pending := e.llLeft
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
				if a.announce {
					if err := checkCount(a.peer, a.dst, a.count); err != nil {
						return err
					}
				}
				if a.scatter != nil {
					var c transport.VecCursor
					c.Scatter(a.scatter, e.recvOps[a.idx].Dst)
				}
				if a.into != nil {
					// Reduce at once: the next round may forward this result,
					// and the landed frame is still in cache.
					landed := e.recvOps[a.idx].Dst
					var err error
					switch {
					case a.with == nil:
						err = reduce.Reduce(e.dtype, e.op, a.into, landed)
					case a.landedFirst:
						err = reduce.ReduceTo(e.dtype, e.op, a.into, landed, a.with)
					default:
						err = reduce.ReduceTo(e.dtype, e.op, a.into, a.with, landed)
					}
					if err != nil {
						return fault.Wrap(fault.ErrInvalidArgument, -1, err, "reduction")
					}
				}
				if !a.send {
					e.arrived(a.peer, waited)
				}
				continue
			}
			if after != before {
				moved = true
			}
			if a.watchLL && after == 0 && e.watchOf[a.peer].Stored(a.peer, e.llEpoch) {
				return fault.New(fault.ErrMismatch, a.peer, "rank %d sent a block within the LL cutoff, this rank expects a larger one by frames", a.peer)
			}
			pending++
		}
		if pending == 0 {
			for {
				did, err := e.copySome()
				if err != nil {
					return err
				}
				if !did {
					return nil
				}
			}
		}
		did, err := e.copySome()
		if err != nil {
			return err
		}
		if moved || did {
			idleStart, quiet = time.Time{}, clockFree
			continue
		}
		if quiet > 0 {
			// Poll again without reading the clock, which costs as much as
			// a pass over the operations and delays the pass that sees the
			// data arrive.
			quiet--
			continue
		}
		now := time.Now()
		waited = true
		if idleStart.IsZero() {
			idleStart = now
		}
		if e.opStart.IsZero() {
			// Nobody timed the start (no Observer): the wait attribution
			// counts from the first wait, which read the clock anyway.
			e.opStart = now
		}
		idle := now.Sub(idleStart)
		if idle < e.spin {
			quiet = spinPolls
			if e.sharedProcess {
				// Other ranks are goroutines of this process (tests,
				// in-process groups): let them run instead of spinning a
				// whole time slice. A rank alone in its process does not:
				// Gosched hands the goroutine to another thread when
				// GOMAXPROCS > 1, a futex wake and sleep per poll.
				runtime.Gosched()
			}
			continue
		}
		if err := e.checkStop(ctx, now); err != nil {
			return err
		}
		if err := e.pause(idle, now, e.deadline); err != nil {
			return err
		}
	}
}

// spinPolls is how many passes over the operations a spinning engine makes
// between two clock reads: a pass that finds nothing takes tens of ns, so
// the spin still ends within a few us of Config.Spin.
const spinPolls = 32

// pause waits once for an operation idle for idle (past the spin): it yields
// the core until spin+yield, then parks in Transport.Wait until deadline, at
// most maxPark.
func (e *engine) pause(idle time.Duration, now, deadline time.Time) error {
	if idle < e.spin+e.yield {
		if e.sharedProcess {
			runtime.Gosched() // sched_yield alone keeps this goroutine's P
		}
		if e.crowded && !e.sharedProcess && e.placer != nil && now.Sub(e.placed) >= rebalanceEvery {
			e.placed = now
			e.placer.Rebalance()
		}
		schedYield() // let an oversubscribed peer rank run on this core
		return nil
	}
	return e.tr.Wait(min(deadline.Sub(now), maxPark))
}

// rebalanceEvery is how often a crowded rank that yields looks at how the
// host's ranks sit on its CPUs (Placer), ~0.3 us a look. By time, not by
// yields: a rank that shares its CPU yields less often than one alone on
// its CPU, and it is the one that must move.
const rebalanceEvery = time.Millisecond

// copySome does up to copyChunk bytes of the round's local copies and
// reports whether there was anything to copy. The engine calls it when the
// network has nothing for it, so local copies fill the gaps of the transfers.
func (e *engine) copySome() (bool, error) {
	if e.copied == len(e.copies) {
		return false, nil
	}
	c := &e.copies[e.copied]
	if c.sv != nil {
		if copyVecSome(c) {
			e.copied++
		}
		return true, nil
	}
	n := min(len(c.dst), copyChunk) // copyChunk is a multiple of every element size
	if c.reduce {
		if err := reduce.Reduce(e.dtype, e.op, c.dst[:n], c.src[:n]); err != nil {
			return false, fault.Wrap(fault.ErrInvalidArgument, -1, err, "reduction")
		}
	} else {
		copy(c.dst[:n], c.src)
	}
	c.dst, c.src = c.dst[n:], c.src[n:]
	if len(c.dst) == 0 {
		e.copied++
	}
	return true, nil
}

// startOp resets the per-operation figures (bytes, wait attribution) for an
// operation that started at start (the zero Time: nobody reads its waits),
// whose schedules add to them, and sets its deadline: the given one, or, if
// that is zero, timeout after the operation first waits.
func (e *engine) startOp(start, deadline time.Time) {
	e.opStart, e.deadline, e.traffic = start, deadline, traffic{}
	e.lastPeer, e.lastWait = -1, 0
}

// traffic is what one operation moved to and from other ranks, in bytes,
// with the part exchanged with ranks of this host.
type traffic struct {
	sent, received           int64
	sentLocal, receivedLocal int64
}

func (t *traffic) add(send, local bool, n int) {
	switch {
	case send && local:
		t.sent, t.sentLocal = t.sent+int64(n), t.sentLocal+int64(n)
	case send:
		t.sent += int64(n)
	case local:
		t.received, t.receivedLocal = t.received+int64(n), t.receivedLocal+int64(n)
	default:
		t.received += int64(n)
	}
}

// fill copies the totals into an event.
func (t traffic) fill(ev *OpEvent) {
	ev.BytesSent, ev.BytesReceived = t.sent, t.received
	ev.BytesSentLocal, ev.BytesReceivedLocal = t.sentLocal, t.receivedLocal
}

// schedYield gives the core to another runnable thread of any process; Go's
// runtime.Gosched only yields to goroutines of this process.
func schedYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// checkStop reports why the operation must stop waiting: abort, cancellation
// or deadline. The first call of an operation without a deadline sets it.
func (e *engine) checkStop(ctx context.Context, now time.Time) error {
	if e.deadline.IsZero() {
		e.deadline = now.Add(e.timeout)
	}
	if err := e.stopped(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return ctxError(err)
	}
	if !now.Before(e.deadline) {
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
