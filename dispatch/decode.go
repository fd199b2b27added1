package dispatch

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

// The low-latency decode mode (Config.MaxTokens > 0), after DeepEP's and
// pplx's low-latency kernels: every rank receives into fixed worst-case
// buffers, laid out once at New, so a step has no counts round trip and
// plans nothing but its own permutation.
//
// Each rank has two buffer sets; step n uses set n&1, so consecutive steps
// (two micro-batches) never share one and no barrier sits between steps. A
// set is one region of control words, one of received rows and one of
// expert outputs:
//
//	ctl   [ready uint64, own cache line][flag uint64 per source rank, one cache line each]
//	rows  [source rank][gap | rows per local slot, uint32 | rowCap rows] in the wire format
//	out   [source rank][gap | rowCap rows] in DType, the layout of Recv
//
// rowCap = MaxTokens*min(K, most slots of a rank): a token sends a rank at
// most one row per slot there. Between ranks sharing memory (RowsAuto on
// one host) the set is a memfd segment the peers map once, at New: a sender
// writes its rows and their counts straight into the receiver's block for
// it and then stores the step number into the receiver's flag for it;
// combine stores the step number into the rank's ready word once its expert
// outputs are in its out region, where their senders read them (or, computed
// in place, in its rows region: the word's low bit). Between
// other ranks the same blocks travel as point-to-point messages, posted
// together: the counts are the block's header, in the same message as the
// rows.
//
// Reuse needs no barrier: a rank writes into a peer's set for step n only
// once the peer's ready word says step n-2 is done there (set by its
// CombineSend or by the Release of an uncombined handle), which it has
// usually seen in its own combine of step n-2 already; and a set's handle is
// handed out again only once released.

// decodeTag is the tag of the decode mode's point-to-point messages: the
// dispatch's blocks, plus one for the combine's, plus two for set 1.
const decodeTag = 0x4c4c0000

// cacheLine separates the control words a peer polls.
const cacheLine = 64

// decodeMode is the decode mode's state of a dispatcher.
type decodeMode struct {
	maxTokens int
	rowCap    int // rows of one (source, destination) block
	cntBytes  int // the rows per slot: the last bytes of a block's header
	// recvHdr is the header of a block of Recv and Output, a whole number
	// of rows, so that the row at offset off is row off/RowBytes (KeepFP8's
	// Recv relies on it); wireHdr is the header of a block of the rows
	// region: recvHdr, or with WireFP8 cntBytes on a cache line.
	recvHdr, wireHdr int
	block            int // bytes of a block of Recv and Output: recvHdr + rowCap*rowBytes
	wireBlock        int // bytes of a block of the rows region: wireHdr + rowCap*wireRow
	ctlBytes         int
	timeout          time.Duration   // of a wait without a deadline: the Comm's
	spin             time.Duration   // busy-polling before yielding: the Comm's policy
	seq              uint64          // the last step dispatched (step 1 is the first)
	sets             [2]decodeSet    // step n uses sets[n&1]
	peers            [][2]peerRegion // shared-memory peers' sets, mapped; nil otherwise
}

// peerRegion is one of a peer's sets as mapped here.
type peerRegion struct {
	mem            []byte
	ctl, rows, out []byte
}

// decodeSet is one buffer set and the handle that uses it.
type decodeSet struct {
	h              *Handle
	seg            *segment // nil without shared-memory peers: mem is heap memory then
	mem            []byte
	ctl, rows, out []byte
	recv           []byte         // what Recv returns: rows, or with WireFP8 the dequantized rows
	dst            [][]byte       // dispatch: where this step's block for rank j goes
	send           [][]byte       // point-to-point peers: the block, packed here
	back           [][]byte       // point-to-point peers: their outputs for this rank's rows
	recvReq        []*a2a.Request // the operation in flight's: dispatch's or combine's
	sendReq        []*a2a.Request
	// The persistent requests of the point-to-point peers, made at New and
	// started at every step, so that a step allocates none.
	dispRecv, dispSend []*a2a.Request
	combRecv, combSend []*a2a.Request
	seq                uint64    // the step the set holds
	start              time.Time // of the operation in flight
	total              []int     // rows received from each source
	recvN              []int     // bytes of each point-to-point receive
	recv8              []byte    // KeepFP8: the E4M3 bytes of Recv's rows
	scales             []float32 // KeepFP8: their scales
}

