package verbs

import (
	"time"
	"unsafe"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
	ibv "github.com/a2a-moe/a2a/verbs"
)

// llState is the LL window over RDMA (transport.Slots). Every rank
// registers a window with, per source rank, two slots chosen by epoch
// parity, and announces its address and rkey. A Store encodes the message
// in the LL slot format (transport.EncodeSlot: 8-byte words of 4 payload
// bytes and the epoch, a length word len|tag|epoch) into a registered
// staging slot and RDMA WRITEs it WITH IMM into its slot of the peer's
// window on stream 0's QP: the immediate wakes a parked receiver, and RC
// ordering places the store before any frame the peer sends after it. The device may place the words in any order; a Load
// takes only words that carry the epoch, so a message is complete when
// every word it announces does. Used under Transport.mu.
type llState struct {
	t       *Transport
	slot    transport.SlotWindow // the slots' capacity is slot.Bytes
	stride  int
	win     []uint64 // this rank's window: (source rank*2+parity)*stride/8
	out     []uint64 // staging: (target rank*2+parity)*stride/8
	outAddr uint64
	outKey  uint32
	remote  []llRemote // by peer
	batch   bool
}

type llRemote struct {
	addr uint64 // the peer's window base
	key  uint32
}

func words(b []byte) []uint64 {
	if len(b) < 8 {
		return nil
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), len(b)/8)
}

func (l *llState) init(t *Transport, remotes []remoteEndpoint) {
	l.t = t
	g := t.geo
	if g.SlotBytes == 0 {
		return
	}
	l.slot = transport.SlotWindow{Name: "verbs", Rank: t.rank, Bytes: g.SlotBytes}
	l.stride = llStride(g.SlotBytes)
	l.win = words(t.dev.window.mem[:g.Size*2*l.stride])
	off := g.Size * g.Streams * ctlBytes
	l.out = words(t.dev.ctl.mem[off : off+g.Size*2*l.stride])
	l.outAddr, l.outKey = t.dev.ctl.mr.Addr()+uint64(off), t.dev.ctl.mr.LKey()
	l.remote = make([]llRemote, g.Size)
	for q, re := range remotes {
		l.remote[q] = llRemote{re.WinAddr, re.WinKey}
	}
}

// slotWord is the index of the first word of the slot of peer (the source
// in win, the target in out) and parity epoch&1.
func (l *llState) slotWord(peer int, epoch uint32) int {
	return (peer*2 + int(epoch&1)) * l.stride / 8
}

// inSlot is the slot of peer and parity epoch&1 in this rank's window: the
// length word and the data words of a full slot.
func (l *llState) inSlot(peer int, epoch uint32) []uint64 {
	i := l.slotWord(peer, epoch)
	return l.win[i : i+1+transport.SlotWords(l.slot.Bytes)]
}

// conn0 is the stream-0 conn to peer when peer has an LL slot here.
func (l *llState) conn0(peer int) *conn {
	t := l.t
	if l.slot.Bytes == 0 || peer < 0 || peer >= t.size || l.remote[peer].key == 0 {
		return nil
	}
	return t.conns[peer*t.streams]
}

// SlotBytes is the LL payload one Store to peer may carry: the slot size
// for every peer this transport reaches, 0 when LL slots are off.
func (t *Transport) SlotBytes(peer int) int {
	if t.ll.conn0(peer) == nil {
		return 0
	}
	return t.ll.slot.Bytes
}

// BeginBatch starts a batch of Stores and Loads (see transport.Slots): the
// calls in it skip the guard against Close.
func (t *Transport) BeginBatch() bool {
	if !t.guard.Acquire() {
		return false
	}
	t.ll.batch = true
	return true
}

// EndBatch ends the batch BeginBatch started.
func (t *Transport) EndBatch() {
	t.ll.batch = false
	t.guard.Release()
}

