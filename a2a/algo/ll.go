package algo

import "fmt"

// PlanLL plans an AllToAllV on the LL epoch/slot protocol (seeds 001 §4.2 and
// 003, NCCL's LL and DeepEP's low-latency kernels): every block of at most
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
