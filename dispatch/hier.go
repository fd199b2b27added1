package dispatch

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

// One crossing per host (issue 19): when the ranks span hosts, a token with
// several experts on one remote host crosses to that host once, to one relay
// rank there (the one with the sender's local index, as DeepEP's normal
// kernels and Open MPI HAN's alltoallv do), which forwards it to its experts
// on that host through the flat dispatcher's shared-memory path. Combine
// sums the token's expert outputs on that host into one partial row, which
// crosses back once per (token, host).
//
// The forward inside the host is a second dispatcher (the inner one) on the
// same Comm: each rank dispatches a batch of "virtual tokens", its own tokens
// (with only the assignments to its own host kept) followed by the rows the
// other hosts' ranks of its local index sent it (with theirs for this host),
// and the inner Combine's weighted sums of that batch are the partial rows.
// Capacity is applied once, by the sender, before anything crosses.

// HierarchyMode says whether Dispatch sends a token to a remote host once
// (through a relay rank there) or once per expert.
type HierarchyMode uint8

const (
	// HierarchyAuto uses the relay path when the group spans hosts with
	// the same number of ranks each, counts are in-band, no automatic
	// re-placement runs, and the cost model (Comm.Links) prices it below
	// the flat path. The default.
	HierarchyAuto HierarchyMode = iota
	// HierarchyOn forces the relay path; New fails with
	// ErrInvalidArgument where it cannot run.
	HierarchyOn
	// HierarchyOff always sends a row per (token, expert).
	HierarchyOff
)

// String returns "auto", "on" or "off".
func (m HierarchyMode) String() string {
	switch m {
	case HierarchyAuto:
		return "auto"
	case HierarchyOn:
		return "on"
	case HierarchyOff:
		return "off"
	}
	return fmt.Sprintf("HierarchyMode(%d)", uint8(m))
}

// ParseHierarchyMode parses "auto", "on" and "off".
func ParseHierarchyMode(s string) (HierarchyMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "auto":
		return HierarchyAuto, nil
	case "on":
		return HierarchyOn, nil
	case "off":
		return HierarchyOff, nil
	}
	return 0, fmt.Errorf("%w: hierarchy %q: want auto, on or off", a2a.ErrInvalidArgument, s)
}

// hierarchy is the layer's relay path, set at New.
type hierarchy struct {
	inner     *Dispatcher // the forward inside each host
	hosts     int
	hostOf    []int   // rank -> host ordinal
	local     []int   // rank -> index among its host's ranks
	ranksOn   [][]int // host -> its ranks, ascending
	origins   [][]int // forwarding rank -> itself, then the ranks it relays for (its local index on the other hosts), ascending
	slotLocal []int   // slot -> its index among its rank's slots
	metaBytes int     // per crossing row: K (int32 destination slot, float32 weight)
}

// relay is the rank of host g that relays rank s's rows.
func (hi *hierarchy) relay(s, g int) int { return hi.ranksOn[g][hi.local[s]] }

// hierStep is one step's state of the relay path.
type hierStep struct {
	in *Handle // the inner dispatcher's handle
	// x holds the crossing's rows and their metadata: this rank's token
	// rows (in the wire format), then the rows relayed to it, then the
	// metadata it sends, then the metadata it receives.
	x                    []byte
	sendRows, recvRows   []int // crossing rows to and from each rank
	sendDispl, recvDispl []int // in rows
	cur, lastTok         []int // planning scratch
	cntOut, cntIn        []byte
	splitOut, splitIn    []byte
	sendSpans, recvSpans [][]a2a.Span
	// pairs lists, token by token, the send-order index of each crossing
	// row (one per remote host the token reaches); pairEnd[t] ends token
	// t's.
	pairs, pairEnd []int32
	ownKept        []bool   // token t has an expert on this host
	rows           [][]byte // sumPartials scratch
	vout, ret      []byte   // the inner combine's partial rows; those the relays sent back
	byteCounts     [2][]int
	acc, tmp       []float32
	sent, received int // crossing rows
}

