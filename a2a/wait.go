package a2a

import (
	"time"

	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/a2a/internal/engine"
)

// waitPolicy resolves Config.Spin and Config.Yield (engine.ResolveWaiting)
// for rank of the group nodes, grouped by machineCores into machines and
// their cores, on a host with hostCPUs CPUs online. A machine is crowded
// when its ranks of the group (of every host on it: network namespaces and
// containers share the kernel's cores) outnumber the CPUs they may run on
// together. The CPUs counted are the union of the machine's ranks'
// affinities (NodeInfo.CPUs), not this rank's own: ranks bound to a core
// each have a core of their own and spin, while ranks a launcher confined
// to fewer cores than there are ranks do not. Ranks of one process (equal
// PIDs: tests, in-process groups) share the process's Ps instead of cores.
func waitPolicy(spin, yield time.Duration, nodes []control.NodeInfo, machines, cores []int, rank, hostCPUs int) engine.Waiting {
	local, shared := 0, false
	for r, m := range machines {
		if m == machines[rank] {
			local++
			shared = shared || (r != rank && nodes[r].PID == nodes[rank].PID)
		}
	}
	jobCPUs := hostCPUs
	if known := cores[machines[rank]]; known > 0 {
		jobCPUs = min(known, hostCPUs)
	}
	return engine.ResolveWaiting(spin, yield, local, jobCPUs, shared)
}
