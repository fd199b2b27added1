package algo

import (
	"fmt"
	"math"
)

// DefaultBlockSize is the largest frame an alltoallv algorithm sends when
// AllToAllVArgs.BlockSize is 0. Messages
// above ~1 MiB fall off a cache cliff on these machines when sent whole (2
// ranks, 2 MiB per peer: ~1080 us; in 512 KiB pieces, one in flight per
// direction: ~675 us), so pairwise exchanges big messages frame by frame.
const DefaultBlockSize = 512 << 10

// DefaultWindow is the fullmesh concurrency (peers in flight per round) when
// AllToAllVArgs.Window is 0: MPICH's default throttle of its alltoall
// (MPIR_CVAR_ALLTOALL_THROTTLE), so that up to 33 ranks every peer is in
// flight at once and a larger group does not have every rank's peers send
// to it together. It was 4; at 8 ranks (7 peers, two rounds with 4) one
// round instead was faster in every case measured on the 2-core VM, p50 us
// of 2 alternations: the test bed (4 hosts x 2 ranks, shm and TCP, forced
// fullmesh) 8 B 317-335 -> 148-190, 1 KiB 378-394 -> 173-232, 64 KiB
// 818-1022 -> 486-487, 1 MiB 21.5-22.6 ms -> 15.5-17.0; 8 ranks on shm
// (auto) 1 KiB 58-67 -> 35-44, 64 KiB 283-290 -> 250-262, 1 MiB 6.4-7.0 ms
// -> 5.8-6.0; 8 ranks on single-host TCP within the noise.
const DefaultWindow = 32

// AllToAllVArgs is one rank's view of an AllToAllV: what it sends to and
// receives from every peer, and how the transfers may be cut and spread.
// The send and receive buffers are consecutive blocks in rank order, so the
// displacement of a peer's block is the prefix sum of the counts before it.
type AllToAllVArgs struct {
	Rank, World int
	SendCounts  []int // bytes this rank sends to each peer
	RecvCounts  []int // bytes this rank receives from each peer
	Streams     int   // streams per peer pair (>= 1)
	Window      int   // fullmesh concurrency C: peers in flight per round (0 = DefaultWindow, capped at World-1)
	BlockSize   int   // max bytes per frame (0 = DefaultBlockSize); larger messages are cut into frames
	// LLCutoff, when not nil, moves small blocks with the LL epoch/slot
	// protocol, by peer: the block to or from peer travels as one LL store
	// when it has at most LLCutoff[peer] bytes; a larger one announces its
	// length by LL (CountOnly) and travels by frames afterwards; a negative
	// cutoff leaves the peer to frames alone. Both ends of a pair must hold
	// the same cutoff for it (it follows from the link class and settings
	// every rank shares).
	LLCutoff []int
	// LLQuiet, when not nil, marks the peers whose blocks above their
	// cutoff travel by frames alone, without the length announcement,
	// which would cost a network crossing before the data: peers without a
	// slot, whose LL messages are frames themselves, so that a disagreement
	// about a length shows in the frame headers, and peers whose slot this
	// rank watches while their first frame is due (Step.WatchLL).
	LLQuiet []bool
}

// Validate reports arguments that no algorithm can plan. Everything it checks
// is local, so a bad call is rejected before any byte moves.
func (a *AllToAllVArgs) Validate() error {
	if a.World < 1 {
		return fmt.Errorf("alltoallv: world %d < 1", a.World)
	}
	if a.Rank < 0 || a.Rank >= a.World {
		return fmt.Errorf("alltoallv: rank %d out of range [0, %d)", a.Rank, a.World)
	}
	if len(a.SendCounts) != a.World {
		return fmt.Errorf("alltoallv: len(SendCounts)=%d, want world %d", len(a.SendCounts), a.World)
	}
	if len(a.RecvCounts) != a.World {
		return fmt.Errorf("alltoallv: len(RecvCounts)=%d, want world %d", len(a.RecvCounts), a.World)
	}
	if a.Streams < 1 {
		return fmt.Errorf("alltoallv: streams %d < 1", a.Streams)
	}
	if a.Window < 0 {
		return fmt.Errorf("alltoallv: window %d < 0", a.Window)
	}
	if a.BlockSize < 0 {
		return fmt.Errorf("alltoallv: block size %d < 0", a.BlockSize)
	}
	if a.LLQuiet != nil && len(a.LLQuiet) != a.World {
		return fmt.Errorf("alltoallv: len(LLQuiet)=%d, want world %d", len(a.LLQuiet), a.World)
	}
	if a.LLCutoff != nil && len(a.LLCutoff) != a.World {
		return fmt.Errorf("alltoallv: len(LLCutoff)=%d, want world %d", len(a.LLCutoff), a.World)
	}
	// The counts are block lengths in one buffer: their sum, each block's
	// displacement, must be an int too.
	for _, c := range []struct {
		name   string
		counts []int
	}{{"SendCounts", a.SendCounts}, {"RecvCounts", a.RecvCounts}} {
		total := 0
		for i, n := range c.counts {
			if n < 0 {
				return fmt.Errorf("alltoallv: %s[%d]=%d < 0", c.name, i, n)
			}
			if n > math.MaxInt-total {
				return fmt.Errorf("alltoallv: %s sum past the largest int at [%d]=%d", c.name, i, n)
			}
			total += n
		}
	}
	// The self block is a local copy, so its two ends must agree here; every
	// other pair is checked by the receiver against the frames it gets.
	if a.SendCounts[a.Rank] != a.RecvCounts[a.Rank] {
		return fmt.Errorf("alltoallv: rank %d sends itself %d bytes but expects %d",
			a.Rank, a.SendCounts[a.Rank], a.RecvCounts[a.Rank])
	}
	return nil
}

