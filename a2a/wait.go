package a2a

import (
	"time"

	"github.com/a2a-moe/a2a/a2a/control"
)

// Waiting defaults (Config.Spin, Config.Yield).
const (
	defaultSpin = 50 * time.Microsecond // busy-poll before yielding the core
	// defaultYield is how long a rank gives its core away with sched_yield
	// before parking; parking costs a 30-70 us wake-up on these VMs (2
	// ranks, 8 B AllToAll: 52-62 us parking at once against 0.55 us). A
	// longer yield when ranks outnumber cores was tried: 4 ranks on 2
	// cores ran 4.9-6.9 us with 50 ms against 4.9-8.4 us with 1 ms, within
	// the noise, while a yielding goroutine keeps its P from the
	// application's goroutines (GOMAXPROCS is 1 for a rank bound to a
	// core), so the yield stays short.
	defaultYield = time.Millisecond
)

// waiting is how a rank waits (see waitPolicy).
type waiting struct {
	spin, yield time.Duration
	// sharedProcess: other ranks are goroutines of this process.
	sharedProcess bool
	// crowded: the group's ranks on this host outnumber the CPUs they may
	// run on, so ranks share cores.
	crowded bool
}

// waitPolicy resolves Config.Spin and Config.Yield for rank of the group
// nodes, grouped by machineCores into machines and their cores, on a host
// with hostCPUs CPUs online. By default a rank busy-polls,
// then yields, then parks. When the machine is crowded, its ranks of the
// group (of every host on it: network namespaces and containers share the
// kernel's cores) outnumbering the CPUs they may run on together, a
// spinning rank would hold the core the rank it waits for needs, so it
// does not spin (Open MPI's yield_when_idle makes the same call). The CPUs
// counted are the union of the machine's ranks' affinities (NodeInfo.CPUs),
// not this rank's own: ranks bound to a core each have a core of their own
// and spin, while ranks a launcher confined to fewer cores than there are
// ranks do not. Ranks that
// are goroutines of one process (tests, in-process groups) share the
// process's Ps instead of cores: sharedProcess reports them, so the engine
// also yields to goroutines.
func waitPolicy(spin, yield time.Duration, nodes []control.NodeInfo, machines, cores []int, rank, hostCPUs int) waiting {
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
	crowded := local > jobCPUs
	switch {
	case spin < 0:
		spin = 0
	case spin == 0 && crowded:
	case spin == 0:
		spin = defaultSpin
	}
	if yield == 0 {
		yield = defaultYield
	}
	return waiting{spin: spin, yield: yield, sharedProcess: shared, crowded: crowded}
}