// initDecode lays out the buffer sets and, with shared-memory peers, maps
// theirs: a collective, at New.
func (d *Dispatcher) initDecode(ctx context.Context) error {
	P, K := d.size, d.cfg.K
	ll := &decodeMode{maxTokens: d.cfg.MaxTokens}
	ll.rowCap = d.cfg.MaxTokens * min(K, d.maxLocal)
	ll.cntBytes = alignUp(4*max(d.maxLocal, 1), 16)
	ll.recvHdr = alignUp(ll.cntBytes, d.rowBytes)
	ll.wireHdr = ll.recvHdr
	if d.fp8 {
		ll.wireHdr = alignUp(ll.cntBytes, cacheLine)
	}
	ll.block = ll.recvHdr + ll.rowCap*d.rowBytes
	ll.wireBlock = ll.wireHdr + ll.rowCap*d.wireRow
	ll.ctlBytes = cacheLine * (1 + P)
	cfg := d.comm.Config()
	ll.timeout = cfg.Timeout
	ll.spin, _ = d.comm.WaitPolicy()
	size := ll.ctlBytes + P*ll.wireBlock + P*ll.block
	if uint64(size) > 1<<40 {
		return invalidf("decode mode: %d bytes per buffer set (max tokens %d)", size, d.cfg.MaxTokens)
	}
	d.ll = ll
	for s := range ll.sets {
		set := &ll.sets[s]
		if d.hostPeers {
			seg, err := newSegmentFlags(size, d.segGen.Add(1), 0)
			if err != nil {
				ll.close()
				return fmt.Errorf("%w: decode buffers of %d bytes: %w", ErrSharedMemory, size, err)
			}
			set.seg, set.mem = seg, seg.mem
		} else {
			set.mem = largeBytes(size)
		}
		set.ctl, set.rows, set.out = ll.regions(set.mem, P)
		set.recv = set.rows
		if d.fp8 {
			set.recv = largeBytes(P * ll.block)
		}
		if d.cfg.KeepFP8 {
			rows := P * ll.block / d.rowBytes
			set.recv8 = largeBytes(rows * d.cfg.Hidden)
			set.scales = make([]float32, rows*reduce.E4M3Scales(d.cfg.Hidden))
		}
		set.dst, set.send, set.back = make([][]byte, P), make([][]byte, P), make([][]byte, P)
		set.recvReq, set.sendReq = make([]*a2a.Request, P), make([]*a2a.Request, P)
		set.total, set.recvN = make([]int, P), make([]int, P)
		set.dispRecv, set.dispSend = make([]*a2a.Request, P), make([]*a2a.Request, P)
		set.combRecv, set.combSend = make([]*a2a.Request, P), make([]*a2a.Request, P)
		for j := range P {
			if j != d.rank && !d.sharedWith[j] {
				set.send[j] = largeBytes(ll.wireBlock)
				set.back[j] = largeBytes(ll.block)
				tag := decodeTag + 2*s
				set.dispRecv[j], set.dispSend[j] = d.comm.RecvInit(j, tag), d.comm.SendInit(j, tag)
				set.combRecv[j], set.combSend[j] = d.comm.RecvInit(j, tag+1), d.comm.SendInit(j, tag+1)
			}
		}
		set.h = d.decodeHandle(set)
	}
	if err := d.mapDecodePeers(ctx); err != nil {
		ll.close()
		return err
	}
	return nil
}

// regions cuts a set's memory into its control, rows and out regions.
func (ll *decodeMode) regions(mem []byte, P int) (ctl, rows, out []byte) {
	rowsEnd := ll.ctlBytes + P*ll.wireBlock
	return mem[:ll.ctlBytes], mem[ll.ctlBytes:rowsEnd], mem[rowsEnd : rowsEnd+P*ll.block]
}

