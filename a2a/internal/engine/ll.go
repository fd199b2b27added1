package engine

import (
	"encoding/binary"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// llState is the engine's side of the LL protocol: the transport's
// one-sided window, the slot capacity by peer (0: none, the pair's LL
// messages go as frames), the epoch of the next run, and the round's loads.
type llState struct {
	window transport.Slots   // nil without one
	slotOf []transport.Slots // by peer: the part of window that reaches it
	// watchOf, by peer: the part of window that lets this rank see a message
	// it does not expect (Step.WatchLL), nil where none does.
	watchOf []transport.SlotWatcher
	room    []int
	epoch   uint32
	tag     uint32 // the op kind, which LL messages carry
	// The 8-byte length announcements by peer.
	countOut, countIn []byte
	// Staging of one-sided messages that carry a collective's signature
	// after their data: the one being stored, and by peer the ones loading.
	sigOut []byte
	sigIn  [][]byte
	// The round's loads from slots; loads[:left] are pending.
	loads []llLoad
	left  int
}

// llLoad is an LL message awaited in a peer's slot. These sit in a list of
// their own (llState.loads), polled ahead of the frames with none of a
// frame's bookkeeping: a round of LL messages only (a small AllToAllV,
// Barrier, a small AllReduce) runs without touching activeOp.
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
	// into, when set, is where the landed message is reduced once in:
	// into = with op landed (landed op with when landedFirst).
	into, with  []byte
	landedFirst bool
}

// newLLState reads the transport's window. Slot capacities are fixed when
// the transport opens; every LL step asks, so they are read once.
func newLLState(tr transport.Transport, rank, size int) llState {
	window, _ := tr.(transport.Slots)
	s := llState{window: window, room: make([]int, size), slotOf: make([]transport.Slots, size),
		watchOf: make([]transport.SlotWatcher, size), epoch: transport.FirstEpoch,
		countOut: make([]byte, 8*size), countIn: make([]byte, 8*size)}
	for peer := range s.room {
		if window == nil || peer == rank {
			continue
		}
		s.room[peer], s.slotOf[peer] = window.SlotBytes(peer), window
		if m, ok := tr.(transport.PeerSlots); ok {
			s.slotOf[peer] = m.SlotsOf(peer) // one hop less per store and poll
		}
		if s.room[peer] > 0 {
			s.watchOf[peer], _ = s.slotOf[peer].(transport.SlotWatcher)
		}
	}
	return s
}

// SlotBytes is what one LL store to peer may carry one-sided; 0 when the
// pair's LL messages travel as frames.
func (e *Engine) SlotBytes(peer int) int { return e.ll.room[peer] }

// Watches reports whether this rank can see, in peer's slot, an LL message
// it did not expect (transport.SlotWatcher), so that the pair needs no
// length announcement.
func (e *Engine) Watches(peer int) bool { return e.ll.watchOf[peer] != nil }

// NextLLEpoch moves to the next LL epoch. The caller does it after an
// operation in which every pair exchanged something (an all-to-all shaped
// one): a peer that starts the next operation has then finished reading the
// slots of the previous epoch of the same parity.
func (e *Engine) NextLLEpoch() { e.ll.epoch = transport.NextEpoch(e.ll.epoch) }

// llHeader is the header of an LL message that travels as a frame: one per
// pair and op, on stream 0, with the LL algorithm id whatever the schedule's
// algorithm, so a peer expecting a data frame instead detects it.
func (e *Engine) llHeader(id opID, src, peer int, send bool) transport.Header {
	h := transport.Header{Kind: id.kind, Algo: uint8(algo.AlgoLL), Flags: transport.FlagLast, Epoch: e.epoch, Seq: id.seq, Aux: e.aux, Src: uint32(src)}
	h.Round = e.frames.next(send, peer*e.streams)
	return h
}

// checkOneSidedPeer refuses an LL step to a peer outside the group or to
// this rank.
func (e *Engine) checkOneSidedPeer(st *algo.Step) error {
	if st.Peer < 0 || st.Peer >= e.size || st.Peer == e.rank {
		return fault.New(fault.ErrInvalidArgument, st.Peer, "schedule step %s to peer %d", st.Kind, st.Peer)
	}
	return nil
}

