package shm

import (
	"sync/atomic"
	"unsafe"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// llPeer is the LL state of one local peer: the slots this rank stores into
// (in the peer's segment) and loads from (in this rank's), and the watch of a
// load that could not finish. The views are fixed at Open; idle and watch
// belong to the goroutine loading from the peer (watch is read by Wait).
type llPeer struct {
	tx [2][]uint64 // by parity: this rank's slot in the peer's window
	rx [2][]uint64 // by parity: the peer's slot in this rank's window
	// rxWord is the index of rx[p][0] in t.window, for the watch.
	rxWord [2]uint32

	_       [lineSize]byte // the loading goroutine writes below
	idle    uint32         // fruitless loads, for the pidfd poll
	watch   atomic.Uint64  // epoch<<32 | index in t.window of the awaited word, or 0
	bellDue bool           // in a batch: a Store left the peer's wake-up for later
	_       [lineSize]byte
}

// words is the []uint64 view of n words of mem at off (8-byte aligned).
func words(mem []byte, off, n int) []uint64 {
	if n == 0 {
		return nil
	}
	_ = mem[off+8*n-1]
	return unsafe.Slice((*uint64)(unsafe.Pointer(&mem[off])), n)
}

// initSlots sets up the views of every LL slot once all segments are mapped.
func (t *Transport) initSlots() {
	if t.cfg.SlotBytes == 0 {
		return
	}
	n := len(t.cfg.Local)
	base := windowBase(n, t.streams, t.cfg.RingBytes)
	stride := slotStride(t.cfg.SlotBytes)
	nw := 1 + transport.PackedWords(t.cfg.SlotBytes)
	t.window = words(t.own.mem, base, (n-1)*2*stride/8)
	t.ll = make([]llPeer, n)
	for i := range n {
		if i == t.me {
			continue
		}
		p := &t.ll[i]
		for par := range 2 {
			// Slot of source src in owner's window, like ringIndex.
			tx := (2*t.srcIndex(i, t.me) + par) * stride
			rx := (2*t.srcIndex(t.me, i) + par) * stride
			p.tx[par] = words(t.segs[i].mem, base+tx, nw)
			p.rx[par] = words(t.own.mem, base+rx, nw)
			p.rxWord[par] = uint32(rx / 8)
		}
	}
}

// llPeer returns the LL state of world rank peer, or nil when this rank has
// no LL slot with it.
func (t *Transport) llPeer(peer int) (*llPeer, int) {
	if t.ll == nil || peer < 0 || peer >= t.size || peer == t.rank {
		return nil, -1
	}
	i := t.localIdx[peer]
	if i < 0 {
		return nil, -1
	}
	return &t.ll[i], i
}

// SlotBytes is the payload capacity of one LL message to peer: Config.SlotBytes
// for a local peer, 0 for this rank, a rank on another host, a rank outside
// the world, or when LL slots are off.
func (t *Transport) SlotBytes(peer int) int {
	if p, _ := t.llPeer(peer); p == nil {
		return 0
	}
	return t.cfg.SlotBytes
}

// Store writes data into this rank's slot of parity epoch&1 in peer's window
// in the packed form of the LL slot format (transport.EncodePacked): the
// payload copied as it is, then the length word with a release store, which
// orders it before it. A parked receiver is woken: at once, or in a batch
// (BeginBatch) when the batch first waits or ends. It never blocks. Errors:
// fault.ErrClosed after Close, fault.ErrInvalidArgument for more than
// SlotBytes(peer) bytes, a peer without a slot or an epoch below
// transport.FirstEpoch, fault.ErrPeerLost when peer closed or exited. The
// bytes it counts in Stats are the words it stores, 8 bytes each (the
// payload rounded up to words, plus the length word).
func (t *Transport) Store(peer int, epoch uint32, tag uint32, data []byte) error {
	if t.batch {
		return t.store(peer, epoch, tag, data)
	}
	if err := t.guard.Enter(t.closedErr); err != nil {
		return err
	}
	err := t.store(peer, epoch, tag, data)
	t.guard.Release()
	return err
}

func (t *Transport) store(peer int, epoch uint32, tag uint32, data []byte) error {
	p, i := t.llPeer(peer)
	if err := t.slots.CheckStore(peer, p != nil, epoch, tag, len(data)); err != nil {
		return err
	}
	if err := t.goneErr(i, -1); err != nil {
		return err
	}
	w := p.tx[epoch&1]
	storeRelease(&w[0], transport.EncodePacked(w, epoch, tag, data))
	t.stats[i].llSent.add(uint64(8 * (1 + transport.PackedWords(len(data)))))
	if t.batch {
		p.bellDue, t.bellsDue = true, true
		return nil
	}
	t.fence.Add(1) // as in ringDue: the stores are visible before the check
	ringBell(t.segs[i])
	return nil
}

// BeginBatch starts a batch of Stores and Loads (see transport.Slots).
func (t *Transport) BeginBatch() bool {
	if !t.guard.Acquire() {
		return false
	}
	t.batch = true
	return true
}

// EndBatch ends the batch BeginBatch started.
func (t *Transport) EndBatch() {
	t.ringDue()
	t.batch = false
	t.guard.Release()
}

// ringDue wakes the parked peers whose slots a batch stored into since it
// last ran, when the batch waits or ends (a Store outside a batch rings at
// once). Until then a parked peer may sleep on; it re-checks within maxPark
// of its own.
func (t *Transport) ringDue() {
	if !t.bellsDue {
		return
	}
	t.bellsDue = false
	// A locked instruction: the stores become visible before the reads of
	// whether the peers sleep (Wait announces sleep, then re-checks).
	t.fence.Add(1)
	for i := range t.ll {
		if p := &t.ll[i]; p.bellDue {
			p.bellDue = false
			ringBell(t.segs[i])
		}
	}
}

// Load takes what peer stored for epoch into dst (see transport.Slots and
// transport.SlotWindow.TakePacked): once the length word carries epoch, the
// whole message.
//
// A load that cannot finish fails with fault.ErrPeerLost once peer is gone
// (after taking what peer stored before), and with fault.ErrMismatch when a
// frame from peer waits on stream 0 (the first frame of every message travels
// there; not once the Conns are shared, ShareConns), unless the slot is
// complete after all: a peer that stores before it
// sends (x86 keeps stores in order) cannot be caught between the two. The
// check reads the receive state of that stream, so Load must run on the
// goroutine that drives its receives (the engine's), and no receive from peer
// may be in flight during an LL load. Otherwise it leaves the word it waits
// for to Wait, which returns once that word carries epoch.
//
// Bytes counted in Stats are 8 per word, once the message is complete.
func (t *Transport) Load(peer int, epoch uint32, tag uint32, dst []byte, anyLen bool, st *transport.SlotLoad) (bool, error) {
	if t.batch {
		return t.load(peer, epoch, tag, dst, anyLen, st)
	}
	if err := t.guard.Enter(t.closedErr); err != nil {
		return false, err
	}
	done, err := t.load(peer, epoch, tag, dst, anyLen, st)
	t.guard.Release()
	return done, err
}

func (t *Transport) load(peer int, epoch uint32, tag uint32, dst []byte, anyLen bool, st *transport.SlotLoad) (bool, error) {
	p, i := t.llPeer(peer)
	if err := t.slots.CheckLoad(peer, p != nil, epoch, len(dst), anyLen); err != nil {
		return false, err
	}
	w := p.rx[epoch&1]
	done, err := t.slots.TakePacked(peer, w, epoch, tag, dst, anyLen, st)
	if !done && err == nil {
		done, err = t.loadStall(p, i, peer, w, epoch, tag, dst, anyLen, st)
	}
	if done || err != nil {
		if p.watch.Load() != 0 {
			p.watch.Store(0)
		}
		if done {
			t.stats[i].llRecvd.add(uint64(8 * (1 + transport.PackedWords(st.Len))))
		}
	}
	return done, err
}

// Stored reports whether peer stored a message for epoch (see
// transport.SlotWatcher): its length word carries epoch (a packed slot has
// no other sign; the length word comes last, so a message seen is whole).
// Otherwise it watches the length word, so that Wait returns once the peer
// stores. After Close it reports false.
func (t *Transport) Stored(peer int, epoch uint32) bool {
	if t.batch {
		return t.stored(peer, epoch)
	}
	if !t.guard.Acquire() {
		return false
	}
	defer t.guard.Release()
	return t.stored(peer, epoch)
}

func (t *Transport) stored(peer int, epoch uint32) bool {
	p, _ := t.llPeer(peer)
	if p == nil || epoch < transport.FirstEpoch {
		return false
	}
	if transport.PackedStored(p.rx[epoch&1], epoch) {
		return true
	}
	if watch := uint64(epoch)<<32 | uint64(p.rxWord[epoch&1]); p.watch.Load() != watch {
		p.watch.Store(watch)
	}
	return false
}

// loadStall handles a load that cannot finish now (see Load).
func (t *Transport) loadStall(p *llPeer, i, peer int, w []uint64, epoch, tag uint32, dst []byte, anyLen bool, st *transport.SlotLoad) (bool, error) {
	if err := t.goneErr(i, -1); err != nil {
		// What the peer stored before it went still counts.
		if done, err := t.slots.TakePacked(peer, w, epoch, tag, dst, anyLen, st); done || err != nil {
			return done, err
		}
		return false, err
	}
	if p.idle++; p.idle%pollEvery == 0 {
		t.checkPeer(i)
	}
	if c := t.conns[peer*t.streams]; !t.shared.Load() && c.rhead == c.rend && c.rdst == nil {
		if slot := alignFrag(c.rend); c.rx.stamp(slot).Load() > slot+8 {
			// The peer sent a frame. Stores become visible in order: had it
			// stored the LL message first, the message is complete now.
			if done, err := t.slots.TakePacked(peer, w, epoch, tag, dst, anyLen, st); done || err != nil {
				return done, err
			}
			return false, fault.New(fault.ErrMismatch, peer,
				"shm: rank %d sent a large message (a frame) while this rank waits for a small one (LL, epoch %d): the ranks call different collectives, or disagree on the counts", peer, epoch)
		}
	}
	// Wait returns once the length word carries epoch: in a packed slot
	// the message is whole then.
	at := p.rxWord[epoch&1]
	if watch := uint64(epoch)<<32 | uint64(at); p.watch.Load() != watch {
		p.watch.Store(watch)
	}
	return false, nil
}

// slotsReady reports whether a load Wait waits for may progress: its word
// carries the awaited epoch now, or its peer is gone.
func (t *Transport) slotsReady() bool {
	for i := range t.ll {
		w := t.ll[i].watch.Load()
		if w == 0 {
			continue
		}
		if atomic.LoadUint64(&t.window[uint32(w)])>>32 == w>>32 || t.gone(i) {
			return true
		}
	}
	return false
}
