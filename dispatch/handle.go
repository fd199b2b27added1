package dispatch

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/routing"
)

type handleState uint8

const (
	stateIdle        handleState = iota // on the free list
	stateDispatching                    // dispatch planned, exchange queued or running
	stateDispatched                     // rows received: expert compute may run
	stateCombining                      // combine queued or running
	stateCombined                       // outputs delivered
	stateFailed                         // an exchange failed
)

// Handle is one dispatched step: the rows this rank's experts must process and
// what Combine needs to send their outputs back. Get one from
// Dispatcher.Dispatch or DispatchAsync, and give it back with Release. Its
// slices are owned by the handle and reused by later steps: do not keep them
// past Release.
type Handle struct {
	d       *Dispatcher
	ll      *decodeSet // the decode mode's buffer set (decode.go); nil in the other modes
	state   handleState
	pending bool       // an operation was queued on the worker and not yet waited for
	done    chan error // the worker's completion of that operation
	err     error

	// Arguments of the queued operation, dropped once it ran.
	ctx                    context.Context
	tokens, expertOut, out []byte

	T, dropped int
	selfBytes  int // bytes of the rows this rank keeps for its own experts, at the front of recv
	dec        routing.Decision
	slotDec    routing.Decision // dec with destination slots for experts (replicas.go)
	expertLoad []int            // rows per logical expert
	gen        uint64           // the placement generation the buffers are sized for
	open       bool             // counted in the dispatcher's open steps (replace.go)
	capScratch routing.CapacityScratch
	plan       routing.Plan

	send, recv, output []byte
	sendCounts         []int // bytes to each rank (0 to itself)
	sendDispl          []int
	recvCounts         []int // bytes from each rank (0 from itself)
	recvDispl          []int
	// The AllToAllV's counts: sendCounts and recvCounts with the pairs
	// that use shared memory zeroed. Its blocks are the first remoteRecv
	// bytes of recv after this rank's own rows, and the whole send buffer.
	a2aSend, a2aRecv []int
	remoteRecv       int
	// gather: the AllToAllV's rows go out of the token buffer itself
	// (AllToAllVSpans; CountsInBand, whose blocks have no header):
	// sendSpans[j] lists, in packed order, the token rows for rank j, and
	// recvSpans[i] is rank i's block of recv. The send buffer then only
	// receives the reverse exchange.
	gather               bool
	sendSpans, recvSpans [][]a2a.Span
	matrix               []int  // CountsNATS: the traffic matrix
	hdrOut, hdrIn        []byte // CountsInBand: per-(rank, local expert) row counts
	rowsFrom             []int  // rowsFrom[src*nLocal+l]: rows from src for local expert l
	expertRows           []int  // rows per local expert
	segs                 []Segment
	slotOff              []int // offset of each (token, slot)'s output: send offset, selfOffset, or -1 if dropped
	rowBase              []int // pack: byte offset of packed row 0 in rank j's block (send, or recv for this rank)
	offs                 []int // combine scratch: the kept slots of one token
	ws                   []float32
	acc, tmp             []float32

	// Where combine reads the outputs of peer j's experts: the row for the
	// slot at send offset off is rowSrc[j][off-rowDelta[j]:] (the send
	// buffer the reverse exchange filled, or j's shared segment).
	rowSrc   [][]byte
	rowDelta []int
	// Shared memory: recv and output live in segments the peers map.
	recvSeg, outSeg *segment
	descOut, descIn []byte // the descriptors exchanged by each dispatch and combine

	// WireFP8 (wire.go): qtok holds the quantized token rows the exchange
	// sends from, wire the received wire rows (in wireSeg when same-host
	// peers write into it), laid out as recv with wire rows; with KeepFP8,
	// recv8 and scales are what Recv and Scales return. rowF and rowS are
	// one row's scratch.
	qtok, wire, recv8 []byte
	wireSeg           *segment
	scales            []float32
	rowF, rowS        []float32

	// The relay path (hier.go): its step state, and on the inner
	// dispatcher's handles, the wire rows to send from (not quantized
	// again).
	hs   *hierStep
	preq []byte

	dispatchTime, combineTime        time.Duration
	sentBytes, recvBytes, crossBytes int64
}