// Store writes data into this rank's slot of parity epoch&1 in peer's
// window (see llState). It never blocks: the write is posted, not awaited.
// Errors: fault.ErrClosed after Close, fault.ErrInvalidArgument for more
// than SlotBytes(peer) bytes, a peer without a slot, a bad epoch or tag,
// fault.ErrPeerLost when the peer is gone. Stats count the words written.
func (t *Transport) Store(peer int, epoch uint32, tag uint32, data []byte) error {
	if !t.ll.batch {
		if err := t.guard.Enter(t.closedErr); err != nil {
			return err
		}
		defer t.guard.Release()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	l := &t.ll
	c := l.conn0(peer)
	if err := l.slot.CheckStore(peer, c != nil, epoch, tag, len(data)); err != nil {
		return err
	}
	if c.lost != nil {
		return c.lost
	}
	slot := l.slotWord(peer, epoch)
	nw := transport.SlotWords(len(data))
	w := l.out[slot : slot+1+nw]
	w[0] = transport.EncodeSlot(w, epoch, tag, data)
	if err := c.awaitRoom(); err != nil {
		return err
	}
	n := 8 * (1 + nw)
	own := (t.rank*2 + int(epoch&1)) * l.stride
	c.sge[0] = ibv.SGE{Addr: l.outAddr + uint64(slot*8), Length: uint32(n), LKey: l.outKey}
	flags := ibv.SendSignaled
	if n <= t.dev.inline {
		// Copied into the work request: the device need not read the
		// staging (8 B one way in the lab: 46 us p50 from the staging).
		flags |= ibv.SendInline
	}
	err := c.post(ibv.SendWR{ID: wrID(c.idx, wrLL, 0), Op: ibv.OpRDMAWriteWithImm, Flags: flags,
		Imm: immLL | c.takeCredits(), RemoteAddr: l.remote[peer].addr + uint64(own), RKey: l.remote[peer].key}, c.sge[:1])
	if err != nil {
		return err
	}
	t.sent[peer].Add(uint64(n))
	return nil
}

// awaitRoom polls until c's send queue has room for one more request. The
// queue drains as the peer acknowledges; a full one (a stream busy with
// many chunks) empties within round trips. The clock is read only once the
// queue is full: in the lab (HPET clock source) a read is a system call of
// microseconds, on the path of every LL store.
func (c *conn) awaitRoom() error {
	if !c.sqFull() {
		return nil
	}
	t := c.t
	for end := time.Now().Add(time.Second); c.sqFull(); {
		if err := t.poll(); err != nil {
			return err
		}
		if c.lost != nil {
			return c.lost
		}
		if time.Now().After(end) {
			return fault.New(fault.ErrPeerLost, c.peer, "verbs: the send queue to rank %d stays full", c.peer)
		}
	}
	return nil
}

// Load takes what peer stored for epoch into dst (see transport.Slots and
// llState). A load that cannot finish polls the completion queue and fails
// with fault.ErrPeerLost once the peer is gone, and with fault.ErrMismatch
// when a frame from peer waits on stream 0 while the message is still
// incomplete: the peer stores before it sends on that QP, so a peer running
// the same operation cannot be caught between the two.
func (t *Transport) Load(peer int, epoch uint32, tag uint32, dst []byte, anyLen bool, st *transport.SlotLoad) (bool, error) {
	if !t.ll.batch {
		if err := t.guard.Enter(t.closedErr); err != nil {
			return false, err
		}
		defer t.guard.Release()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	l := &t.ll
	c := l.conn0(peer)
	if err := l.slot.CheckLoad(peer, c != nil, epoch, len(dst), anyLen); err != nil {
		return false, err
	}
	w := l.inSlot(peer, epoch)
	done, err := l.take(peer, w, epoch, tag, dst, anyLen, st)
	if done || err != nil {
		return done, err
	}
	if err := t.poll(); err != nil {
		return false, err
	}
	framed := c.rin != c.rhead
	if done, err := l.take(peer, w, epoch, tag, dst, anyLen, st); done || err != nil {
		return done, err
	}
	if c.lost != nil {
		return false, c.lost
	}
	if framed {
		return false, fault.New(fault.ErrMismatch, peer,
			"verbs: rank %d sent a large message (a frame) while this rank waits for a small one (LL, epoch %d): the ranks call different collectives, or disagree on the counts", peer, epoch)
	}
	return false, nil
}

// Stored reports whether peer stored a message, or began to, for epoch (see
// transport.SlotWatcher): the length word or the first data word of its
// slot of parity epoch&1 in this rank's window carries epoch (the device
// may place the words in any order). When neither does yet, it polls the
// completion queue once, as Load does, and looks again.
//
// It arms nothing, and need not: the peer's store is an RDMA WRITE WITH
// IMM, which consumes a receive of stream 0's QP and so completes on this
// rank's CQ; the CQ is kept armed, and Wait returns for a completion that
// arrives while it sleeps, for one that arrived before it armed (it polls
// after arming), and for one that a poll between this look and the Wait
// took (rearm counts the event it drains as progress). A peer that is gone
// fails its QP, which completes too. After Close it reports false.
func (t *Transport) Stored(peer int, epoch uint32) bool {
	if !t.ll.batch {
		if !t.guard.Acquire() {
			return false
		}
		defer t.guard.Release()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	l := &t.ll
	if l.conn0(peer) == nil || epoch < transport.FirstEpoch {
		return false
	}
	w := l.inSlot(peer, epoch)
	if transport.SlotBegun(w, epoch) {
		return true
	}
	// The data is placed before its completion is: once this poll has seen
	// the store's completion, the second look sees the words.
	if t.poll() != nil {
		return false
	}
	return transport.SlotBegun(w, epoch)
}

// take is one step of Load: it takes the words of slot w that carry epoch
// into dst (transport.SlotWindow.Take) and counts a complete message's
// words in Stats.
func (l *llState) take(peer int, w []uint64, epoch, tag uint32, dst []byte, anyLen bool, st *transport.SlotLoad) (bool, error) {
	done, err := l.slot.Take(peer, w, epoch, tag, dst, anyLen, st)
	if done {
		l.t.recvd[peer].Add(uint64(8 * (1 + transport.SlotWords(st.Len))))
	}
	return done, err
}
