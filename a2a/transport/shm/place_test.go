package shm

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// claim publishes cpu as the CPU of tr's rank (-1: unknown).
func claim(tr *Transport, cpu int) { tr.own.cpu.Store(uint32(cpu + 1)) }

// TestRebalanceTarget: a rank leaves a CPU only for one holding at least two
// fewer ranks, and of the ranks on its CPU only the highest local index
// leaves.
func TestRebalanceTarget(t *testing.T) {
	ts := newCluster(t, 4, 1, ringOnly)
	for _, tr := range ts {
		tr.cpus, tr.perCPU = []int{0, 1}, make([]int, 2)
	}
	for _, c := range []struct {
		name   string
		cpus   [4]int // published CPU by rank, -1 unknown
		rank   int    // the rank that looks
		target int
	}{
		{"three on CPU 0, the highest moves", [4]int{0, 0, 0, 1}, 2, 1},
		{"three on CPU 0, a lower one stays", [4]int{0, 0, 0, 1}, 1, -1},
		{"balanced", [4]int{0, 0, 1, 1}, 3, -1},
		{"one more than elsewhere is not enough", [4]int{0, 0, 1, -1}, 1, -1},
		{"all on one CPU", [4]int{1, 1, 1, 1}, 3, 0},
		{"unknown CPUs do not count", [4]int{-1, -1, 1, 1}, 3, 0},
	} {
		for r, cpu := range c.cpus {
			claim(ts[r], cpu)
		}
		if got := ts[c.rank].target(c.cpus[c.rank]); got != c.target {
			t.Errorf("%s: rank %d's target %d, want %d", c.name, c.rank, got, c.target)
		}
	}
}

// TestRebalance moves the calling thread: to the idle CPU, with its affinity
// restored afterwards; a thread pinned to its CPU stays.
func TestRebalance(t *testing.T) {
	ts := newCluster(t, 3, 1, ringOnly)
	if len(ts[2].cpus) < 2 {
		t.Skipf("this process may use %d CPU; moving needs two", len(ts[2].cpus))
	}
	from, to := ts[2].cpus[0], ts[2].cpus[1]
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var all, pinned unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}
	defer unix.SchedSetaffinity(0, &all)
	pinned.Set(from)
	setAffinity := func(set *unix.CPUSet) {
		if err := unix.SchedSetaffinity(0, set); err != nil {
			t.Fatal(err)
		}
	}
	claim(ts[0], from)
	claim(ts[1], from)

	// Pinned to the crowded CPU: rank 2 would move, but may not.
	setAffinity(&pinned)
	ts[2].Rebalance()
	var now unix.CPUSet
	if got := currentCPU(); got != from {
		t.Errorf("pinned to CPU %d, the thread runs on %d", from, got)
	}
	if err := unix.SchedGetaffinity(0, &now); err != nil || now != pinned {
		t.Errorf("affinity of a pinned thread became %v (err %v)", now, err)
	}

	// On the crowded CPU and free to go: it moves to the idle one.
	setAffinity(&pinned) // get there
	setAffinity(&all)
	ts[2].Rebalance()
	if got := currentCPU(); got != to {
		t.Errorf("rank 2 runs on CPU %d after rebalancing, want %d", got, to)
	}
	if got := ts[2].own.cpu.Load(); got != uint32(to+1) {
		t.Errorf("rank 2 published %d, want %d", got, to+1)
	}
	if err := unix.SchedGetaffinity(0, &now); err != nil || now != all {
		t.Errorf("affinity after the move: %v (err %v), want it restored to %v", now, err, all)
	}
}
