package a2a

import (
	"a2a/a2a/algo"
	"a2a/a2a/internal/fault"
)

// planCollective plans collective k into c.sched and returns the algorithm.
// Every choice depends only on what all ranks share (world, sizes every rank
// passes identically, hosts, config), so the ranks agree without a round.
func (c *Comm) planCollective(k *coll, a *algo.CollArgs) (algo.Algo, error) {
	s, link := &c.sched, c.links.Flat(c.numHosts)
	switch k.name {
	case "allreduce":
		choice := c.allReduceAlgo
		if choice == algo.AlgoAuto {
			choice = algo.ChooseAllReduce(c.size, a.Bytes, c.hosts, link)
			if k.segmented && choice == algo.AlgoRecursiveDoubling {
				// Segments of a large AllReduce are bandwidth-bound: the
				// ring's smaller messages won in measurement (2 ranks,
				// 2 MiB: ring ~590 us, recursive doubling ~700 us).
				choice = algo.AlgoRing
			}
		}
		return choice, algo.PlanAllReduce(s, choice, *a)
	case "reducescatter":
		return algo.AlgoRing, algo.PlanReduceScatterRing(s, *a)
	case "allgather":
		return algo.AlgoRing, algo.PlanAllGatherRing(s, *a)
	case "allgatherv":
		return algo.AlgoRing, algo.PlanAllGatherVRing(s, *a)
	case "broadcast":
		choice := algo.ChooseBroadcast(c.size, a.Bytes, link)
		return choice, algo.PlanBroadcast(s, choice, *a)
	case "reduce":
		return algo.AlgoTree, algo.PlanReduceTree(s, *a)
	case "gather":
		return algo.AlgoDirect, algo.PlanGatherDirect(s, *a)
	case "gatherv":
		return algo.AlgoDirect, algo.PlanGatherVDirect(s, *a)
	case "scatter":
		return algo.AlgoDirect, algo.PlanScatterDirect(s, *a)
	case "scatterv":
		return algo.AlgoDirect, algo.PlanScatterVDirect(s, *a)
	case "barrier":
		if c.llBarrier {
			return algo.AlgoLL, algo.PlanBarrierLL(s, *a)
		}
		return algo.AlgoDissemination, algo.PlanBarrierDissemination(s, *a)
	}
	return algo.AlgoAuto, fault.New(fault.ErrInvalidArgument, c.rank, "no planner for %s", k.name)
}

// parseAllReduceAlgo validates A2A_ALGO_ALLREDUCE.
func parseAllReduceAlgo(name string) (algo.Algo, error) {
	a, err := algo.ParseAlgo(name)
	if err != nil {
		return a, fault.Wrap(fault.ErrInvalidArgument, -1, err, "A2A_ALGO_ALLREDUCE")
	}
	switch a {
	case algo.AlgoAuto, algo.AlgoRing, algo.AlgoRecursiveDoubling, algo.AlgoHierarchical:
		return a, nil
	}
	return a, fault.New(fault.ErrInvalidArgument, -1, "algorithm %q is not available for AllReduce (ring, recdoubling, hierarchical)", name)
}
