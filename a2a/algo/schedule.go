// Package algo expresses collective algorithms as schedules: pure data saying,
// for one rank, which bytes to send to and receive from which peer, on which
// stream, in which round. One engine (package a2a) executes any schedule on any
// transport; a simulator here executes all ranks' schedules in memory to prove
// algorithms correct without a network; the cost model prices the same schedules.
//
// Planners write into a caller-owned *Schedule and reuse its slices, so planning
// an operation in steady state allocates nothing.
package algo

import "fmt"

// Buf names one of the buffers a schedule addresses.
type Buf uint8

// Buffers a step can address.
const (
	BufSend    Buf = iota // the caller's send buffer
	BufRecv               // the caller's receive buffer
	BufScratch            // engine-owned scratch of Schedule.ScratchBytes
)

func (b Buf) String() string {
	switch b {
	case BufSend:
		return "send"
	case BufRecv:
		return "recv"
	case BufScratch:
		return "scratch"
	}
	return fmt.Sprintf("buf(%d)", uint8(b))
}

// StepKind is what a step does.
type StepKind uint8

// Step kinds.
const (
	StepSend   StepKind = iota // send Src to Peer on Stream
	StepRecv                   // receive from Peer on Stream into Dst
	StepCopy                   // copy Src to Dst locally
	StepReduce                 // Dst = Dst (op) Src (With (op) Src with With), elementwise, locally
	// StepRecvReduce receives a frame from Peer on Stream into the landing
	// span Src (normally scratch) and, once it has arrived, computes
	// Dst = Dst (op) Src. The reduction runs as soon as that frame is in,
	// overlapping the other transfers of the round; the round ends when it
	// is done. Src and Dst have equal lengths, a multiple of ElemSize.
	StepRecvReduce
	// StepStore stores Src one-sided into this rank's LL slot at Peer (the
	// epoch/slot protocol: no handshake, the receiver polls for words of the
	// current epoch). With CountOnly it stores only Src.Len, an 8-byte
	// message announcing that the block travels by frames instead. Peers
	// without a slot (other hosts) get the same message as one frame.
	StepStore
	// StepLoad takes Peer's LL message into Dst (its exact length). With
	// CountOnly it expects the 8-byte announcement of a Dst.Len-byte block
	// and writes nothing. With a third operand (With) it reduces on
	// arrival, as a RecvReduce: the message lands in Src and Dst = With op
	// Src (Src op With when LandedFirst), so a 2-rank AllReduce is one
	// round.
	StepLoad
)

func (k StepKind) String() string {
	switch k {
	case StepSend:
		return "send"
	case StepRecv:
		return "recv"
	case StepCopy:
		return "copy"
	case StepReduce:
		return "reduce"
	case StepRecvReduce:
		return "recvreduce"
	case StepStore:
		return "store"
	case StepLoad:
		return "load"
	}
	return fmt.Sprintf("step(%d)", uint8(k))
}

// Span is a byte range of one buffer.
type Span struct {
	Buf Buf
	Off int
	Len int
}

// End is Off+Len.
func (s Span) End() int { return s.Off + s.Len }

// Step is one action of a round. Send uses Src; Recv uses Dst (Dst.Len is the
// exact length expected); Copy and Reduce use both; RecvReduce receives into
// Src (its exact length) and reduces it into Dst. A message larger than a
// block travels as several frames (one Send, Recv or RecvReduce step each); Last marks the
// final frame of each message, and every message has at least one frame, even
// an empty one, so that the receiver validates every pair's length.
type Step struct {
	Kind   StepKind
	Peer   int
	Stream int
	Src    Span
	Dst    Span
	Last   bool
	// With, when not empty, makes a RecvReduce three-operand: Dst = With op
	// Src (or Src op With when LandedFirst), so a rank can combine its value
	// with a partner's frame into a third buffer (or into the landing span
	// itself) while its own value is still being sent. On a Reduce it is
	// Dst = With op Src, so a result lands where it is wanted without a
	// copy after it (LandedFirst unused); Src or With may then be Dst
	// itself, exactly, as in place.
	With        Span
	LandedFirst bool
	// CountOnly makes a Store or Load carry the block's length instead of
	// its bytes (see StepStore).
	CountOnly bool
	// WatchLL marks the first frame Recv of a block above the LL cutoff
	// from a quiet peer (AllToAllVArgs.LLQuiet): the peer stores no LL
	// message to this rank in this operation, so one in its slot while the
	// frame is awaited means the peer took the block for one within the
	// cutoff, a mismatch (transport.SlotWatcher).
	WatchLL bool
}