// postStore stores an LL message at once (it never waits), or posts it as a
// frame when the peer has no slot. On a crowded host a one-sided store is
// left for after the rest of the round (later): each must fetch the peer's
// cache line, and until the line arrives the core's later stores queue
// behind it. After the rest of the round's bookkeeping, the fetches overlap
// the first polls instead (4 ranks on 2 cores, 8 B AllToAll: 3.58 -> 3.45
// us). A rank with a core of its own stores first: storing last, its first
// poll came too early and cost a sched_yield round trip (2 ranks: 0.36 ->
// 0.64 us).
func (e *Engine) postStore(id opID, st *algo.Step, bufs *Buffers) (later bool, err error) {
	if err := e.checkOneSidedPeer(st); err != nil {
		return false, err
	}
	if e.ll.room[st.Peer] > 0 && e.wait.Crowded {
		return true, nil
	}
	return false, e.store(id, st, bufs)
}

// postDeferredStores stores the round's one-sided messages postStore left
// for last.
func (e *Engine) postDeferredStores(id opID, steps []algo.Step, bufs *Buffers) error {
	for i := range steps {
		if st := &steps[i]; st.Kind == algo.StepStore && e.ll.room[st.Peer] > 0 {
			if err := e.store(id, st, bufs); err != nil {
				return err
			}
		}
	}
	return nil
}

// store stores an LL message into the peer's slot, or posts it as a frame
// when the peer has none.
func (e *Engine) store(id opID, st *algo.Step, bufs *Buffers) error {
	data, err := bufs.span(st.Src)
	if err != nil {
		return err
	}
	if st.CountOnly {
		data = e.ll.countOut[8*st.Peer : 8*st.Peer+8]
		binary.LittleEndian.PutUint64(data, uint64(st.Src.Len))
	}
	e.op.traffic.Add(true, e.op.sameHost[st.Peer], len(data))
	if room := e.ll.room[st.Peer]; room > 0 {
		if e.aux != 0 {
			// A frame carries the collective's signature in its header; a
			// one-sided message carries it after the data, so ranks that
			// run different reductions of one size are caught here too.
			e.ll.sigOut = binary.LittleEndian.AppendUint64(append(e.ll.sigOut[:0], data...), e.aux)
			data = e.ll.sigOut
		}
		if len(data) > room {
			return fault.New(fault.ErrInvalidArgument, st.Peer, "small message (LL) of %d bytes for rank %d, whose mailbox (LL slot) holds %d", len(data), st.Peer, room)
		}
		if err := e.ll.slotOf[st.Peer].Store(st.Peer, e.ll.epoch, e.ll.tag, data); err != nil {
			return fault.ForPeer(st.Peer, err)
		}
		return nil
	}
	op, idx := e.round.nextSendOp()
	op.Reset(e.llHeader(id, e.rank, st.Peer, true), data)
	e.round.active = append(e.round.active, activeOp{send: true, peer: st.Peer, idx: idx, conn: e.conns.Conn(st.Peer, 0)})
	return nil
}

// postLoad posts the receipt of an LL message: polled in the peer's slot, or
// a frame.
func (e *Engine) postLoad(id opID, st *algo.Step, bufs *Buffers) error {
	if err := e.checkOneSidedPeer(st); err != nil {
		return err
	}
	landing := st.Dst
	if st.With.Len > 0 {
		landing = st.Src // reduced into Dst on arrival (algo.StepLoad)
	}
	dst, err := bufs.span(landing)
	if err != nil {
		return err
	}
	var into, with []byte
	if st.With.Len > 0 {
		if into, with, err = reduceSpans(bufs, st, len(dst)); err != nil {
			return err
		}
	}
	if st.CountOnly {
		dst = e.ll.countIn[8*st.Peer : 8*st.Peer+8]
	}
	e.op.traffic.Add(false, e.op.sameHost[st.Peer], len(dst))
	if e.ll.room[st.Peer] > 0 {
		l := e.addLoad(st, dst)
		l.into, l.with, l.landedFirst = into, with, st.LandedFirst
		return nil
	}
	op, idx := e.round.nextRecvOp()
	op.Reset(e.llHeader(id, st.Peer, st.Peer, false), dst, false)
	e.round.active = append(e.round.active, activeOp{peer: st.Peer, dst: dst, announce: st.CountOnly, count: st.Dst.Len, idx: idx, conn: e.conns.Conn(st.Peer, 0),
		into: into, with: with, landedFirst: st.LandedFirst})
	return nil
}