// mapDecodePeers exchanges the descriptors of both sets with one AllToAll and
// maps those of the shared-memory peers. Every rank takes part.
func (d *Dispatcher) mapDecodePeers(ctx context.Context) error {
	ll, P, me := d.ll, d.size, d.rank
	send, recv := make([]byte, 2*descriptorBytes*P), make([]byte, 2*descriptorBytes*P)
	for j := range P {
		if !d.sharedWith[j] {
			continue
		}
		for s, set := range ll.sets {
			descriptor{pid: d.pid, fd: set.seg.fd, gen: set.seg.gen, size: len(set.seg.mem)}.put(send[descriptorBytes*(2*j+s):])
		}
	}
	if err := d.comm.AllToAll(ctx, send, recv); err != nil {
		return err
	}
	ll.peers = make([][2]peerRegion, P)
	for j := range P {
		for s := range ll.sets {
			set := &ll.sets[s]
			switch {
			case j == me:
				ll.peers[j][s] = peerRegion{ctl: set.ctl, rows: set.rows, out: set.out}
			case d.sharedWith[j]:
				desc := getDescriptor(recv[descriptorBytes*(2*j+s):])
				mem, err := mapPeerFlags(desc.pid, desc.fd, desc.size, 0)
				if err != nil {
					return d.comm.Abort(fmt.Errorf("%w: rank %d's decode buffers: %w", ErrSharedMemory, j, err))
				}
				ctl, rows, out := ll.regions(mem, P)
				ll.peers[j][s] = peerRegion{mem: mem, ctl: ctl, rows: rows, out: out}
			}
		}
	}
	return nil
}

// close unmaps the peers' sets and frees this rank's.
func (ll *decodeMode) close() {
	for _, p := range ll.peers {
		for _, r := range p {
			if r.mem != nil {
				unix.Munmap(r.mem)
			}
		}
	}
	ll.peers = nil
	for s := range ll.sets {
		ll.sets[s].seg.free()
		ll.sets[s].seg = nil
	}
}

// decodeHandle makes the handle of a set, with the same scratch a handle of
// the other modes has.
func (d *Dispatcher) decodeHandle(set *decodeSet) *Handle {
	P := d.size
	return &Handle{
		d: d, ll: set, recv: set.recv, recv8: set.recv8, scales: set.scales,
		rowsFrom:   make([]int, P*d.nLocal),
		expertRows: make([]int, d.nLocal),
		segs:       make([]Segment, P*d.nLocal),
		expertLoad: make([]int, d.cfg.Experts),
		gen:        d.replicas.gen,
		offs:       make([]int, d.cfg.K),
		ws:         make([]float32, d.cfg.K),
		rowSrc:     make([][]byte, P),
		rowDelta:   make([]int, P),
	}
}

// word is the uint64 at b[0:8], for atomic access: b is a control word of a
// set, 8-byte aligned (a region starts a page).
func word(b []byte) *uint64 { return (*uint64)(unsafe.Pointer(unsafe.SliceData(b))) }

// flagOf is the control word in which rank src says its rows of a step are
// in ctl's set.
func flagOf(ctl []byte, src int) *uint64 { return word(ctl[cacheLine*(1+src):]) }

// readyOf is the control word in which a rank says its outputs of a step are
// in its out region (and it is done with its rows of that step).
func readyOf(ctl []byte) *uint64 { return word(ctl) }