// Wait blocks until the operation started by DispatchAsync or CombineAsync
// (DispatchSend or CombineSend) is done and returns its error; without one in flight it returns the last
// operation's error at once. After an error the handle can only be released.
func (h *Handle) Wait() error {
	if h.ll != nil {
		return h.waitDecode()
	}
	if h.pending {
		h.err = <-h.done
		h.pending = false
	}
	h.settleIfDone()
	return h.err
}

// Release gives the handle and its buffers back to the dispatcher for a later
// step, waiting first for an operation still in flight. The slices obtained
// from it must not be used afterwards: a later step reuses them. Until the
// handle is handed out again its accessors return nil (Recv, Output,
// Segments, Decision, ExpertLoad) or 0, and releasing it again is a no-op.
func (h *Handle) Release() {
	if h == nil || h.state == stateIdle {
		return
	} else if h.ll != nil {
		h.releaseDecode()
		return
	}
	h.Wait()
	h.d.recycle(h)
}

// released reports whether the handle is back with its dispatcher: its
// accessors then return nil (or 0) rather than a step's data that a later
// step may be overwriting.
func (h *Handle) released() bool { return h.state == stateIdle }

// Tokens is the number of tokens this rank dispatched (0 once released).
func (h *Handle) Tokens() int {
	if h.released() {
		return 0
	}
	return h.T
}

// Rows is the number of rows received for all local experts (0 once
// released).
func (h *Handle) Rows() int {
	if h.released() {
		return 0
	}
	n := 0
	for _, r := range h.expertRows {
		n += r
	}
	return n
}

// Recv is the received buffer: the rows of this rank's own tokens first, then
// the other ranks' blocks (those the AllToAllV brought, in rank order, then
// those written through shared memory, in rank order); within a block, rows
// by local expert, then by token. Segments gives the offsets. With
// WireFP8 the rows were dequantized to Config.DType on arrival. With
// KeepFP8 it holds the rows' E4M3 bytes instead, Hidden per row in the same
// order (the row at Segment offset off is row off/RowBytes), and Scales
// their scales. In the decode mode (Config.MaxTokens) it is the fixed
// buffer of the handle's set: one block per source rank, in rank order, of
// room for its worst case, the rows at the front of each after a gap; only
// the segments' rows are meaningful. Nil once released.
func (h *Handle) Recv() []byte {
	if h.released() {
		return nil
	}
	if h.d.cfg.KeepFP8 {
		return h.recv8
	}
	return h.recv
}

// Output is a buffer of the length and layout of Recv, owned by the handle,
// for the expert outputs. Its previous contents are unspecified: write every
// row of every segment. Nil once released.
func (h *Handle) Output() []byte {
	if h.released() {
		return nil
	} else if h.ll != nil {
		return h.ll.out
	}
	if h.d.hier != nil {
		if h.hs == nil || h.hs.in == nil {
			return nil // the dispatch failed
		}
		return h.hs.in.Output()
	}
	if h.d.hostPeers {
		out, err := h.sharedBuffer(&h.outSeg, len(h.recv), 0)
		if err == nil {
			h.output = out
			return out
		}
		// Combine copies outputs computed elsewhere into shared memory
		// itself, and reports the error if it cannot either.
		h.d.log.Warn("dispatch: shared output buffer", "rank", h.d.rank, "err", err)
	}
	h.output = grow(h.output, len(h.recv))
	return h.output
}

// freeSegments unmaps the handle's shared buffers.
func (h *Handle) freeSegments() {
	h.recvSeg.free()
	h.outSeg.free()
	h.wireSeg.free()
	h.recvSeg, h.outSeg, h.wireSeg = nil, nil, nil
	h.recv, h.output, h.wire = nil, nil, nil
}

