package algo

import (
	"errors"
	"fmt"
)

// ErrUnevenHosts is returned by PlanStaged when hosts run different numbers
// of ranks; callers fall back to a flat algorithm.
var ErrUnevenHosts = errors.New("staged: hosts run different numbers of ranks")

// StagedArgs describes a staged two-level AllToAllV. Every rank passes the same
// Matrix (from the counts exchange) and Hosts, so all ranks derive the same
// segment sizes.
type StagedArgs struct {
	Rank, World int
	Matrix      []int // World*World, row-major: Matrix[i*World+j] = bytes rank i sends rank j
	Hosts       []int // host of every rank (any integers; equal values share a host)
	Streams     int   // streams per peer pair (>= 1)
	BlockSize   int   // max bytes per frame (0 = DefaultBlockSize)
}

// PlanStaged plans a staged two-level AllToAllV (DESIGN §5, after HCCL's
// hierarchical all-to-all): ranks are grouped by host (H hosts x L local
// ranks; local index = rank order within the host).
//
//   - Phase 1, intra-host: rank (h,l) hands each local peer (h,l') everything
//     it sends to local index l' on every host: blocks for (h,l') itself land in
//     its receive buffer, blocks for (h',l') with h' != h in its staging area,
//     grouped by destination host.
//   - Phase 2, inter-host: (h,l') sends (h',l') the staged segment for host h'
//     (the blocks of all of host h's ranks for (h',l'), in local order) as one
//     message. Each rank thus sends H-1 network messages instead of (H-1)L.
//
// When a host's ranks are consecutive (as rank assignment at join makes them)
// phase-2 data lands straight in the receive buffer; otherwise it lands in
// scratch and a third round copies each block to its place. Hosts of different
// sizes return ErrUnevenHosts.
func PlanStaged(s *Schedule, a StagedArgs) error {
	if err := a.validate(); err != nil {
		return err
	}
	s.Reset(AlgoStaged)
	t, err := s.topology(a.Hosts)
	if err != nil {
		return err
	}
	pl := stagedPlan{s: s, a: &a, t: &t, me: a.Rank, host: t.host[a.Rank], local: t.local[a.Rank], block: frameBlock(a.BlockSize)}
	matrixDisplacements(a.Matrix, a.World, a.Rank, t.sd, t.rd)
	staging := pl.stagingSegments()
	pl.intraHostRound() // phase 1
	s.EndRound()
	scratch, copies := pl.interHostRound(staging) // phase 2
	s.EndRound()
	if copies { // segments from hosts of scattered ranks landed in scratch
		pl.placeLandedRound(staging)
		s.EndRound()
	}
	s.ScratchBytes = scratch
	return nil
}

// validate reports arguments PlanStaged cannot plan before it writes a step;
// uneven hosts are found later, by topology.
func (a *StagedArgs) validate() error {
	w := a.World
	switch {
	case w < 1 || a.Rank < 0 || a.Rank >= w:
		return fmt.Errorf("staged: rank %d of world %d", a.Rank, w)
	case len(a.Matrix) != w*w:
		return fmt.Errorf("staged: matrix has %d entries, want %d", len(a.Matrix), w*w)
	case len(a.Hosts) != w:
		return fmt.Errorf("staged: %d host entries, want %d", len(a.Hosts), w)
	case a.Streams < 1 || a.BlockSize < 0:
		return fmt.Errorf("staged: streams %d, block size %d", a.Streams, a.BlockSize)
	}
	return negativeEntry("staged", a.Matrix, w)
}

// stagedPlan is what PlanStaged's rounds share: this rank's place in the
// host topology, whose sd, rd and fwd hold its send and receive
// displacements and its staging segments.
type stagedPlan struct {
	s           *Schedule
	a           *StagedArgs
	t           *hostTopology
	me          int // this rank
	host, local int // its host ordinal and local index
	block       int
}

// m is the number of bytes rank i sends rank j.
func (pl *stagedPlan) m(i, j int) int { return pl.a.Matrix[i*pl.a.World+j] }

// stagingSegments lays out the staging area and returns its size: fwd[h'] is
// the segment this rank forwards to (h', local), the blocks of every rank of
// its host (in local order) destined for (h', local); fwd[hosts] is the end.
func (pl *stagedPlan) stagingSegments() int {
	t, fwd, scratch := pl.t, pl.t.fwd, 0
	for hh := range t.hosts {
		fwd[hh] = scratch
		if hh != pl.host {
			for ll := range t.per {
				scratch += pl.m(t.member(pl.host, ll), t.member(hh, pl.local))
			}
		}
	}
	fwd[t.hosts] = scratch
	return scratch
}