// dispatchDecode is Dispatch (sync) or DispatchSend in the decode mode.
func (d *Dispatcher) dispatchDecode(ctx context.Context, tokens []byte, dec *routing.Decision, sync bool) (*Handle, error) {
	T, err := d.checkStep(ctx, tokens, dec)
	if err != nil {
		return nil, err
	}
	ll := d.ll
	if T > ll.maxTokens {
		return nil, invalidf("decode mode: %d tokens in a step, more than Config.MaxTokens %d; nothing was sent", T, ll.maxTokens)
	}
	seq := ll.seq + 1
	set := &ll.sets[seq&1]
	h := set.h
	if h.state != stateIdle {
		return nil, invalidf("decode mode: the handle of step %d still holds its buffers: release it before dispatching step %d", set.seq, seq)
	}
	if err := d.planStep(h, T, dec); err != nil {
		return nil, err
	}
	h.ctx, h.tokens = ctx, tokens
	if d.fp8 {
		if err := h.quantizeTokens(); err != nil {
			h.ctx, h.tokens = nil, nil
			return nil, err
		}
	}
	h.state, h.err = stateDispatching, nil
	set.start = time.Now()
	// The previous step on this set must be done on every peer we write
	// to: its ready word says so.
	if seq > 2 {
		if err := h.awaitReady(seq - 2); err != nil {
			return nil, h.failDecode(err)
		}
	}
	ll.seq, set.seq = seq, seq
	h.packDecode()
	if err := h.postDispatch(); err != nil {
		return nil, h.failDecode(err)
	}
	h.pending = true
	if sync {
		if err := h.Wait(); err != nil {
			h.Release()
			return nil, err
		}
	}
	return h, nil
}

// packDecode copies every kept row once, in token order, into its place in
// the block for its destination: a shared-memory peer's (or this rank's own)
// rows region, or the staging block of a point-to-point peer. Each block
// gets its header, the rows per slot of its receiver, and the step number
// goes into the flags of the shared-memory peers once their rows are in.
func (h *Handle) packDecode() {
	d, p, set, ll := h.d, &h.plan, h.ll, h.d.ll
	P, me, s := d.size, d.rank, set.seq&1
	for j := range P {
		if ll.peers != nil && ll.peers[j][s].rows != nil {
			set.dst[j] = ll.peers[j][s].rows[me*ll.wireBlock : (me+1)*ll.wireBlock]
		} else if j == me {
			set.dst[j] = set.rows[me*ll.wireBlock : (me+1)*ll.wireBlock]
		} else {
			set.dst[j] = set.send[j]
		}
		cnt := set.dst[j][ll.wireHdr-ll.cntBytes : ll.wireHdr]
		clear(cnt)
		putRowCounts(cnt, d.rt.slots.PerRank[j], p.ExpertRows)
	}
	h.slotOff = growInts(h.slotOff, len(p.Row))
	K, owner, rb, wb, hb := p.K, d.rt.slots.Owner, d.rowBytes, d.wireRow, ll.wireHdr
	// As pack does: rows another core reads are written without reading
	// their lines first.
	stream := p.Rows*wb >= streamBytes
	for a, r := range p.Row {
		if r < 0 {
			h.slotOff[a] = -1
			continue
		}
		t := a / K
		src := h.tokens[t*rb : (t+1)*rb]
		if d.fp8 {
			src = h.qtok[t*wb : (t+1)*wb]
		}
		j := owner[h.slotDec.Expert[a]]
		idx := int(r) - p.RankStart[j]
		if dst := set.dst[j][hb+idx*wb : hb+(idx+1)*wb]; stream {
			copyStream(dst, src)
		} else {
			copy(dst, src)
		}
		h.slotOff[a] = ll.recvHdr + idx*rb // in j's out block for this rank (combine.go's slotRow)
	}
	if stream {
		storeFence()
	}
	if ll.peers != nil {
		for j := range P {
			if j != me && d.sharedWith[j] {
				atomic.StoreUint64(flagOf(ll.peers[j][s].ctl, me), set.seq)
			}
		}
	}
}