// growRecv makes h.recv n bytes long, keeping its first keep bytes: in a
// shared segment when this rank shares memory with a peer, else on the heap.
func (h *Handle) growRecv(n, keep int) error {
	if h.d.hostPeers {
		r, err := h.sharedBuffer(&h.recvSeg, n, keep)
		if err != nil {
			return h.sharedFailure(err)
		}
		h.recv = r
		return nil
	}
	if cap(h.recv) < n {
		r := largeBytes(n)
		copy(r, h.recv[:keep])
		h.recv = r
	}
	h.recv = h.recv[:n]
	return nil
}

// LocalExperts is the number of experts this rank hosts: its filled slots,
// each replica one.
func (h *Handle) LocalExperts() int { return h.d.nLocal }

// Expert is the global id of local expert l, the logical expert in this
// rank's l-th filled slot: the rows of every replica of an expert go
// through the same code.
func (h *Handle) Expert(l int) int { return h.d.rt.local(h.d.rank, l) }

// ExpertRows is the number of rows received for local expert l (0 once
// released).
func (h *Handle) ExpertRows(l int) int {
	if h.released() {
		return 0
	}
	return h.expertRows[l]
}

// Segments lists where local expert l's rows are in Recv: one segment per
// source rank, indexed by rank (empty ones included). Nil once released.
func (h *Handle) Segments(l int) []Segment {
	if h.released() {
		return nil
	}
	P := h.d.size
	return h.segs[l*P : (l+1)*P]
}

// Decision is the routing of this rank's tokens as dispatched: the caller's
// decision with the assignments dropped over capacity marked routing.Dropped.
// Nil once released.
func (h *Handle) Decision() *routing.Decision {
	if h.released() {
		return nil
	}
	return &h.dec
}

// ExpertLoad is the number of rows this rank sent to each global expert.
// Nil once released.
func (h *Handle) ExpertLoad() []int {
	if h.released() {
		return nil
	}
	return h.expertLoad
}

// Stats returns the step's statistics (CombineTime once combined; the zero
// Stats once released).
func (h *Handle) Stats() Stats {
	if h.released() {
		return Stats{}
	}
	return Stats{
		Tokens: h.T, Kept: h.plan.Rows, Dropped: h.dropped, Received: h.Rows(),
		Imbalance: routing.Imbalance(h.plan.RankRows),
		SentBytes: h.sentBytes, CrossHostBytes: h.crossBytes,
		DispatchTime: h.dispatchTime, CombineTime: h.combineTime, ReceivedBytes: h.recvBytes,
	}
}

// exec runs the handle's prepared operation on the current goroutine.
func (h *Handle) exec() error {
	var err error
	switch h.state {
	case stateDispatching:
		if err = h.runDispatch(); err == nil {
			h.state = stateDispatched
		}
	case stateCombining:
		if err = h.runCombine(); err == nil {
			h.state = stateCombined
		}
	default:
		err = fmt.Errorf("%w: dispatch: handle in state %d has nothing to run", a2a.ErrInvalidArgument, h.state)
	}
	if err != nil {
		h.state = stateFailed
	}
	h.ctx, h.tokens, h.expertOut, h.out = nil, nil, nil, nil
	h.err = err
	return err
}