func (a *AllToAllVArgs) blockSize() int { return frameBlock(a.BlockSize) }

// frameBlock is the largest frame for a BlockSize setting: the setting
// itself, or DefaultBlockSize when it is 0 (or less).
func frameBlock(blockSize int) int {
	if blockSize <= 0 {
		return DefaultBlockSize
	}
	return blockSize
}

// FrameCount is the number of frames a message of n bytes travels as with the
// given block size (<= 0 means DefaultBlockSize): max(1, ceil(n/block)). Every
// message has at least one frame so that the receiver validates its length
// even when it is empty.
func FrameCount(n, blockSize int) int {
	blockSize = frameBlock(blockSize)
	if n <= 0 {
		return 1
	}
	return 1 + (n-1)/blockSize // ceil(n/blockSize); n+blockSize-1 could overflow
}

// fullmeshWindow is the effective fullmesh concurrency: DefaultWindow when
// unset, never more than the number of peers, never less than one.
func fullmeshWindow(window, world int) int {
	c := window
	if c <= 0 {
		c = DefaultWindow
	}
	if c > world-1 {
		c = world - 1
	}
	if c < 1 {
		c = 1
	}
	return c
}

// displacements returns the send and receive block offsets of every peer,
// stored in s.work so that a reused Schedule plans without allocating.
func (s *Schedule) displacements(a *AllToAllVArgs) (sd, rd []int) {
	need := 2 * a.World
	if cap(s.work) < need {
		s.work = make([]int, need)
	}
	w := s.work[:need]
	sd, rd = w[:a.World:a.World], w[a.World:]
	so, ro := 0, 0
	for i := 0; i < a.World; i++ {
		sd[i], rd[i] = so, ro
		so += a.SendCounts[i]
		ro += a.RecvCounts[i]
	}
	return sd, rd
}

// matrixDisplacements writes the send and receive block offsets of rank me
// under the world*world traffic matrix into sd and rd (by peer): its send
// buffer holds its row in peer order, its receive buffer its column.
func matrixDisplacements(matrix []int, world, me int, sd, rd []int) {
	so, ro := 0, 0
	for j := range world {
		sd[j], rd[j] = so, ro
		so += matrix[me*world+j]
		ro += matrix[j*world+me]
	}
}

// negativeEntry reports the first negative entry of the world*world traffic
// matrix that planner name was given, or nil.
func negativeEntry(name string, matrix []int, world int) error {
	for i, v := range matrix {
		if v < 0 {
			return fmt.Errorf("%s: matrix[%d][%d] = %d is negative", name, i/world, i%world, v)
		}
	}
	return nil
}

// startFlat starts the plan of a flat AllToAllV algorithm (pairwise,
// fullmesh): it validates a, resets s for algo and adds the local copy and
// the LL round, and returns the block displacements. The copy rides with
// the first exchange (the LL round when there is one), so an engine can do
// it while it waits for the network instead of before touching it.
func (s *Schedule) startFlat(algo Algo, a *AllToAllVArgs) (sd, rd []int, err error) {
	if err := a.Validate(); err != nil {
		return nil, nil, err
	}
	s.Reset(algo)
	sd, rd = s.displacements(a)
	s.addSelfCopy(a, sd, rd)
	s.addLLRound(a, sd, rd)
	return sd, rd, nil
}

// addMessage appends the frames of one message (a send of src or a receive
// into dst) following the framing rule every alltoallv algorithm shares, so
// that sender and receiver cut a message identically: frame f covers bytes
// [f*block, (f+1)*block) of the message, travels on stream f % streams, and the
// final frame carries Last.
func (s *Schedule) addMessage(kind StepKind, peer int, span Span, streams, block int) {
	nf := FrameCount(span.Len, block)
	for f := range nf {
		s.addFrame(kind, peer, span, f, nf, streams, block)
	}
}

// addFrame appends frame f of the nf frames of a message cut by
// addMessage's rule.
func (s *Schedule) addFrame(kind StepKind, peer int, span Span, f, nf, streams, block int) {
	off := f * block
	sub := Span{Buf: span.Buf, Off: span.Off + off, Len: min(block, span.Len-off)}
	st := Step{Kind: kind, Peer: peer, Stream: f % streams, Last: f == nf-1}
	if kind == StepSend {
		st.Src = sub
	} else {
		st.Dst = sub
	}
	s.Add(st)
}

// llPeer reports whether this rank exchanges an LL message with peer.
func (a *AllToAllVArgs) llPeer(peer int) bool { return a.LLCutoff != nil && a.LLCutoff[peer] >= 0 }