// addLoad adds the load of an LL message into dst from the peer's slot.
func (e *Engine) addLoad(st *algo.Step, dst []byte) *llLoad {
	var l *llLoad
	e.ll.loads, l = pushZero(e.ll.loads)
	l.peer, l.slots, l.dst, l.announce, l.count = st.Peer, e.ll.slotOf[st.Peer], dst, st.CountOnly, st.Dst.Len
	if e.aux != 0 { // the message ends with the signature (store)
		if e.ll.sigIn == nil {
			e.ll.sigIn = make([][]byte, e.size)
		}
		if cap(e.ll.sigIn[st.Peer]) < len(dst)+8 {
			e.ll.sigIn[st.Peer] = make([]byte, len(dst)+8)
		}
		l.dst, l.sigDst = e.ll.sigIn[st.Peer][:len(dst)+8], dst
	}
	e.ll.left = len(e.ll.loads)
	return l
}

// checkSignature verifies the collective signature after the data of a
// one-sided message and moves the data to its destination, unless it landed
// there (an LLPlan's reducing load reduces from where it landed; copy would
// move it onto itself).
func (e *Engine) checkSignature(l *llLoad) error {
	n := len(l.sigDst)
	if got := binary.LittleEndian.Uint64(l.dst[n:]); got != e.aux {
		return fault.New(fault.ErrMismatch, l.peer, "collective mismatch: rank %d runs signature %#x, this rank %#x (root, operator, type or size differ)", l.peer, got, e.aux)
	}
	if n > 0 && &l.sigDst[0] != &l.dst[0] {
		copy(l.sigDst, l.dst[:n])
	}
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

// loadProgress is how far a load has come: its data words, and its length
// word once known.
func loadProgress(l *transport.SlotLoad) int {
	if l.Known {
		return l.Words + 1
	}
	return l.Words
}

// pollLL polls the round's pending loads from slots once. It reports
// whether any made progress, and drops the finished ones from loads[:left].
func (e *Engine) pollLL(waited bool) (moved bool, err error) {
	for i := 0; i < e.ll.left; {
		l := &e.ll.loads[i]
		before := loadProgress(&l.load)
		done, err := l.slots.Load(l.peer, e.ll.epoch, e.ll.tag, l.dst, false, &l.load)
		if err != nil {
			return moved, fault.ForPeer(l.peer, err)
		}
		if !done {
			moved = moved || loadProgress(&l.load) != before
			i++
			continue
		}
		moved = true
		if err := e.loaded(l); err != nil {
			return moved, err
		}
		e.op.arrived(l.peer, waited)
		// Done: swap it past the pending ones.
		e.ll.left--
		e.ll.loads[i], e.ll.loads[e.ll.left] = e.ll.loads[e.ll.left], e.ll.loads[i]
	}
	return moved, nil
}

// loaded checks a load that completed: its length announcement or its
// collective signature.
func (e *Engine) loaded(l *llLoad) error {
	if l.announce {
		if err := checkCount(l.peer, l.dst, l.count); err != nil {
			return err
		}
	}
	if l.sigDst != nil {
		if err := e.checkSignature(l); err != nil {
			return err
		}
	}
	if l.into == nil {
		return nil
	}
	landed := l.dst
	if l.sigDst != nil {
		landed = l.sigDst
	}
	return e.reduceInto(l.into, l.with, landed, l.landedFirst)
}