// newHierarchy builds the relay path of d if mode and the group allow it.
func (d *Dispatcher) newHierarchy() (*hierarchy, error) {
	c, mode := d.comm, d.cfg.Hierarchy
	if mode == HierarchyOff {
		return nil, nil
	}
	hi := &hierarchy{hostOf: make([]int, d.size), local: make([]int, d.size), metaBytes: 8 * d.cfg.K}
	for r := range d.size {
		g := c.Host(r)
		hi.hosts = max(hi.hosts, g+1)
		hi.hostOf[r] = g
	}
	hi.ranksOn = make([][]int, hi.hosts)
	for r := range d.size {
		g := hi.hostOf[r]
		hi.local[r] = len(hi.ranksOn[g])
		hi.ranksOn[g] = append(hi.ranksOn[g], r)
	}
	why := ""
	switch {
	case hi.hosts < 2:
		why = "the group is on one host"
	case !evenHostRanks(hi.ranksOn):
		why = "its hosts run different numbers of ranks"
	case d.cfg.Counts != CountsInBand:
		why = "it needs in-band counts"
	case d.cfg.Rebalance.Every > 0:
		why = "it does not re-place experts"
	case d.cfg.MaxTokens > 0:
		// As DeepEP's low-latency kernels, which skip the NVLink forward:
		// a decode step is bound by latency, and a relay adds a hop.
		why = "the decode mode (MaxTokens) sends every row directly, without a relay (see README)"
	}
	if why != "" {
		if mode == HierarchyOn {
			return nil, invalidf("Config.Hierarchy on: %s", why)
		}
		return nil, nil
	}
	if mode == HierarchyAuto && !d.hierCheaper(hi) {
		return nil, nil
	}
	hi.origins = make([][]int, d.size)
	for i := range d.size {
		hi.origins[i] = append(hi.origins[i], i)
		for s := range d.size {
			if s != i && hi.local[s] == hi.local[i] {
				hi.origins[i] = append(hi.origins[i], s)
			}
		}
	}
	hi.slotLocal = make([]int, len(d.rt.expertOf))
	for _, slots := range d.rt.slots.PerRank {
		for l, s := range slots {
			hi.slotLocal[s] = l
		}
	}
	return hi, nil
}

func evenHostRanks(ranksOn [][]int) bool {
	for _, rs := range ranksOn {
		if len(rs) != len(ranksOn[0]) {
			return false
		}
	}
	return true
}

// hierCheaper prices one token's rows with the cost model's links
// (Comm.Links, the same on every rank), for a gate that picks K experts
// uniformly, from the host whose tokens cost the most: the flat path sends
// every row for a remote expert across, the relay path one row per remote
// host reached, but forwards nearly every row once more inside the host
// (all but those whose relay hosts the expert). Both directions count:
// wire rows out, DType rows back. The latency of the relay path's three
// more collectives per step is left out: it matters only for steps too
// small to be worth the choice.
func (d *Dispatcher) hierCheaper(hi *hierarchy) bool {
	links := d.comm.Links()
	E, K, L := float64(d.cfg.Experts), d.cfg.K, float64(len(hi.ranksOn[0]))
	row := float64(d.wireRow + d.rowBytes)
	onHost := make([]float64, hi.hosts) // logical experts whose first replica is there
	for e := range d.cfg.Experts {
		s := d.pl.Replicas(e)[0]
		onHost[hi.hostOf[s/(len(d.pl.SlotTable())/d.size)]]++
	}
	var flatWorst, hierWorst float64
	for h := range hi.hosts {
		var flatRemote, hierCross float64
		for g, m := range onHost {
			if g == h {
				continue
			}
			flatRemote += float64(K) * m / E
			miss := 1.0 // P(none of the K experts is on g)
			for i := range K {
				miss *= max(E-m-float64(i), 0) / (E - float64(i))
			}
			hierCross += 1 - miss
		}
		intra := (L - 1) / L
		flatLocal := float64(K) * onHost[h] / E * intra
		hierLocal := float64(K) * intra
		flat := row * (flatRemote*links.Remote.Beta + flatLocal*links.Local.Beta)
		hier := row * (hierCross*links.Remote.Beta + hierLocal*links.Local.Beta)
		flatWorst, hierWorst = max(flatWorst, flat), max(hierWorst, hier)
	}
	return hierWorst < flatWorst
}

// Hierarchical reports whether the layer sends a token to each remote host
// once, through a relay rank there (see Config.Hierarchy). All ranks
// report the same.
func (d *Dispatcher) Hierarchical() bool { return d.hier != nil }