// intraHostRound appends phase 1: one exchange with every local peer, and
// the local copies.
func (pl *stagedPlan) intraHostRound() {
	for ll := range pl.t.per {
		p := pl.t.member(pl.host, ll)
		if p == pl.me {
			pl.copyOwnBlocks(ll)
			continue
		}
		pl.sendToLocalPeer(p, ll)
		pl.recvFromLocalPeer(p, ll)
	}
}

// stagingSpan is where, in this rank's staging segment for (hh, local), the
// block of local rank (host, ll) goes.
func (pl *stagedPlan) stagingSpan(ll, hh, n int) Span {
	return Span{Buf: BufScratch, Off: pl.t.fwd[hh] + pl.t.before(pl.a.Matrix, pl.host, ll, hh, pl.local), Len: n}
}

// sendSpan is this rank's send block for rank dst.
func (pl *stagedPlan) sendSpan(dst int) Span {
	return Span{Buf: BufSend, Off: pl.t.sd[dst], Len: pl.m(pl.me, dst)}
}

// copyOwnBlocks copies, locally, this rank's blocks for local index ll (its
// own): the block for itself into its receive buffer and those for (hh, ll)
// on other hosts into its staging segments.
func (pl *stagedPlan) copyOwnBlocks(ll int) {
	for hh := range pl.t.hosts {
		span := pl.sendSpan(pl.t.member(hh, ll))
		switch {
		case span.Len == 0:
		case hh == pl.host: // my block for myself
			pl.s.Add(Step{Kind: StepCopy, Peer: pl.me, Src: span, Dst: Span{Buf: BufRecv, Off: pl.t.rd[pl.me], Len: span.Len}})
		default: // my own block to forward to (hh, local)
			pl.s.Add(Step{Kind: StepCopy, Peer: pl.me, Src: span, Dst: pl.stagingSpan(ll, hh, span.Len)})
		}
	}
}

// sendToLocalPeer sends local peer p, of local index ll, this rank's blocks
// for (hh, ll) on every host, in host order.
func (pl *stagedPlan) sendToLocalPeer(p, ll int) {
	for hh := range pl.t.hosts {
		pl.s.addMessage(StepSend, p, pl.sendSpan(pl.t.member(hh, ll)), pl.a.Streams, pl.block)
	}
}

// recvFromLocalPeer receives local peer p's (local index ll) blocks for (hh,
// local) on every host, in host order: its block for this rank into the
// receive buffer, the others into their staging segments.
func (pl *stagedPlan) recvFromLocalPeer(p, ll int) {
	for hh := range pl.t.hosts {
		n := pl.m(p, pl.t.member(hh, pl.local))
		dst := Span{Buf: BufRecv, Off: pl.t.rd[p], Len: n}
		if hh != pl.host {
			dst = pl.stagingSpan(ll, hh, n)
		}
		pl.s.addMessage(StepRecv, p, dst, pl.a.Streams, pl.block)
	}
}

// interHostRound appends phase 2, the exchange with the same local index on
// every other host. A segment from a host whose ranks are consecutive lands
// straight in the receive buffer; the others land in scratch after the
// staging area (staging bytes), and copies reports whether any did. It
// returns the scratch size.
func (pl *stagedPlan) interHostRound(staging int) (scratch int, copies bool) {
	t, fwd := pl.t, pl.t.fwd
	scratch = staging
	for d := 1; d < t.hosts; d++ {
		to, from := (pl.host+d)%t.hosts, (pl.host-d+t.hosts)%t.hosts
		pl.s.addMessage(StepSend, t.member(to, pl.local), Span{Buf: BufScratch, Off: fwd[to], Len: fwd[to+1] - fwd[to]}, pl.a.Streams, pl.block)
		n := 0
		for ll := range t.per {
			n += pl.m(t.member(from, ll), pl.me)
		}
		if t.consecutive(from) {
			pl.s.addMessage(StepRecv, t.member(from, pl.local), Span{Buf: BufRecv, Off: t.rd[t.member(from, 0)], Len: n}, pl.a.Streams, pl.block)
			continue
		}
		pl.s.addMessage(StepRecv, t.member(from, pl.local), Span{Buf: BufScratch, Off: scratch, Len: n}, pl.a.Streams, pl.block)
		scratch += n
		copies = true
	}
	return scratch, copies
}