// runDispatch packs the rows, learns the receive counts and exchanges the
// rows, in phases: the send layout, the pack, the counts exchange, the
// receive layout, the rows exchange and the unpack of the received blocks
// into segments.
//
// Rows for this rank's own experts never enter the collective: they are
// copied straight from the tokens into the front of the receive buffer (one
// copy instead of a pack plus the engine's local copy), in the same pass over
// the tokens that packs the other ranks' rows, and combine reads their
// outputs where the experts wrote them. The receive buffer is sized for the
// pack by what this rank sends (loads are usually about symmetric) and grown,
// keeping those rows, if the counts then ask for more. With shared memory the
// pack waits for the counts instead: it writes into the peers' receive
// buffers, which exist only once they know what they receive.
//
// With WireFP8 every token row is quantized once, before the counts (a row
// that cannot be is rejected there, on every rank), and the pack and the
// exchange move wire rows into h.wire, which unwire then converts.
func (h *Handle) runDispatch() error {
	start := time.Now()
	d := h.d
	if d.hier != nil {
		return h.runHierDispatch(start)
	}
	sendLayout := h.layoutSend()
	if d.fp8 && !h.quantizeInPack() {
		if err := h.quantizeTokens(); err != nil {
			return h.rejectStep(err)
		}
	}
	if !d.shared {
		// Packed at once, while the counts are still unknown.
		if err := h.growRecv(max(h.selfBytes+sendLayout, cap(h.recv)), 0); err != nil {
			return err
		}
		if err := h.growWireFor(len(h.recv), 0); err != nil {
			return err
		}
		if err := h.pack(); err != nil {
			return h.rejectStep(err)
		}
	}
	if err := h.exchangeCounts(); err != nil {
		return err
	}
	recvLayout := h.layoutRecv()
	if d.shared {
		if err := h.growRecv(recvLayout, 0); err != nil {
			return err
		}
		if err := h.growWireFor(recvLayout, 0); err != nil {
			return err
		}
		if err := h.packShared(); err != nil {
			return err
		}
	} else {
		if err := h.growRecv(recvLayout, h.selfBytes); err != nil {
			return err
		}
		if err := h.growWireFor(recvLayout, h.selfBytes); err != nil {
			return err
		}
	}
	if err := h.exchangeRows(); err != nil {
		return err
	}
	if err := h.readBlockHeaders(); err != nil {
		return err
	}
	if d.fp8 {
		h.unwire()
	}
	h.indexSegments()
	h.foldLoads()
	h.dispatchTime = time.Since(start)
	h.combineTime = 0
	if o := d.cfg.Observer; o != nil {
		o.ObserveDispatch(h.dispatchTime, h.expertLoad, h.dropped, routing.Imbalance(h.plan.RankRows))
		h.observeRows()
	}
	return nil
}

// layoutSend lays out the blocks this rank sends and returns the size of the
// whole send layout. sendDispl is the layout of every block as if all were
// packed in one buffer (combine's slot offsets use it); the send buffer holds
// only the AllToAllV's blocks, and rowSrc/rowDelta map the one to the other
// (the blocks for shared-memory peers get their place later). With gather,
// sendSpans gets room for one span per row the AllToAllV sends.
func (h *Handle) layoutSend() int {
	d, p := h.d, &h.plan
	rb, me := d.rowBytes, d.rank
	off, sent := 0, 0
	for j := range d.size {
		h.sendDispl[j] = off
		h.sendCounts[j], h.a2aSend[j] = 0, 0
		if j != me {
			h.sendCounts[j] = d.hdr[j] + p.RankRows[j]*rb
		}
		off += h.sendCounts[j]
		if j != me && !d.sharedWith[j] {
			h.a2aSend[j] = h.sendCounts[j]
			h.rowDelta[j] = h.sendDispl[j] - sent
			sent += h.sendCounts[j]
		}
	}
	h.send = grow(h.send, sent)
	h.gather = d.cfg.Counts == CountsInBand
	for j := range d.size {
		if !d.sharedWith[j] {
			h.rowSrc[j] = h.send
		}
		n := 0
		if h.gather && h.a2aSend[j] > 0 {
			n = p.RankRows[j]
		}
		if cap(h.sendSpans[j]) < n {
			h.sendSpans[j] = make([]a2a.Span, n)
		}
		h.sendSpans[j] = h.sendSpans[j][:n]
	}
	h.selfBytes = p.RankRows[me] * rb
	return off
}

// exchangeCounts learns how many bytes each rank sends this one
// (recvCounts) and, in-band, how many rows for each local expert
// (rowsFrom); with CountsNATS the rows per expert come later, in the
// blocks' headers. This rank's rows for itself are known already.
func (h *Handle) exchangeCounts() error {
	d, p := h.d, &h.plan
	P, me, nLocal := d.size, d.rank, d.nLocal
	for l, e := range d.rt.slots.PerRank[me] {
		h.rowsFrom[me*nLocal+l] = p.ExpertRows[e]
	}
	if d.cfg.Counts == CountsInBand {
		return h.exchangeCountsInBand()
	}
	h.matrix = growInts(h.matrix, P*P)
	return d.comm.ExchangeCountsMatrix(h.ctx, h.sendCounts, h.recvCounts, h.matrix)
}