// hierStepOf returns h's relay-path state, made on first use.
func (h *Handle) hierStepOf() *hierStep {
	if h.hs == nil {
		P := h.d.size
		h.hs = &hierStep{
			sendRows: make([]int, P), recvRows: make([]int, P), sendDispl: make([]int, P), recvDispl: make([]int, P),
			cur: make([]int, P), lastTok: make([]int, h.d.hier.hosts),
			cntOut: make([]byte, 8*P), cntIn: make([]byte, 8*P),
			sendSpans: make([][]a2a.Span, P), recvSpans: make([][]a2a.Span, P),
			byteCounts: [2][]int{make([]int, P), make([]int, P)},
		}
	}
	return h.hs
}

// releaseHier gives the inner handle back, and drops the views of its
// buffers.
func (h *Handle) releaseHier() {
	if h.hs != nil && h.hs.in != nil {
		h.hs.in.Release()
		h.hs.in = nil
		h.recv, h.recv8, h.scales, h.output = nil, nil, nil, nil
	}
}

// abortOn aborts the Comm for an error that leaves the peers waiting for
// this rank's part of the step (see sharedFailure), and returns err.
func (h *Handle) abortOn(err error) error {
	h.d.comm.Abort(err)
	return err
}

// runHierDispatch is runDispatch on the relay path: the crossing (counts,
// then rows and their metadata in one exchange), the split counts, the
// inner dispatch of the virtual tokens, and the segments by source rank.
func (h *Handle) runHierDispatch(start time.Time) error {
	d, hs := h.d, h.hierStepOf()
	h.releaseHier()
	wb := d.wireRow
	h.planCrossing()
	hs.x = grow(hs.x, h.T*wb)
	if err := h.ownRows(hs.x[:h.T*wb]); err != nil {
		return h.rejectCrossing(err)
	}
	if err := h.exchangeCrossingCounts(); err != nil {
		return err
	}
	h.layoutCrossing()
	if err := d.comm.AllToAllVSpans(h.ctx, hs.x, hs.sendSpans, hs.x, hs.recvSpans); err != nil {
		return err
	}
	in, err := h.prepareForward()
	if err != nil {
		return h.abortOn(err)
	}
	hs.in = in
	if err := h.exchangeSplit(); err != nil {
		return err
	}
	if err := in.exec(); err != nil {
		return err
	}
	if err := h.splitSegments(); err != nil {
		return h.abortOn(err)
	}
	h.recv, h.recv8, h.scales = in.recv, in.recv8, in.scales
	copy(h.expertRows, in.expertRows)
	h.sentBytes = int64(hs.sent*wb) + in.sentBytes
	h.recvBytes = int64(hs.received*wb) + in.recvBytes
	h.crossBytes = int64(hs.sent * wb)
	h.finishHier(start, false)
	return nil
}

// planCrossing counts the crossing rows this rank sends each relay: one
// per (token, remote host) its kept assignments reach.
func (h *Handle) planCrossing() {
	d, hi, hs := h.d, h.d.hier, h.hs
	K, owner, me := d.cfg.K, d.rt.slots.Owner, d.rank
	mine := hi.hostOf[me]
	clear(hs.sendRows)
	for g := range hs.lastTok {
		hs.lastTok[g] = -1
	}
	hs.ownKept = growBools(hs.ownKept, h.T)
	for t := range h.T {
		hs.ownKept[t] = false
		for a := t * K; a < (t+1)*K; a++ {
			if h.plan.Row[a] < 0 {
				continue
			}
			g := hi.hostOf[owner[h.slotDec.Expert[a]]]
			if g == mine {
				hs.ownKept[t] = true
			} else if hs.lastTok[g] != t {
				hs.lastTok[g] = t
				hs.sendRows[hi.relay(me, g)]++
			}
		}
	}
}

// ownRows writes this rank's token rows into dst in the wire format: a
// copy, or with WireFP8 the quantized rows of the tokens with a kept
// assignment (the others are never read).
func (h *Handle) ownRows(dst []byte) error {
	if !h.d.fp8 {
		copy(dst, h.tokens)
		return nil
	}
	return h.quantizeInto(dst)
}

