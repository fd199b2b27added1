package a2a

import (
	"github.com/a2a-moe/a2a/a2a/algo"
)

// llPolicy is which blocks of an AllToAllV and which collectives go by the
// LL protocol, from the settings and the peers' slots, fixed at join (and
// at SetAlgo).
type llPolicy struct {
	cut   []int  // LL cutoff by peer, nil without LL
	quiet []bool // peers whose larger blocks need no LL announcement
	// barrier: every peer has an LL slot, so Barrier is one LL round
	// instead of log2(p) dissemination rounds.
	barrier bool
	// allReduce: an AllReduce of at most this many bytes is one LL round
	// (where Barrier is); -1 when none is.
	allReduce int
}

// newLLPolicy is the policy of the joined Comm, whose engine runs, under
// its current algorithm: made at join and again at SetAlgo, so that a Comm
// whose setting changed plans as one that joined with the new setting. A
// communicator made by Split or Dup has none: it sends its small messages
// as frames (Split).
func (c *Comm) newLLPolicy() llPolicy {
	if c.isChild() {
		return llPolicy{allReduce: -1}
	}
	var p llPolicy
	p.cut, p.quiet = c.llCutoffs()
	p.barrier = p.cut != nil && c.size <= llBarrierMaxRanks
	for r := range c.size {
		p.barrier = p.barrier && (r == c.rank || c.eng.SlotBytes(r) > 0)
	}
	p.allReduce = -1
	if p.barrier {
		p.allReduce = llAllReduceBound(c.rank, p.cut, func(r int) bool { return c.PeerCapabilities(r).PackedSlots })
	}
	return p
}

// llAllReduceBound is the largest AllReduce a rank sends by LL, given its
// peers' LL cutoffs (cut, this rank's own entry aside) and whether a peer's
// slots are packed: llAllReduceBytes, or llAllReduceWordBytes if a peer's
// are not, and at most every cutoff less the message's 8-byte signature.
func llAllReduceBound(rank int, cut []int, packed func(peer int) bool) int {
	bound := llAllReduceBytes
	for r, cr := range cut {
		if r == rank {
			continue
		}
		bound = min(bound, cr-8)
		if !packed(r) {
			bound = min(bound, llAllReduceWordBytes)
		}
	}
	return bound
}

// llBarrierMaxRanks bounds the one-round LL barrier: p-1 stores and loads
// per rank are cheaper than log2(p) rounds of wake-ups while p is small
// (`a2ad bench --op barrier --transport shm`: 2 ranks 0.6-0.8 us against
// 0.87 us for dissemination, 4 ranks on 2 cores 4.6 us against 5.2 us).
const llBarrierMaxRanks = 64

// llAllReduceBytes bounds the one-round LL AllReduce (also by the LL
// cutoff) where every peer's slots are packed (shm). Its p-1 stores of n
// bytes and local reduction grow with n where recursive doubling's log2(p)
// exchanges barely do, but on one host it was ahead to the slot's end
// (a2ad bench --transport shm, p50 us, LL against recursive doubling,
// measured under load: 2 ranks 512 B 0.78-1.12/1.22-1.29, 1 KiB
// 0.85-0.93/1.49-1.54, 2 KiB 1.20-1.54/2.03-2.09; 4 ranks on 2 cores 512 B
// 8.1-8.4/12.6-13.9, 2 KiB 11.4-12.0/14.1-16.5; 8 ranks 2 KiB
// 24.5-37.3/32.1-42.3). The message carries an 8-byte signature, so a
// 4 KiB slot takes up to 4088 bytes.
const llAllReduceBytes = 4096

// llAllReduceWordBytes is llAllReduceBytes where a peer's slots take the
// word form (verbs), whose stores move twice the payload: there LL and
// recursive doubling met near 256 B when shm had the word form (one host,
// in us: 2 ranks 8 B 0.57/0.83, 256 B 0.93/0.92, 512 B 1.17/0.98; 4 ranks
// on 2 cores 8 B 4.02/5.59, 256 B 5.20/6.00, 512 B 6.31/6.13).
const llAllReduceWordBytes = 256

// llCutoffs is the LL cutoff of every peer (algo.AllToAllVArgs.LLCutoff)
// and which peers are quiet (LLQuiet), from settings and link classes both
// ends of a pair share: blocks of up to LLBytes, capped by the slot size
// where the pair has a slot; a peer without one gets its LL messages as
// frames. Under auto selection peers are quiet: small blocks all go in the
// first round (one frame each to a peer without a slot, instead of waiting
// for their turn in fullmesh's windows), while larger blocks go by frames
// alone. An announcement would cost a network crossing, or on one host a
// round in which every rank waits for every peer's store (4 ranks on shm,
// 64 KiB: 78-81 us against 64-68 us without). A disagreement about a
// length still fails at once on the side that sees it: in a frame header,
// in a Load that finds a frame, or in the slot the receiver of frames
// watches (transport.SlotWatcher, which shm and verbs implement); a slot
// peer whose transport cannot watch keeps announcing. With A2A_ALGO=ll
// every peer announces. Nil when no pair uses LL.
func (c *Comm) llCutoffs() ([]int, []bool) {
	forced := c.plan.algo == algo.AlgoLL
	if c.size < 2 || (!forced && (c.cfg.Algo != "" || c.cfg.LLBytes < 0)) {
		return nil, nil
	}
	limit := c.cfg.LLBytes
	if limit < 0 {
		limit = DefaultLLBytes
	}
	cut, quiet := make([]int, c.size), make([]bool, c.size)
	for r := range cut {
		cut[r] = -1
		if r == c.rank {
			continue
		}
		if slot := c.eng.SlotBytes(r); slot > 0 {
			cut[r], quiet[r] = min(limit, slot), !forced && c.eng.Watches(r)
		} else {
			cut[r], quiet[r] = limit, !forced
		}
	}
	return cut, quiet
}

// llPriceCutoffs is the LL cutoff the automatic choice prices a pair of one
// host and of two hosts with. It must be the same on every rank, so it
// comes from what every rank shares (the settings and the agreed link
// classes, linkClasses.llCutoff), not from this rank's own peers. Negative: no LL.
func (c *Comm) llPriceCutoffs() (local, remote int) {
	if c.ll.cut == nil || c.plan.algo == algo.AlgoLL {
		return -1, -1
	}
	return c.plan.classes.llCutoff(c.plan.links.LocalClass, c.cfg.LLBytes), c.plan.classes.llCutoff(c.plan.links.RemoteClass, c.cfg.LLBytes)
}