// exchangeCountsInBand sends every rank this rank's rows for each of its
// slots and receives the same from them, with one fixed-size AllToAll of
// countsBlock(maxLocal) counts per pair: the rows, then the sender's rows of
// its previous dispatch (load.go).
func (h *Handle) exchangeCountsInBand() error {
	d := h.d
	P, rb, me, nLocal, maxLocal := d.size, d.rowBytes, d.rank, d.nLocal, d.maxLocal
	blk := countsBlock(maxLocal)
	clear(h.hdrOut)
	for j, experts := range d.rt.slots.PerRank {
		if j != me {
			putRowCounts(h.hdrOut[4*j*blk:], experts, h.plan.ExpertRows)
			d.putLoads(h.hdrOut[4*(j*blk+maxLocal):])
		}
	}
	if err := d.comm.AllToAll(h.ctx, h.hdrOut, h.hdrIn); err != nil {
		return err
	}
	for i := range P {
		h.recvCounts[i] = 0
		if i == me {
			continue
		}
		counts := h.hdrIn[4*i*blk : 4*(i*blk+maxLocal)]
		if err := h.peerRejected(i, counts); err != nil {
			return err
		}
		total := getRowCounts(h.rowsFrom[i*nLocal:(i+1)*nLocal], counts)
		for l := nLocal; l < maxLocal; l++ {
			if n := binary.LittleEndian.Uint32(counts[4*l:]); n != 0 {
				return h.mismatch(i, "sends %d rows for local expert %d of %d", n, l, nLocal)
			}
		}
		h.recvCounts[i] = total * rb
	}
	return nil
}

// layoutRecv lays out recv and returns its size: this rank's own rows, then
// the other ranks' blocks in rank order as the AllToAllV delivers them, then
// those written through shared memory, in rank order.
func (h *Handle) layoutRecv() int {
	d := h.d
	off := h.selfBytes
	for i := range d.size {
		h.a2aRecv[i] = 0
		if i != d.rank && !d.sharedWith[i] {
			h.recvDispl[i] = off
			h.a2aRecv[i] = h.recvCounts[i]
			off += h.recvCounts[i]
		}
	}
	h.remoteRecv = off - h.selfBytes
	for i := range d.size {
		if d.sharedWith[i] { // never this rank
			h.recvDispl[i] = off
			off += h.recvCounts[i]
		}
	}
	h.recvDispl[d.rank] = h.selfBytes
	return off
}

// exchangeRows runs the AllToAllV, if the group has one: from the tokens
// themselves with gather, else from the send buffer. For the peers that
// wrote into recv through shared memory, this call's message from them
// (every pair exchanges one in an AllToAllV, empty or not) also says that
// they finished.
func (h *Handle) exchangeRows() error {
	d := h.d
	if !d.exchange {
		return nil
	}
	if !h.gather {
		return d.comm.AllToAllV(h.ctx, h.send, h.a2aSend, h.remoteRows(h.recv), h.a2aRecv)
	}
	src, dst := h.tokens, h.recv
	if d.fp8 {
		src, dst = h.qtok, h.wire
	}
	for i := range d.size {
		h.recvSpans[i] = h.recvSpans[i][:0]
		if h.a2aRecv[i] > 0 {
			h.recvSpans[i] = append(h.recvSpans[i], a2a.Span{Off: h.wireBytes(h.recvDispl[i]), Len: h.wireBytes(h.a2aRecv[i])})
		}
	}
	return d.comm.AllToAllVSpans(h.ctx, src, h.sendSpans, dst, h.recvSpans)
}

// remoteRows is the part of b, laid out as recv, that holds the AllToAllV's
// blocks: after this rank's own rows, before the shared-memory peers'.
func (h *Handle) remoteRows(b []byte) []byte {
	return b[h.selfBytes : h.selfBytes+h.remoteRecv]
}

