package algo

import (
	"cmp"
	"slices"
)

// PlanAllReduceHierarchical plans an AllReduce (send Bytes, recv Bytes) in
// two levels for ranks spread over hosts (Hosts; nil is one host), the 2D
// algorithm: ranks on a host form a grid row, ranks with the same local
// index on different hosts a column.
//
//  1. intra-host ring reduce-scatter over L chunks: local rank l ends with
//     chunk l reduced over its host;
//  2. inter-host ring reduce-scatter and allgather of chunk l among the
//     local ranks l of all H hosts: L rings run side by side, each moving
//     only 1/L of the data over the network;
//  3. intra-host ring allgather of the L chunks.
//
// L is the fewest ranks on any host. On a host with more, the ranks beyond
// the first L fold first, like the non-power-of-two fold of recursive
// doubling: local rank l >= L sends its data to local rank l mod L, which
// reduces it into its own (in increasing local order) before step 1 and
// sends it the result after step 3. With one rank on some host this is the
// leader algorithm (reduce to one rank per host, ring among those, send
// back); with one host it is the flat ring.
//
// Hosts are ordered by host id and ranks within a host by rank, both from
// Hosts, which every rank holds identically. Every chunk is reduced once per
// host along the intra-host ring, once across hosts along the inter-host
// ring, then copied, so all ranks get bit-identical results.
//
// In place: send and recv may be the same slice (see PlanAllReduceRing; a
// rank with folded partners first copies all of BufSend to BufRecv).
//
// Rounds: 2(L-1) + 2(H-1) + 1 local; a rank with folded partners has
// instead 1 local copy, one round per partner, and 1 more to return their
// result; a folded rank has 2. It writes into s, reusing its storage: planning into
// a reused Schedule allocates nothing.
func PlanAllReduceHierarchical(s *Schedule, a CollArgs) error {
	if err := a.validate("allreduce", collReduces); err != nil {
		return err
	}
	s.resetColl(AlgoHierarchical, &a)
	n, e, block := a.Bytes, a.elem(), a.block()
	whole := func(b Buf) Span { return Span{Buf: b, Len: n} }
	t := s.groupHosts(&a)
	nl, h, l, nh, L := t.local(), t.h, t.l, t.hosts(), t.minL
	if l >= L {
		partner := t.rank(h, l%L)
		s.addMessage(StepSend, partner, whole(BufSend), a.Streams, block)
		s.EndRound()
		s.addMessage(StepRecv, partner, whole(BufRecv), a.Streams, block)
		s.EndRound()
		return nil
	}
	fromSend := l+L >= nl // no folded partners
	if !fromSend {
		s.addCopy(whole(BufSend), whole(BufRecv))
		s.EndRound()
		for j := l + L; j < nl; j += L {
			s.addRecvReduce(t.rank(h, j), whole(BufRecv), whole(BufScratch), a.Streams, block)
			s.EndRound()
			s.ScratchBytes = n
		}
	}
	row := evenLayout(BufRecv, 0, n, e, L)
	rg1 := ring{i: l, m: L, prev: t.rank(h, mod(l-1, L)), next: t.rank(h, mod(l+1, L))}
	own := row.span(l)
	col := evenLayout(BufRecv, own.Off, own.Len, e, nh)
	rg2 := ring{i: h, m: nh, prev: t.rank(mod(h-1, nh), l), next: t.rank(mod(h+1, nh), l)}
	if L > 1 {
		s.ScratchBytes = max(s.ScratchBytes, row.maxLen())
	}
	if nh > 1 {
		s.ScratchBytes = max(s.ScratchBytes, col.maxLen())
	}
	s.addRingReduceScatter(&a, rg1, &row, fromSend)
	s.addRingReduceScatter(&a, rg2, &col, false)
	s.addRingAllGather(&a, rg2, &col, Span{}, false)
	s.addRingAllGather(&a, rg1, &row, Span{}, false)
	for j := l + L; j < nl; j += L {
		s.addMessage(StepSend, t.rank(h, j), whole(BufRecv), a.Streams, block)
	}
	s.EndRound()
	return nil
}

// hostGroups is the host grouping of a hierarchical plan, in planner scratch.
type hostGroups struct {
	idx    []int // ranks ordered by (host, rank): host x holds idx[starts[x]:starts[x+1]]
	starts []int // len hosts()+1
	h, l   int   // this rank's host position and local index
	minL   int   // fewest ranks on a host
}

func (t *hostGroups) hosts() int { return len(t.starts) - 1 }

// local is the number of ranks on this rank's host.
func (t *hostGroups) local() int { return t.starts[t.h+1] - t.starts[t.h] }

// rank is the rank with local index j on the host at position x.
func (t *hostGroups) rank(x, j int) int { return t.idx[t.starts[x]+j] }

// groupHosts groups the ranks by host (a.Hosts nil: one host), in s.work.
func (s *Schedule) groupHosts(a *CollArgs) hostGroups {
	p, hosts := a.World, a.Hosts
	w := s.ints(2*p + 1)
	t := hostGroups{idx: w[:p]}
	for i := range t.idx {
		t.idx[i] = i
	}
	if hosts != nil {
		slices.SortFunc(t.idx, func(x, y int) int {
			if c := cmp.Compare(hosts[x], hosts[y]); c != 0 {
				return c
			}
			return cmp.Compare(x, y)
		})
	}
	starts := w[p:]
	nh := 0
	t.minL = p
	sameHost := func(x, y int) bool { return hosts == nil || hosts[x] == hosts[y] }
	for i := 0; i < p; {
		j := i + 1
		for j < p && sameHost(t.idx[j], t.idx[i]) {
			j++
		}
		for k := i; k < j; k++ {
			if t.idx[k] == a.Rank {
				t.h, t.l = nh, k-i
			}
		}
		starts[nh] = i
		nh++
		t.minL = min(t.minL, j-i)
		i = j
	}
	starts[nh] = p
	t.starts = starts[:nh+1]
	return t
}