// postDispatch posts the point-to-point part of a dispatch: this rank's
// block for each peer that does not share memory, header and rows in one
// message (the block from its counts on), and a receive of theirs into
// this rank's rows region, by the set's persistent requests.
func (h *Handle) postDispatch() error {
	d, set, ll := h.d, h.ll, h.d.ll
	for j := range d.size {
		set.recvReq[j], set.sendReq[j] = nil, nil
		if j == d.rank || d.sharedWith[j] {
			continue
		}
		from := ll.wireHdr - ll.cntBytes
		n := ll.wireHdr + h.plan.RankRows[j]*d.wireRow
		set.recvReq[j], set.sendReq[j] = set.dispRecv[j], set.dispSend[j]
		if err := startPair(h.ctx, set.recvReq[j], set.rows[j*ll.wireBlock+from:(j+1)*ll.wireBlock], set.sendReq[j], set.send[j][from:n]); err != nil {
			return err
		}
	}
	return nil
}

// startPair starts a persistent receive into in and a send of out. Start
// fails only while a request of the step before last on this set is in
// flight, which a released handle rules out.
func startPair(ctx context.Context, recv *a2a.Request, in []byte, send *a2a.Request, out []byte) error {
	if err := recv.Start(ctx, in); err != nil {
		return err
	}
	return send.Start(ctx, out)
}

// failDecode makes err the handle's, aborting the Comm: the peers wait for
// this rank's part of the step, and without it the step completes nowhere.
func (h *Handle) failDecode(err error) error {
	h.d.comm.Abort(err)
	h.state, h.err, h.pending = stateFailed, err, false
	h.ctx, h.tokens, h.expertOut, h.out = nil, nil, nil, nil
	return err
}

// DispatchSend starts a decode step (Config.MaxTokens > 0): it packs this
// rank's rows into their receivers' fixed buffers, or posts them for the
// receivers that do not share memory with it, and returns; h.Wait then
// completes the receive of this rank's rows. Between the two the caller may
// start another micro-batch: steps alternate two buffer sets, so the handle
// of the step before last must be released first. A step of more than
// MaxTokens tokens, like any argument error, fails with ErrInvalidArgument
// before anything is sent, and so does a token row WireFP8 cannot quantize;
// the peers then wait for this rank's rows until it dispatches again or
// their deadline (release them with Comm.Abort). tokens must stay unchanged
// until Wait returns. Without MaxTokens DispatchSend is DispatchAsync.
func (d *Dispatcher) DispatchSend(ctx context.Context, tokens []byte, dec *routing.Decision) (*Handle, error) {
	return d.DispatchAsync(ctx, tokens, dec)
}

// CombineSend starts the combine of a decode step: the expert outputs are
// made readable by (or posted to) the ranks their rows came from, and
// h.Wait then sums this rank's tokens into out. expertOutputs must stay
// unchanged until Wait returns; computing them in h.Output() saves a copy.
// Without MaxTokens CombineSend is CombineAsync.
func (d *Dispatcher) CombineSend(ctx context.Context, h *Handle, expertOutputs, out []byte) error {
	return d.CombineAsync(ctx, h, expertOutputs, out)
}

// DecodeMode reports whether the dispatcher runs the decode mode
// (Config.MaxTokens > 0).
func (d *Dispatcher) DecodeMode() bool { return d.ll != nil }

// validateDecode reports a decode configuration the dispatcher cannot run.
func (cfg Config) validateDecode() error {
	switch {
	case cfg.MaxTokens < 0:
		return invalidf("max tokens %d, want >= 0 (0: no decode mode)", cfg.MaxTokens)
	case cfg.MaxTokens == 0:
		return nil
	case cfg.MaxTokens > 1<<20:
		return invalidf("max tokens %d, want at most %d per rank and step", cfg.MaxTokens, 1<<20)
	case cfg.Counts != CountsInBand:
		return invalidf("decode mode (max tokens %d) carries the counts with the rows, not by %v", cfg.MaxTokens, cfg.Counts)
	case cfg.Rebalance.Every > 0:
		return invalidf("decode mode (max tokens %d) sizes its buffers for one placement: no Rebalance", cfg.MaxTokens)
	}
	return nil
}

// initDecodeIf sets up the decode mode when the configuration asks for it.
func (d *Dispatcher) initDecodeIf(ctx context.Context) error {
	if d.cfg.MaxTokens == 0 {
		return nil
	}
	return d.initDecode(ctx)
}