// rejectCrossing tells every peer, through the crossing's counts, that
// this rank rejected its step (see rejectStep), and returns cause.
func (h *Handle) rejectCrossing(cause error) error {
	hs := h.hs
	for j := range h.d.size {
		binary.LittleEndian.PutUint32(hs.cntOut[8*j:], 0)
		binary.LittleEndian.PutUint32(hs.cntOut[8*j+4:], 1)
	}
	if err := h.d.comm.AllToAll(h.ctx, hs.cntOut, hs.cntIn); err != nil {
		return fmt.Errorf("%w (and telling the peers failed: %w)", cause, err)
	}
	return cause
}

// exchangeCrossingCounts sends every rank the number of crossing rows it
// will get from this one (a relay gets them, the others 0) and learns
// recvRows.
func (h *Handle) exchangeCrossingCounts() error {
	d, hs := h.d, h.hs
	for j := range d.size {
		binary.LittleEndian.PutUint32(hs.cntOut[8*j:], uint32(hs.sendRows[j]))
		binary.LittleEndian.PutUint32(hs.cntOut[8*j+4:], 0)
	}
	if err := d.comm.AllToAll(h.ctx, hs.cntOut, hs.cntIn); err != nil {
		return err
	}
	var rejected error
	for i := range d.size {
		if binary.LittleEndian.Uint32(hs.cntIn[8*i+4:]) != 0 && rejected == nil {
			rejected = h.peerRejected(i, []byte{0xff, 0xff, 0xff, 0xff})
		}
		hs.recvRows[i] = int(binary.LittleEndian.Uint32(hs.cntIn[8*i:]))
		if hs.recvRows[i] != 0 && d.hier.local[i] != d.hier.local[d.rank] {
			return h.abortOn(h.mismatch(i, "sends %d crossing rows to a rank that does not relay for it", hs.recvRows[i]))
		}
	}
	return rejected
}

// layoutCrossing sizes x for the rows and metadata of the crossing, writes
// the metadata this rank sends, and lists the spans of the exchange.
func (h *Handle) layoutCrossing() {
	d, hi, hs := h.d, h.d.hier, h.hs
	wb, mb, K, T := d.wireRow, hi.metaBytes, d.cfg.K, h.T
	hs.sent, hs.received = 0, 0
	for j := range d.size {
		hs.sendDispl[j], hs.recvDispl[j] = hs.sent, hs.received
		hs.sent += hs.sendRows[j]
		hs.received += hs.recvRows[j]
		hs.cur[j] = 0
		hs.sendSpans[j] = hs.sendSpans[j][:0]
		hs.recvSpans[j] = hs.recvSpans[j][:0]
	}
	S, R := hs.sent, hs.received
	metaOut := (T + R) * wb
	metaIn := metaOut + S*mb
	hs.x = growKeep(hs.x, metaIn+R*mb, T*wb)
	for g := range hs.lastTok {
		hs.lastTok[g] = -1
	}
	hs.pairs = hs.pairs[:0]
	hs.pairEnd = growInt32s(hs.pairEnd, T)
	owner, me, mine := d.rt.slots.Owner, d.rank, hi.hostOf[d.rank]
	le := binary.LittleEndian
	for t := range T {
		for a := t * K; a < (t+1)*K; a++ {
			if h.plan.Row[a] < 0 {
				continue
			}
			g := hi.hostOf[owner[h.slotDec.Expert[a]]]
			if g == mine || hs.lastTok[g] == t {
				continue
			}
			hs.lastTok[g] = t
			r := hi.relay(me, g)
			p := hs.sendDispl[r] + hs.cur[r]
			hs.cur[r]++
			hs.pairs = append(hs.pairs, int32(p))
			hs.sendSpans[r] = appendSpan(hs.sendSpans[r], a2a.Span{Off: t * wb, Len: wb})
			meta := hs.x[metaOut+p*mb : metaOut+(p+1)*mb]
			for s := range K {
				b := t*K + s
				e, w := int32(-1), float32(0)
				if h.plan.Row[b] >= 0 && hi.hostOf[owner[h.slotDec.Expert[b]]] == g {
					e, w = h.slotDec.Expert[b], h.dec.Weight[b]
				}
				le.PutUint32(meta[8*s:], uint32(e))
				le.PutUint32(meta[8*s+4:], math.Float32bits(w))
			}
		}
		hs.pairEnd[t] = int32(len(hs.pairs))
	}
	for j := range d.size {
		if n := hs.sendRows[j]; n > 0 {
			hs.sendSpans[j] = append(hs.sendSpans[j], a2a.Span{Off: metaOut + hs.sendDispl[j]*mb, Len: n * mb})
		}
		if n := hs.recvRows[j]; n > 0 {
			hs.recvSpans[j] = append(hs.recvSpans[j],
				a2a.Span{Off: (T + hs.recvDispl[j]) * wb, Len: n * wb},
				a2a.Span{Off: metaIn + hs.recvDispl[j]*mb, Len: n * mb})
		}
	}
}

