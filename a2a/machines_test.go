package a2a

import (
	"slices"
	"testing"

	"github.com/a2a-moe/a2a/a2a/control"
)

// TestMachineCores checks how ranks are grouped into machines and what
// cores each machine gives them: network namespaces of one kernel are one
// machine, a rank without a machine id is its own host's, and a machine
// with a rank of unknown affinity has unknown cores.
func TestMachineCores(t *testing.T) {
	node := func(host, machine, cpus string) control.NodeInfo {
		return control.NodeInfo{Host: host, Machine: machine, CPUs: cpus}
	}
	for _, c := range []struct {
		name     string
		nodes    []control.NodeInfo
		machines []int
		cores    []int
	}{
		{"test bed: 4 namespaces, one kernel, 2 cores",
			[]control.NodeInfo{node("h0", "k", "0"), node("h0", "k", "1"), node("h1", "k", "0"), node("h1", "k", "1"),
				node("h2", "k", "0-1"), node("h2", "k", "0-1"), node("h3", "k", "0"), node("h3", "k", "1")},
			[]int{0, 0, 0, 0, 0, 0, 0, 0}, []int{2}},
		{"two machines",
			[]control.NodeInfo{node("a", "ka", "0-3"), node("b", "kb", "0-7"), node("a", "ka", "4-5")},
			[]int{0, 1, 0}, []int{6, 8}},
		{"no machine id: grouped by host",
			[]control.NodeInfo{node("a", "", "0"), node("b", "", "0"), node("a", "", "1")},
			[]int{0, 1, 0}, []int{2, 1}},
		{"unknown affinity",
			[]control.NodeInfo{node("a", "k", "0-1"), node("a", "k", ""), node("b", "k2", "0")},
			[]int{0, 0, 1}, []int{0, 1}},
	} {
		machines, cores := machineCores(c.nodes)
		if !slices.Equal(machines, c.machines) || !slices.Equal(cores, c.cores) {
			t.Errorf("%s: machines %v cores %v, want %v %v", c.name, machines, cores, c.machines, c.cores)
		}
	}
	if id := MachineIdentity(); id == "" {
		t.Error("MachineIdentity is empty on Linux")
	}
}
