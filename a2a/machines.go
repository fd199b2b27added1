package a2a

import (
	"os"
	"strings"

	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/internal/cpus"
)

// MachineIdentity names the kernel this process runs on (its boot id), as
// ranks report it at join to find the ranks that share their cores: two
// network namespaces or containers of one box are two hosts but one
// machine. Empty when the kernel does not say.
func MachineIdentity() string {
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(boot))
}

// machineCores numbers the machines of nodes in order of first appearance
// by rank and gives each the CPUs its ranks may run on together (the union
// of their affinities; 0 when some rank's is unknown). A rank that reports
// no machine is a machine of its own host. Every rank computes the same
// from the group's node list, so the automatic choice, which reads them,
// agrees on every rank.
func machineCores(nodes []control.NodeInfo) (machines, cores []int) {
	ids := map[string]int{}
	machines = make([]int, len(nodes))
	var sets []map[int]bool
	for r, n := range nodes {
		id := "machine:" + n.Machine
		if n.Machine == "" {
			id = "host:" + n.Host
		}
		m, ok := ids[id]
		if !ok {
			m = len(ids)
			ids[id] = m
			sets = append(sets, map[int]bool{})
		}
		machines[r] = m
		if sets[m] != nil && !cpus.Parse(n.CPUs, sets[m]) {
			sets[m] = nil // unknown: no bound for this machine
		}
	}
	cores = make([]int, len(sets))
	for m, set := range sets {
		cores[m] = len(set)
	}
	return machines, cores
}