// appendSpan appends s to spans, merged with the last span if it follows it.
func appendSpan(spans []a2a.Span, s a2a.Span) []a2a.Span {
	if n := len(spans); n > 0 && spans[n-1].Off+spans[n-1].Len == s.Off {
		spans[n-1].Len += s.Len
		return spans
	}
	return append(spans, s)
}

// prepareForward builds the inner dispatcher's step: the virtual tokens
// are this rank's own, with only the assignments to its host, then the
// relayed rows, with the assignments their metadata lists. Assignments
// keep the replica (destination slot) their sender chose, so that rows go
// where the flat path would send them.
func (h *Handle) prepareForward() (*Handle, error) {
	d, hi, hs := h.d, h.d.hier, h.hs
	inner := hi.inner
	K, T, R, wb, mb := d.cfg.K, h.T, hs.received, d.wireRow, hi.metaBytes
	Tv := T + R
	in := inner.handle()
	for _, dec := range []*routing.Decision{&in.dec, &in.slotDec} {
		dec.Tokens, dec.K = Tv, K
		dec.Expert = growInt32s(dec.Expert, Tv*K)
		dec.Weight = growFloats(dec.Weight, Tv*K)
	}
	owner, mine, expertOf := d.rt.slots.Owner, hi.hostOf[d.rank], d.rt.expertOf
	for a := range T * K {
		slot, w := routing.Dropped, float32(0)
		if h.plan.Row[a] >= 0 && hi.hostOf[owner[h.slotDec.Expert[a]]] == mine {
			slot, w = h.slotDec.Expert[a], h.dec.Weight[a]
		}
		in.slotDec.Expert[a], in.slotDec.Weight[a] = slot, w
	}
	le := binary.LittleEndian
	metaIn := (T+R)*wb + hs.sent*mb
	for i := range R * K {
		m := hs.x[metaIn+8*i:]
		slot, w := int32(le.Uint32(m)), math.Float32frombits(le.Uint32(m[4:]))
		if slot < 0 {
			slot, w = routing.Dropped, 0
		} else if int(slot) >= len(expertOf) || hi.hostOf[owner[slot]] != mine {
			inner.recycle(in)
			return nil, fmt.Errorf("%w: dispatch: a relayed row's destination slot %d is not on this host", a2a.ErrMismatch, slot)
		}
		in.slotDec.Expert[T*K+i], in.slotDec.Weight[T*K+i] = slot, w
	}
	for a, slot := range in.slotDec.Expert {
		in.dec.Expert[a], in.dec.Weight[a] = routing.Dropped, 0
		if slot >= 0 {
			in.dec.Expert[a], in.dec.Weight[a] = int32(expertOf[slot]), in.slotDec.Weight[a]
		}
	}
	if err := in.plan.Build(&in.slotDec, inner.rt.slots); err != nil {
		inner.recycle(in)
		return nil, fmt.Errorf("%w: dispatch: relayed rows: %w", a2a.ErrMismatch, err)
	}
	inner.rt.expertRows(in.plan.ExpertRows, in.expertLoad)
	in.ctx, in.T, in.dropped = h.ctx, Tv, 0
	in.tokens, in.preq = hs.x[:Tv*wb], nil
	if d.fp8 {
		in.tokens, in.preq = nil, hs.x[:Tv*wb]
	}
	in.state = stateDispatching
	return in, nil
}

