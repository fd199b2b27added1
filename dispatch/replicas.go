package dispatch

import (
	"github.com/a2a-moe/a2a/routing"
)

// route is the layer's placement as the dispatcher sends rows by it. Every
// filled physical slot of the placement is one destination, numbered in slot
// order (slot ids with the empty slots left out): slots is the one-replica
// placement of those destinations over the ranks, so that routing.Plan, the
// counts exchange and combine work on slots exactly as they used to work on
// experts. A rank's local slot l is its l-th filled slot, which is slot
// r*SlotsPerRank()+l for every placement whose empty slots trail its filled
// ones (all of routing's constructors), and its expert is expertOf[l].
type route struct {
	pl       *routing.Placement // the logical placement, as the caller gave it
	slots    *routing.Placement // one "expert" per filled slot, on the slot's rank
	expertOf []int              // destination -> logical expert
	copies   []int              // replicas per logical expert
	locals   []int              // logical expert of each local slot (LocalExperts)
	// choice[e] lists the destinations this rank spreads expert e's rows
	// over: its own replica, else the replicas on its host, else all.
	choice   [][]int32
	nLocal   int   // filled slots on this rank
	maxLocal int   // filled slots on the busiest rank
	hdr      []int // CountsNATS: header bytes of the block for rank j (0 in-band)
}

// newRoute derives the route of placement pl (validated) for rank me, host
// telling the host of each rank.
func newRoute(pl *routing.Placement, me int, host func(int) int, counts CountsMode) *route {
	table := pl.SlotTable()
	n := len(table)
	spr := n / pl.Ranks
	dest := make([]int, n) // slot -> destination, -1 when empty
	owner := make([]int, 0, n)
	expertOf := make([]int, 0, n)
	for s, e := range table {
		dest[s] = -1
		if e != routing.EmptySlot {
			dest[s] = len(owner)
			owner = append(owner, s/spr)
			expertOf = append(expertOf, e)
		}
	}
	slots, err := routing.FromTable(len(owner), pl.Ranks, owner)
	if err != nil {
		panic("dispatch: slot table of a valid placement: " + err.Error()) // cannot happen: owners are ranks
	}
	rt := &route{pl: pl, slots: slots, expertOf: expertOf, choice: make([][]int32, pl.Experts),
		nLocal: len(slots.PerRank[me]), hdr: make([]int, pl.Ranks)}
	for _, ds := range slots.PerRank {
		rt.maxLocal = max(rt.maxLocal, len(ds))
	}
	for r, ds := range slots.PerRank {
		if counts == CountsNATS {
			// The counts for the receiver's slots, then the sender's
			// loads of the previous step (load.go).
			rt.hdr[r] = alignUp(4*(len(ds)+rt.maxLocal), HeaderAlign)
		}
	}
	rt.copies = make([]int, pl.Experts)
	for e := range pl.Experts {
		rt.choice[e] = choose(pl.Replicas(e), dest, spr, me, host)
		rt.copies[e] = len(pl.Replicas(e))
	}
	rt.locals = rt.localExperts(me)
	return rt
}

// choose returns the destinations among replicas (slots) that rank me sends
// an expert's rows to: the replica on this rank, if any; else those on this
// rank's host, if any; else all of them.
func choose(replicas, dest []int, spr, me int, host func(int) int) []int32 {
	for _, s := range replicas {
		if s/spr == me {
			return []int32{int32(dest[s])}
		}
	}
	var near, all []int32
	for _, s := range replicas {
		all = append(all, int32(dest[s]))
		if host(s/spr) == host(me) {
			near = append(near, int32(dest[s]))
		}
	}
	if len(near) > 0 {
		return near
	}
	return all
}

// assign writes into dst the decision src (logical experts, capacity
// applied) with every kept assignment sent to one destination slot: token t
// of rank me goes to choice[e][(t+me) mod len], which spreads an expert's
// rows evenly over its replicas by token index, each rank starting at a
// different replica so that small batches do not all pick the first. It
// reuses dst's storage.
func (rt *route) assign(src, dst *routing.Decision, me int) {
	dst.Tokens, dst.K = src.Tokens, src.K
	dst.Expert = append(dst.Expert[:0], src.Expert...)
	dst.Weight = append(dst.Weight[:0], src.Weight...)
	K := src.K
	for a, e := range dst.Expert {
		if e == routing.Dropped {
			continue
		}
		c := rt.choice[e]
		if len(c) == 1 {
			dst.Expert[a] = c[0]
			continue
		}
		dst.Expert[a] = c[(a/K+me)%len(c)]
	}
}

// expertRows adds up the rows per destination of a plan into rows per
// logical expert, into dst (one entry per expert).
func (rt *route) expertRows(perSlot, dst []int) {
	clear(dst)
	for v, n := range perSlot {
		dst[rt.expertOf[v]] += n
	}
}

// local returns the logical expert of this rank's local slot l.
func (rt *route) local(me, l int) int { return rt.expertOf[rt.slots.PerRank[me][l]] }

// localExperts lists the logical experts of this rank's local slots.
func (rt *route) localExperts(me int) []int {
	ds := rt.slots.PerRank[me]
	out := make([]int, len(ds))
	for l, v := range ds {
		out[l] = rt.expertOf[v]
	}
	return out
}
