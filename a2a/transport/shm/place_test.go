package shm

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRebalance: of three ranks on one CPU, the highest local index moves its
// thread to the idle CPU and says so in its segment; the others stay, and
// the thread may run anywhere again afterwards.
func TestRebalance(t *testing.T) {
	ts := newCluster(t, 3, 1, ringOnly)
	if len(ts[2].cpus) < 2 {
		t.Skipf("this process may use %d CPU; moving needs two", len(ts[2].cpus))
	}
	from, to := ts[2].cpus[0], ts[2].cpus[1]
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}
	defer unix.SchedSetaffinity(0, &all)
	pin := func(cpu int) {
		var one unix.CPUSet
		one.Set(cpu)
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			t.Fatal(err)
		}
		if got := currentCPU(); got != cpu {
			t.Fatalf("pinned to CPU %d, running on %d", cpu, got)
		}
	}
	claim := func(tr *Transport, cpu int) { tr.own.cpu.Store(uint32(cpu + 1)) }

	// Ranks 1 and 2 claim the first CPU; rank 0, on it too, defers to them.
	claim(ts[1], from)
	claim(ts[2], from)
	pin(from) // pinned, the kernel cannot move the thread behind the test's back
	ts[0].Rebalance()
	if got := currentCPU(); got != from {
		t.Errorf("rank 0 moved to CPU %d although rank 2 shares its CPU", got)
	}
	if got := ts[0].own.cpu.Load(); got != uint32(from+1) {
		t.Errorf("rank 0 published %d, want %d", got, from+1)
	}

	pin(from) // pinned, the kernel cannot move the thread behind the test's back
	ts[2].Rebalance()
	if got := currentCPU(); got != to {
		t.Errorf("rank 2 runs on CPU %d after rebalancing, want %d", got, to)
	}
	if got := ts[2].own.cpu.Load(); got != uint32(to+1) {
		t.Errorf("rank 2 published %d, want %d", got, to+1)
	}
	var now unix.CPUSet
	if err := unix.SchedGetaffinity(0, &now); err != nil || now != ts[2].mask {
		t.Errorf("affinity after the move: %v (err %v), want the process's %v", now, err, ts[2].mask)
	}

	// Balanced now (two on one CPU, one on the other): nobody moves.
	pin(from) // pinned, the kernel cannot move the thread behind the test's back
	ts[1].Rebalance()
	if got := currentCPU(); got != from {
		t.Errorf("rank 1 moved to CPU %d with the CPUs balanced", got)
	}
}