// readBlockHeaders reads, with CountsNATS, each received block's header into
// rowsFrom, and checks it against the block's size.
func (h *Handle) readBlockHeaders() error {
	d := h.d
	if d.hdrSelf == 0 {
		return nil
	}
	rb, nLocal := d.rowBytes, d.nLocal
	for i := range d.size {
		if i == d.rank {
			continue
		}
		blk := h.recv[h.recvDispl[i] : h.recvDispl[i]+h.recvCounts[i]]
		if len(blk) < d.hdrSelf {
			return h.mismatch(i, "sent a %d-byte block, shorter than its %d-byte header", len(blk), d.hdrSelf)
		}
		total := getRowCounts(h.rowsFrom[i*nLocal:(i+1)*nLocal], blk)
		if d.hdrSelf+total*rb != len(blk) {
			return h.mismatch(i, "sent %d bytes with a header announcing %d rows of %d bytes", len(blk), total, rb)
		}
	}
	return nil
}

// indexSegments unpacks rowsFrom into the segments of recv, the rows per
// local expert and the step's byte counts.
func (h *Handle) indexSegments() {
	d := h.d
	P, rb, nLocal := d.size, d.rowBytes, d.nLocal
	clear(h.expertRows)
	h.sentBytes, h.recvBytes, h.crossBytes = 0, 0, 0
	for i := range P {
		pos := h.recvDispl[i] + d.hdrSelf
		if i == d.rank {
			pos = 0
		}
		for l := range nLocal {
			n := h.rowsFrom[i*nLocal+l]
			h.segs[l*P+i] = Segment{Source: i, Offset: pos, Rows: n}
			h.expertRows[l] += n
			pos += n * rb
		}
		h.sentBytes += int64(h.wireBytes(h.sendCounts[i]))
		if d.comm.Host(i) != d.comm.Host(d.rank) {
			h.crossBytes += int64(h.wireBytes(h.sendCounts[i]))
		}
		h.recvBytes += int64(h.wireBytes(h.recvCounts[i]))
	}
}

// putRowCounts writes a row-count header, in-band or at the front of a
// CountsNATS block: for each expert of the receiving rank, in its local
// order, the rows this rank sends it (expertRows[e]) as a little-endian
// uint32.
func putRowCounts(hdr []byte, experts, expertRows []int) {
	for l, e := range experts {
		binary.LittleEndian.PutUint32(hdr[4*l:], uint32(expertRows[e]))
	}
}

// getRowCounts reads the first len(rows) counts of a header putRowCounts
// wrote into rows and returns their sum.
func getRowCounts(rows []int, hdr []byte) (total int) {
	for l := range rows {
		n := int(binary.LittleEndian.Uint32(hdr[4*l:]))
		rows[l] = n
		total += n
	}
	return total
}

// streamBytes is the size of a pack or combine output from which rows are
// written with streaming (non-temporal) stores, as Go's memmove does for
// copies from 1 MiB: outputs that large leave the caches before anyone reads
// them back (the send buffer is read by the peers), so reading their lines in
// before overwriting them would only add traffic.
const streamBytes = 1 << 20