// placeLandedRound appends the third round: it copies each block of the
// segments interHostRound landed in scratch (from offset landing on) to its
// place in the receive buffer.
func (pl *stagedPlan) placeLandedRound(landing int) {
	t, off := pl.t, landing
	for d := 1; d < t.hosts; d++ {
		from := (pl.host - d + t.hosts) % t.hosts
		if t.consecutive(from) {
			continue
		}
		for ll := range t.per {
			src := t.member(from, ll)
			if n := pl.m(src, pl.me); n > 0 {
				pl.s.Add(Step{Kind: StepCopy, Peer: pl.me, Src: Span{Buf: BufScratch, Off: off, Len: n}, Dst: Span{Buf: BufRecv, Off: t.rd[src], Len: n}})
			}
			off += pl.m(src, pl.me)
		}
	}
}

// hostTopology is the grouping of ranks by host, kept in the Schedule's work
// storage so that re-planning allocates nothing.
type hostTopology struct {
	hosts, per  int
	host, local []int // by rank: host ordinal (order of first appearance), local index
	members     []int // host ordinal * per + local index -> rank
	sd, rd, fwd []int
	hostIDs     []int
}

func (t *hostTopology) member(h, l int) int { return t.members[h*t.per+l] }

// consecutive reports whether host h's ranks are consecutive integers in
// local order, so their blocks are adjacent in a receive buffer.
func (t *hostTopology) consecutive(h int) bool {
	for l := 1; l < t.per; l++ {
		if t.member(h, l) != t.member(h, 0)+l {
			return false
		}
	}
	return true
}

// before is the offset, inside the segment that (h, *) forwards to (hh, l), of
// the block of local rank (h, ll): the sum of the blocks of (h, 0..ll-1).
func (t *hostTopology) before(matrix []int, h, ll, hh, l int) int {
	w := len(t.host)
	dst := t.member(hh, l)
	off := 0
	for k := 0; k < ll; k++ {
		off += matrix[t.member(h, k)*w+dst]
	}
	return off
}

// topology groups ranks by host using s.work as storage; hosts must hold
// equal numbers of ranks.
func (s *Schedule) topology(hostIDs []int) (hostTopology, error) {
	t := s.numberHosts(hostIDs)
	w, counts := len(hostIDs), t.fwd
	t.per = counts[0]
	for k := 1; k < t.hosts; k++ {
		if counts[k] != t.per {
			return t, fmt.Errorf("%w: host %d has %d ranks, host %d has %d", ErrUnevenHosts, t.hostIDs[0], t.per, t.hostIDs[k], counts[k])
		}
	}
	for r := range w {
		t.members[t.host[r]*t.per+t.local[r]] = r
	}
	// fwd needs hosts+1 entries (the end of the last segment).
	t.fwd = t.fwd[:t.hosts+1]
	return t, nil
}

// numberHosts numbers the hosts of hostIDs in order of first appearance,
// using s.work as storage: t.host[r] is rank r's host, t.local[r] its index
// among that host's ranks, and, until topology fills it, t.fwd[h] counts
// host h's ranks. Hosts may be uneven.
func (s *Schedule) numberHosts(hostIDs []int) hostTopology {
	w := len(hostIDs)
	need := 7*w + 1
	if cap(s.work) < need {
		s.work = make([]int, need)
	}
	buf := s.work[:need]
	t := hostTopology{host: buf[0:w], local: buf[w : 2*w], members: buf[2*w : 3*w], sd: buf[3*w : 4*w], rd: buf[4*w : 5*w],
		hostIDs: buf[5*w : 6*w], fwd: buf[6*w : 7*w+1]}
	counts := t.fwd // reused as per-host rank counts until fwd is filled
	for r, id := range hostIDs {
		ord := -1
		for k := 0; k < t.hosts; k++ {
			if t.hostIDs[k] == id {
				ord = k
				break
			}
		}
		if ord < 0 {
			ord = t.hosts
			t.hostIDs[ord] = id
			counts[ord] = 0
			t.hosts++
		}
		t.host[r], t.local[r] = ord, counts[ord]
		counts[ord]++
	}
	return t
}
