package algo

import (
	"fmt"
	"math"
)

// PlanLL plans an AllToAllV on the LL epoch/slot protocol (after NCCL's LL and
// DeepEP's low-latency kernels): every block of at most
// a.LLCutoff[peer] bytes is stored one-sided into the peer's slot for the
// current epoch, all peers at once, with no handshake and no round; the
// receiver polls until every word of the block carries the epoch. A larger
// block announces its length the same way and follows as fullmesh frames, so
// a disagreement about any pair's length shows in the first round.
//
// Where the peer has no slot (another host) the same message travels as one
// frame, so the pair still makes a single shot with no per-round handshake.
func PlanLL(s *Schedule, a AllToAllVArgs) error {
	if a.LLCutoff == nil {
		return fmt.Errorf("ll: no LLCutoff")
	}
	if err := PlanFullmesh(s, a); err != nil {
		return err
	}
	s.Algo = AlgoLL
	return nil
}

// EstimateLL prices PlanLL when every pair has the same cutoff, in seconds:
// one round for the LL messages (Alpha plus the busiest rank's LL bytes,
// doubled because every 4 payload bytes travel in an 8-byte word), then, if
// any block is larger than cutoff, the fullmesh estimate of those blocks.
// It allocates (a matrix of the larger blocks); the plan tool uses it.
func EstimateLL(matrix []int, world, streams, window, cutoff int, link Link) float64 {
	m, ok := newCounts(matrix, world)
	if !ok {
		return math.Inf(1)
	}
	busiest := m.busiest(func(_, _, n int) bool { return n <= cutoff })
	// The blocks above cutoff only announce their length by LL; their bytes
	// follow as fullmesh frames, priced on a matrix of them alone.
	rest := make([]int, world*world)
	large := false
	for i := range world {
		for j := range world {
			if n := m.at(i, j); i != j && n > cutoff {
				rest[i*world+j], large = n, true
			}
		}
	}
	t := linkTime(2*busiest, link)
	if large {
		t += EstimateAllToAllV(AlgoFullmesh, rest, world, streams, window, link)
	}
	return t
}