// exchangeSplit tells every rank of this host, for each of its local
// slots, how many of the rows this rank forwards it come from the relayed
// ranks of each host: the inner dispatch's segments are per forwarding
// rank, and the caller's are per source rank.
func (h *Handle) exchangeSplit() error {
	d, hi, hs, in := h.d, h.d.hier, h.hs, h.hs.in
	P, K, H, maxLocal := d.size, d.cfg.K, hi.hosts, d.maxLocal
	blk := 4 * maxLocal * H
	hs.splitOut = grow(hs.splitOut, P*blk)
	hs.splitIn = grow(hs.splitIn, P*blk)
	clear(hs.splitOut)
	owner := d.rt.slots.Owner
	le := binary.LittleEndian
	src := 0 // the relayed rank of the virtual token, walked in recv order
	for v := range in.T {
		g := hi.hostOf[d.rank]
		if v >= h.T {
			for v-h.T >= hs.recvDispl[src]+hs.recvRows[src] {
				src++
			}
			g = hi.hostOf[src]
		}
		for a := v * K; a < (v+1)*K; a++ {
			if in.plan.Row[a] < 0 {
				continue
			}
			slot := in.slotDec.Expert[a]
			off := owner[slot]*blk + 4*(hi.slotLocal[slot]*H+g)
			le.PutUint32(hs.splitOut[off:], le.Uint32(hs.splitOut[off:])+1)
		}
	}
	return d.comm.AllToAll(h.ctx, hs.splitOut, hs.splitIn)
}

// splitSegments cuts the inner dispatch's segments (per forwarding rank of
// this host) into the caller's, per source rank: a forwarder's block for
// a local expert holds its own tokens' rows, then those of the ranks it
// relays for, in rank order.
func (h *Handle) splitSegments() error {
	d, hi, hs, in := h.d, h.d.hier, h.hs, h.hs.in
	P, H, rb := d.size, hi.hosts, d.rowBytes
	blk := 4 * d.maxLocal * H
	le := binary.LittleEndian
	for l := range d.nLocal {
		for s := range P {
			h.segs[l*P+s] = Segment{Source: s}
		}
		for _, i := range hi.ranksOn[hi.hostOf[d.rank]] {
			seg := in.segs[l*P+i]
			off, n := seg.Offset, 0
			for _, s := range hi.origins[i] {
				rows := int(le.Uint32(hs.splitIn[i*blk+4*(l*H+hi.hostOf[s]):]))
				h.segs[l*P+s] = Segment{Source: s, Offset: off, Rows: rows}
				off += rows * rb
				n += rows
			}
			if n != seg.Rows {
				return h.mismatch(i, "forwards %d rows for local expert %d, its split counts say %d", seg.Rows, l, n)
			}
		}
	}
	return nil
}

// runHierCombine is runCombine on the relay path: the inner combine sums
// each virtual token's outputs on this host into its partial row, the
// partial rows of relayed tokens cross back to their senders, and each
// token's partials are summed in float32 and rounded once.
func (h *Handle) runHierCombine(start time.Time) error {
	d, hs := h.d, h.hs
	in, rb, T := hs.in, d.rowBytes, h.T
	Tv := in.T
	hs.vout = grow(hs.vout, Tv*rb)
	if err := d.hier.inner.prepareCombine(h.ctx, in, h.expertOut, hs.vout); err != nil {
		return h.abortOn(err)
	}
	if err := in.exec(); err != nil {
		return err
	}
	back, fwd := hs.byteCounts[0], hs.byteCounts[1]
	for j := range d.size {
		back[j], fwd[j] = hs.recvRows[j]*rb, hs.sendRows[j]*rb
	}
	hs.ret = grow(hs.ret, hs.sent*rb)
	if err := d.comm.AllToAllV(h.ctx, hs.vout[T*rb:Tv*rb], back, hs.ret, fwd); err != nil {
		return err
	}
	h.sumPartials()
	h.finishHier(start, true)
	return nil
}