// Schedule is one rank's plan for one operation. Steps of one round are
// independent and may all be in flight at once; a round ends when all its steps
// are done, and the next round starts after that. Messages between a pair of
// ranks on one stream are matched in order (first send to first receive).
type Schedule struct {
	Algo         Algo
	Steps        []Step
	RoundEnds    []int // round i is Steps[RoundEnds[i-1]:RoundEnds[i]] (RoundEnds[-1] = 0)
	ScratchBytes int

	// DType and Op are the element type and operator of the schedule's
	// reduce steps. They are opaque here: the values of package reduce's
	// DType and Op, copied from the planner's arguments (0 when the
	// operation reduces nothing).
	DType, Op uint8
	// ElemSize is the size of one element in bytes. Every reduce step's
	// length and every chunk boundary of a reducing operation is a multiple
	// of it; 0 for operations that only move bytes (AllToAllV).
	ElemSize int

	// work is planner scratch (displacements) kept with the schedule so that
	// re-planning into the same Schedule allocates nothing.
	work []int
}

// Reset empties s for a new plan, keeping its storage.
func (s *Schedule) Reset(a Algo) {
	s.Algo = a
	s.Steps = s.Steps[:0]
	s.RoundEnds = s.RoundEnds[:0]
	s.ScratchBytes = 0
	s.DType, s.Op, s.ElemSize = 0, 0, 0
}

// Add appends a step to the current round.
func (s *Schedule) Add(st Step) { s.Steps = append(s.Steps, st) }

// EndRound closes the current round. An empty round is dropped.
func (s *Schedule) EndRound() {
	start := 0
	if n := len(s.RoundEnds); n > 0 {
		start = s.RoundEnds[n-1]
	}
	if len(s.Steps) > start {
		s.RoundEnds = append(s.RoundEnds, len(s.Steps))
	}
}

// NumRounds is the number of rounds.
func (s *Schedule) NumRounds() int { return len(s.RoundEnds) }

// Round returns the steps of round i.
func (s *Schedule) Round(i int) []Step {
	start := 0
	if i > 0 {
		start = s.RoundEnds[i-1]
	}
	return s.Steps[start:s.RoundEnds[i]]
}

// Algo identifies an algorithm; it travels in frame headers so that ranks
// running different algorithms detect it.
type Algo uint8

// Algorithms. The ids are part of the wire format: new ones go at the end.
// Staged and LL are reserved for later AllToAllV algorithms.
const (
	AlgoAuto Algo = iota
	AlgoPairwise
	AlgoFullmesh
	AlgoStaged
	AlgoLL
	AlgoRing
	AlgoRecursiveDoubling
	AlgoTree
	AlgoDissemination
	AlgoDirect
	AlgoHierarchical     // two-level: intra-host ring, inter-host ring, intra-host ring
	AlgoScatterAllGather // broadcast as a scatter from the root and a ring allgather
	AlgoSkew             // alltoallv in load-ordered matchings from the global matrix
)

var algoNames = [...]string{"auto", "pairwise", "fullmesh", "staged", "ll", "ring", "recdoubling", "tree", "dissemination", "direct", "hierarchical", "scatterallgather", "skew"}

func (a Algo) String() string {
	if int(a) < len(algoNames) {
		return algoNames[a]
	}
	return fmt.Sprintf("algo(%d)", uint8(a))
}

// ParseAlgo maps a name ("" means auto) to an Algo.
func ParseAlgo(name string) (Algo, error) {
	if name == "" {
		return AlgoAuto, nil
	}
	for i, n := range algoNames {
		if n == name {
			return Algo(i), nil
		}
	}
	return AlgoAuto, fmt.Errorf("unknown algorithm %q", name)
}
