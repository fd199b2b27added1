package a2a

import (
	"fmt"
	"os"
	"strings"

	"github.com/a2a-moe/a2a/a2a/control"
)

// topology is where the group's ranks run, the same on every rank: hosts
// (ranks that may share memory) and machines (hosts that share a kernel's
// cores).
type topology struct {
	hosts    []int // host ordinal of every rank
	numHosts int
	// evenHosts: every host runs as many ranks as the others, which staged
	// needs.
	evenHosts bool
	// machine ordinal of every rank and the CPUs of each machine (see
	// machineCores): where ranks outnumber cores the cost model bounds
	// every algorithm by the machine's total work.
	machines, machineCores []int
}

// newTopology reads the topology of the group nodes.
func newTopology(nodes []control.NodeInfo) topology {
	var t topology
	t.hosts, t.numHosts = hostOrdinals(nodes)
	t.evenHosts = evenHosts(t.hosts, t.numHosts)
	t.machines, t.machineCores = machineCores(nodes)
	return t
}

// evenHosts reports whether every host runs the same number of ranks.
func evenHosts(hosts []int, numHosts int) bool {
	per := make([]int, numHosts)
	for _, h := range hosts {
		per[h]++
	}
	for _, n := range per {
		if n != per[0] {
			return false
		}
	}
	return true
}

// hostOrdinals numbers the hosts in order of first appearance by rank.
func hostOrdinals(nodes []control.NodeInfo) ([]int, int) {
	ids := map[string]int{}
	out := make([]int, len(nodes))
	for r, n := range nodes {
		ord, ok := ids[n.Host]
		if !ok {
			ord = len(ids)
			ids[n.Host] = ord
		}
		out[r] = ord
	}
	return out, len(ids)
}

// HostIdentity names the machine this process runs on, as ranks report it at
// join to find their same-host peers: hostname, kernel boot id and network
// namespace, so two containers or namespaces on one box are two hosts (they
// cannot share loopback addresses) while ranks of one host agree.
// Config.Host (A2A_HOST) overrides it, e.g. to fake several hosts in tests.
func HostIdentity() string {
	name, _ := os.Hostname()
	netns, _ := os.Readlink("/proc/self/ns/net")
	return fmt.Sprintf("%s/%.8s/%s", name, MachineIdentity(), strings.TrimSuffix(strings.TrimPrefix(netns, "net:["), "]"))
}