// sumPartials writes each token's sum of its partial rows: this host's
// (if it has an expert here) and one per remote host reached, in float32,
// rounded once to DType.
func (h *Handle) sumPartials() {
	d, hs := h.d, h.hs
	rb, dt, H := d.rowBytes, d.cfg.DType, d.cfg.Hidden
	hs.acc, hs.tmp = growFloats(hs.acc, H), growFloats(hs.tmp, H)
	p := int32(0)
	for t := range h.T {
		hs.rows = hs.rows[:0]
		if hs.ownKept[t] {
			hs.rows = append(hs.rows, hs.vout[t*rb:(t+1)*rb])
		}
		for ; p < hs.pairEnd[t]; p++ {
			q := int(hs.pairs[p])
			hs.rows = append(hs.rows, hs.ret[q*rb:(q+1)*rb])
		}
		dst := h.out[t*rb : (t+1)*rb]
		switch n := len(hs.rows); {
		case n == 0:
			clear(dst)
		case n == 1:
			copy(dst, hs.rows[0])
		case n == 2 && dt != reduce.Float16:
			axpbyRow(dt, dst, hs.rows[0], hs.rows[1], 1, 1, false)
		default:
			for i, row := range hs.rows {
				accumulate(dt, hs.acc, hs.tmp, row, 1, i == 0)
			}
			narrow(dt, dst, hs.acc)
		}
	}
}

// finishHier records a relay-path operation's time and tells the Observer.
func (h *Handle) finishHier(start time.Time, combine bool) {
	d := h.d
	if combine {
		h.combineTime = time.Since(start)
		if o := d.cfg.Observer; o != nil {
			o.ObserveCombine(h.combineTime)
		}
		return
	}
	h.dispatchTime, h.combineTime = time.Since(start), 0
	if o := d.cfg.Observer; o != nil {
		o.ObserveDispatch(h.dispatchTime, h.expertLoad, h.dropped, routing.Imbalance(h.plan.RankRows))
	}
}

func growBools(s []bool, n int) []bool {
	if cap(s) < n {
		return make([]bool, n)
	}
	return s[:n]
}

func growInt32s(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	return s[:n]
}

// growKeep returns b resliced to n bytes, or new memory holding b's first
// keep bytes if b is too small.
func growKeep(b []byte, n, keep int) []byte {
	if cap(b) < n {
		nb := largeBytes(n)
		copy(nb, b[:keep])
		return nb
	}
	return b[:n]
}

// newInner creates the inner dispatcher of the relay path, collectively:
// the same layer on the same Comm, flat, without capacity (the senders
// applied it), re-placement or observer.
func (d *Dispatcher) newInner(ctx context.Context) error {
	if d.hier == nil {
		return nil
	}
	cfg := d.cfg
	cfg.Hierarchy, cfg.CapacityFactor, cfg.Rebalance, cfg.Observer = HierarchyOff, 0, Rebalance{}, nil
	if d.cfg.Observer != nil {
		cfg.Observer = innerObserver{d.cfg.Observer}
	}
	cfg.Placement = d.pl
	inner, err := New(ctx, d.comm, cfg)
	if err != nil {
		return err
	}
	d.hier.inner = inner
	// When every rank forwards through shared memory only, the inner
	// combine's reverse AllToAllV carries no row: it only keeps a rank
	// from finishing before the others have mapped its outputs, which the
	// outer reverse AllToAllV that follows it does too (no rank sends its
	// part of that one before its inner weighted sum is done).
	mine := []byte{1}
	for j, shared := range inner.sharedWith {
		if j != d.rank && d.comm.Host(j) == d.comm.Host(d.rank) && !shared {
			mine[0] = 0
		}
	}
	all := make([]byte, d.size)
	if err := d.comm.AllGather(ctx, mine, all); err != nil {
		inner.Close()
		return err
	}
	inner.relayed = !slices.Contains(all, 0)
	return nil
}

// innerObserver passes the inner dispatcher's shared-memory traffic (the
// forward's rows) and load estimate (every row reaches its expert through
// the forward) on to the caller's Observer, if it wants them, and drops
// its steps: the outer dispatcher reports those.
type innerObserver struct{ o Observer }

func (innerObserver) ObserveDispatch(time.Duration, []int, int, float64) {}
func (innerObserver) ObserveCombine(time.Duration)                       {}

func (i innerObserver) ObserveSharedTraffic(sent, received int64) {
	if o, ok := i.o.(SharedTrafficObserver); ok {
		o.ObserveSharedTraffic(sent, received)
	}
}

func (i innerObserver) ObserveLoad(load []float64, imbalance float64) {
	if o, ok := i.o.(LoadObserver); ok {
		o.ObserveLoad(load, imbalance)
	}
}