// llData reports whether an n-byte block to or from peer travels by LL
// instead of by frames.
func (a *AllToAllVArgs) llData(peer, n int) bool { return a.llPeer(peer) && n <= a.LLCutoff[peer] }

// llMessage reports whether the n-byte block to or from peer makes an LL
// message: the block itself, or its length announcement unless peer is
// quiet (LLQuiet).
func (a *AllToAllVArgs) llMessage(peer, n int) bool {
	return a.llData(peer, n) || (a.llPeer(peer) && (a.LLQuiet == nil || !a.LLQuiet[peer]))
}

// AllLL reports whether every block to and from a peer travels by LL.
// Like the planners it expects arguments that pass Validate.
func (a *AllToAllVArgs) AllLL() bool {
	if a.LLCutoff == nil {
		return false
	}
	for j := range a.World {
		if j != a.Rank && !(a.llData(j, a.SendCounts[j]) && a.llData(j, a.RecvCounts[j])) {
			return false
		}
	}
	return true
}

// frames is the number of frames of an n-byte block to or from peer: none
// when it travels by LL.
func (a *AllToAllVArgs) frames(peer, n, block int) int {
	if a.llData(peer, n) {
		return 0
	}
	return FrameCount(n, block)
}

// exchangeFrames is the number of frame sub-rounds of the exchange that
// sends to peer `to` and receives from peer `from`: the larger direction's
// frame count (0 when both blocks travel by LL).
func (a *AllToAllVArgs) exchangeFrames(to, from, block int) int {
	return max(a.frames(to, a.SendCounts[to], block), a.frames(from, a.RecvCounts[from], block))
}

// addExchangeFrame appends frame f of the block for peer `to` and of the
// block from peer `from`, each only if that direction has a frame f: the
// shorter direction (or one that went by LL) sits out the later sub-rounds.
func (s *Schedule) addExchangeFrame(a *AllToAllVArgs, sd, rd []int, to, from, f, block int) {
	if nf := a.frames(to, a.SendCounts[to], block); f < nf {
		s.addFrame(StepSend, to, Span{Buf: BufSend, Off: sd[to], Len: a.SendCounts[to]}, f, nf, a.Streams, block)
	}
	n := a.RecvCounts[from]
	if nf := a.frames(from, n, block); f < nf {
		s.addFrame(StepRecv, from, Span{Buf: BufRecv, Off: rd[from], Len: n}, f, nf, a.Streams, block)
		if f == 0 && a.llPeer(from) && !a.llMessage(from, n) {
			s.Steps[len(s.Steps)-1].WatchLL = true
		}
	}
}

// addLLRound appends this rank's LL stores and loads to the current round:
// one message per LL peer and direction, the block itself or its length.
// They have no order among them and need no handshake, so they all go in
// one round. Where a peer announces a length, the round closes and the
// frames of the larger blocks follow in later rounds: the announcement
// must be loaded before that peer's frames are received. Where every LL
// peer is quiet there is no announcement, and no peer both stores an LL
// message to this rank and sends it frames in one operation, so the round
// stays open and the first frames ride with the LL messages (a round less:
// with a window of every peer, the whole exchange is one round). Without
// LLCutoff it appends nothing and leaves the round open, so that what the
// caller added already rides with the first exchange.
func (s *Schedule) addLLRound(a *AllToAllVArgs, sd, rd []int) {
	if a.LLCutoff == nil {
		return
	}
	r, p := a.Rank, a.World
	for k := 1; k < p; k++ {
		to, from := (r+k)%p, (r-k+p)%p
		if n := a.SendCounts[to]; a.llMessage(to, n) {
			s.Add(Step{Kind: StepStore, Peer: to, Src: Span{Buf: BufSend, Off: sd[to], Len: n}, CountOnly: !a.llData(to, n)})
		}
		if n := a.RecvCounts[from]; a.llMessage(from, n) {
			s.Add(Step{Kind: StepLoad, Peer: from, Dst: Span{Buf: BufRecv, Off: rd[from], Len: n}, CountOnly: !a.llData(from, n)})
		}
	}
	if !a.allQuiet() {
		s.EndRound()
	}
}

// allQuiet reports whether every peer this rank exchanges LL messages with
// is quiet (LLQuiet): no block announces its length.
func (a *AllToAllVArgs) allQuiet() bool {
	if a.LLQuiet == nil {
		return false
	}
	for j := range a.World {
		if j != a.Rank && a.llPeer(j) && !a.LLQuiet[j] {
			return false
		}
	}
	return true
}

// addSelfCopy appends the local block as a copy; an empty one is omitted
// because there is nothing to validate locally.
func (s *Schedule) addSelfCopy(a *AllToAllVArgs, sd, rd []int) {
	r := a.Rank
	if n := a.SendCounts[r]; n > 0 {
		s.Add(Step{Kind: StepCopy, Peer: r,
			Src: Span{Buf: BufSend, Off: sd[r], Len: n},
			Dst: Span{Buf: BufRecv, Off: rd[r], Len: n}})
	}
}
