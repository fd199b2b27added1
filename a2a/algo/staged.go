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
	if err := negativeEntry("staged", a.Matrix, w); err != nil {
		return err
	}
	s.Reset(AlgoStaged)
	t, err := s.topology(a.Hosts)
	if err != nil {
		return err
	}
	block := frameBlock(a.BlockSize)
	m := func(i, j int) int { return a.Matrix[i*w+j] }
	me := a.Rank
	h, l := t.host[me], t.local[me]
	// Displacements of my send blocks (by destination) and receive blocks (by source).
	sd, rd := t.sd, t.rd
	matrixDisplacements(a.Matrix, w, me, sd, rd)
	// Staging: fwd[h'] is the segment this rank forwards to (h', l): the blocks
	// of every local rank (in local order) destined for (h', l).
	fwd, scratch := t.fwd, 0
	for hh := range t.hosts {
		fwd[hh] = scratch
		if hh != h {
			for ll := range t.per {
				scratch += m(t.member(h, ll), t.member(hh, l))
			}
		}
	}
	fwd[t.hosts] = scratch
	// Phase 1: one round with every local peer (and the local copies).
	for ll := range t.per {
		p := t.member(h, ll)
		for hh := range t.hosts { // blocks to (hh, ll), in host order on both sides
			dst := t.member(hh, ll)
			span := Span{Buf: BufSend, Off: sd[dst], Len: m(me, dst)}
			switch {
			case p != me:
				s.addMessage(StepSend, p, span, a.Streams, block)
			case hh == h: // my block for myself
				if span.Len > 0 {
					s.Add(Step{Kind: StepCopy, Peer: me, Src: span, Dst: Span{Buf: BufRecv, Off: rd[me], Len: span.Len}})
				}
			case span.Len > 0: // my own block to forward to (hh, l)
				s.Add(Step{Kind: StepCopy, Peer: me, Src: span, Dst: Span{Buf: BufScratch, Off: fwd[hh] + t.before(a.Matrix, h, ll, hh, l), Len: span.Len}})
			}
		}
		if p == me {
			continue
		}
		for hh := range t.hosts { // blocks from (h, ll) to (hh, l)
			n := m(p, t.member(hh, l))
			dst := Span{Buf: BufRecv, Off: rd[p], Len: n}
			if hh != h {
				dst = Span{Buf: BufScratch, Off: fwd[hh] + t.before(a.Matrix, h, ll, hh, l), Len: n}
			}
			s.addMessage(StepRecv, p, dst, a.Streams, block)
		}
	}
	s.EndRound()
	// Phase 2: exchange with the same local index on every other host.
	landing := scratch
	copies := false
	for d := 1; d < t.hosts; d++ {
		to, from := (h+d)%t.hosts, (h-d+t.hosts)%t.hosts
		s.addMessage(StepSend, t.member(to, l), Span{Buf: BufScratch, Off: fwd[to], Len: fwd[to+1] - fwd[to]}, a.Streams, block)
		n := 0
		for ll := range t.per {
			n += m(t.member(from, ll), me)
		}
		if t.consecutive(from) {
			s.addMessage(StepRecv, t.member(from, l), Span{Buf: BufRecv, Off: rd[t.member(from, 0)], Len: n}, a.Streams, block)
			continue
		}
		s.addMessage(StepRecv, t.member(from, l), Span{Buf: BufScratch, Off: scratch, Len: n}, a.Streams, block)
		scratch += n
		copies = true
	}
	s.EndRound()
	if copies {
		off := landing
		for d := 1; d < t.hosts; d++ {
			from := (h - d + t.hosts) % t.hosts
			if t.consecutive(from) {
				continue
			}
			for ll := range t.per {
				src := t.member(from, ll)
				if n := m(src, me); n > 0 {
					s.Add(Step{Kind: StepCopy, Peer: me, Src: Span{Buf: BufScratch, Off: off, Len: n}, Dst: Span{Buf: BufRecv, Off: rd[src], Len: n}})
				}
				off += m(src, me)
			}
		}
		s.EndRound()
	}
	s.ScratchBytes = scratch
	return nil
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