// pack copies every kept row once, walking the assignments in token order so
// that each token row is read once for all its slots: rows for other ranks go
// to their place in their block (after its CountsNATS header), rows for this
// rank's experts to the front of the receive buffer. Rows the AllToAllV sends
// straight from the tokens (h.gather) are not copied: their place in the
// send layout becomes a span of the tokens instead. A block is in the send
// buffer, or with shared memory directly in the receiver's receive buffer:
// byte pos of the send layout is rowSrc[j][pos-rowDelta[j]]. It records each
// slot's send-layout offset for combine. With quantizeInPack it quantizes
// each token row as it comes to it, into the token's wire row of h.qtok
// (the gather-send's source), and copies it from there while it is in
// cache; a row that cannot be quantized is its error.
func (h *Handle) pack() error {
	d, p := h.d, &h.plan
	P, rb, me := d.size, d.rowBytes, d.rank
	for j := range P {
		if j == me {
			// Packed row r of this rank's experts lands at (r-RankStart)*rb of recv.
			h.rowBase[j] = -p.RankStart[j] * rb
			continue
		}
		pos := h.sendDispl[j]
		if hb := d.hdr[j]; hb > 0 {
			hdr := h.rowSrc[j][pos-h.rowDelta[j]:][:hb]
			clear(hdr)
			putRowCounts(hdr, d.rt.slots.PerRank[j], p.ExpertRows)
			d.putLoads(hdr[4*len(d.rt.slots.PerRank[j]):])
		}
		h.rowBase[j] = pos + d.hdr[j] - p.RankStart[j]*rb
	}
	h.slotOff = growInts(h.slotOff, len(p.Row))
	stream := p.Rows*rb >= streamBytes
	K, owner := p.K, d.rt.slots.Owner
	fp8, wb := d.fp8, d.wireRow
	quantize, last := h.quantizeInPack(), -1
	if quantize {
		h.prepareQuantize()
		h.qtok = grow(h.qtok, h.T*wb)
	}
	for a, r := range p.Row {
		if r < 0 {
			h.slotOff[a] = -1
			continue
		}
		t := a / K
		if quantize && t != last { // the token's first kept slot
			if err := h.quantizeToken(h.qtok, t); err != nil {
				return err
			}
			last = t
		}
		var src []byte
		if fp8 {
			src = h.qtok[t*wb : (t+1)*wb]
		} else {
			src = h.tokens[t*rb : (t+1)*rb]
		}
		j := owner[h.slotDec.Expert[a]]
		pos := h.rowBase[j] + int(r)*rb
		var dst []byte
		switch {
		case j == me && fp8:
			dst = h.wireRowAt(h.wire, pos, 0)
			h.slotOff[a] = selfOffset(pos)
		case j == me:
			dst = h.recv[pos : pos+rb]
			h.slotOff[a] = selfOffset(pos)
		case h.gather && !d.sharedWith[j]:
			h.sendSpans[j][int(r)-p.RankStart[j]] = a2a.Span{Off: t * len(src), Len: len(src)}
			h.slotOff[a] = pos
			continue
		case fp8:
			dst = h.wireRowAt(h.rowSrc[j], pos, h.rowDelta[j])
			h.slotOff[a] = pos
		default:
			dst = h.rowSrc[j][pos-h.rowDelta[j]:][:rb]
			h.slotOff[a] = pos
		}
		if stream {
			copyStream(dst, src)
		} else {
			copy(dst, src)
		}
	}
	if stream {
		storeFence()
	}
	return nil
}

// selfOffset encodes the offset of a row this rank keeps for itself (in the
// expert outputs) apart from offsets in the send buffer (>= 0) and from
// dropped slots (-1).
func selfOffset(off int) int { return -2 - off }

func (h *Handle) mismatch(src int, format string, args ...any) error {
	return fmt.Errorf("%w: dispatch: rank %d "+format, append([]any{a2a.ErrMismatch, src}, args...)...)
}

// runCombine brings the expert outputs back and sums them per token.
func (h *Handle) runCombine() error {
	start := time.Now()
	d := h.d
	if d.hier != nil {
		return h.runHierCombine(start)
	}
	if d.shared {
		// The outputs of shared-memory peers are read where their experts
		// wrote them. Before anyone reads, every rank must have mapped
		// what it reads: a rank that releases its handle, closes the
		// dispatcher or exits once its combine is done takes its
		// descriptors with it. The reverse AllToAllV says so when there is
		// one (every pair exchanges a message in it, after mapping), a
		// barrier otherwise. Nothing else is needed after the sums: no
		// rank writes to a segment before the descriptor exchange of a
		// later dispatch, which every rank joins only after its combine.
		if err := h.readShared(); err != nil {
			return err
		}
		if err := h.sharedStepDone(); err != nil {
			return err
		}
	}
	if d.exchange && !d.relayed {
		// The reverse of the dispatch: what came from rank i goes back to
		// it, landing where this rank's rows for it were packed. The
		// outputs for this rank's own rows stay where they are.
		if err := d.comm.AllToAllV(h.ctx, h.remoteRows(h.expertOut), h.a2aRecv, h.send, h.a2aSend); err != nil {
			return err
		}
	}
	h.weightedSum()
	h.combineTime = time.Since(start)
	if o := d.cfg.Observer; o != nil {
		o.ObserveCombine(h.combineTime)
	}
	return nil
}
