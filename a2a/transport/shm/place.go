package shm

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/internal/cpus"
)

// Rebalance moves the calling thread to the least crowded CPU this process
// may use when the host's ranks sit unevenly on them: at least two more on
// this rank's CPU than on that one. With more ranks than CPUs, ranks that
// poll and yield keep every CPU busy, and the kernel's balancer, which pulls
// work to idle CPUs and leaves tasks that ran recently in place, can leave
// three ranks on one CPU and one on the other for hundreds of
// milliseconds (4 ranks on 2 cores: 8 B AllToAll 5.4 us against 3.5 us).
// Every rank publishes the CPU it last polled on in its segment; of the
// ranks on a crowded CPU only the highest local index moves, so they do not
// all leave, and only to a CPU its thread may use. The thread's affinity is
// restored at once: the kernel remains free to move it again. A rank that
// may use one CPU only never moves.
func (t *Transport) Rebalance() {
	if len(t.cpus) < 2 || len(t.segs) < 2 || !t.guard.Acquire() {
		return
	}
	defer t.guard.Release()
	cpu := currentCPU()
	if cpu < 0 || cpu >= len(t.perCPU) {
		return
	}
	if t.own.cpu.Load() != uint32(cpu+1) {
		t.own.cpu.Store(uint32(cpu + 1))
	}
	least := t.target(cpu)
	if least < 0 {
		return
	}
	// The thread's affinity as it is now (the application may have changed
	// it since Open): the target must be in it, and it is what is restored.
	runtime.LockOSThread() // every call below must concern this thread
	defer runtime.UnlockOSThread()
	var mask, one unix.CPUSet
	if unix.SchedGetaffinity(0, &mask) != nil || !mask.IsSet(least) {
		return
	}
	one.Set(least)
	if unix.SchedSetaffinity(0, &one) != nil {
		return
	}
	unix.SchedSetaffinity(0, &mask)
	t.own.cpu.Store(uint32(least + 1))
	t.log.Debug("shm: moved to a less crowded CPU", "rank", t.rank, "from", cpu, "to", least, "ranks", t.perCPU[cpu])
}

// target is the CPU a rank on cpu moves to, or -1 to stay: the CPU this
// process may use with the fewest local ranks, if cpu holds at least two
// more and this rank has the highest local index of those on cpu.
func (t *Transport) target(cpu int) int {
	clear(t.perCPU)
	for i, seg := range t.segs {
		c := int(seg.cpu.Load()) - 1
		if c < 0 || c >= len(t.perCPU) {
			continue
		}
		t.perCPU[c]++
		if c == cpu && i > t.me {
			return -1 // a higher local index on this CPU moves instead
		}
	}
	least := -1
	for _, c := range t.cpus {
		if least < 0 || t.perCPU[c] < t.perCPU[least] {
			least = c
		}
	}
	if least < 0 || t.perCPU[cpu] < t.perCPU[least]+2 {
		return -1
	}
	return least
}

// currentCPU is the CPU the calling thread runs on, or -1.
func currentCPU() int {
	var cpu uint32
	if _, _, errno := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), 0, 0); errno != 0 {
		return -1
	}
	return int(cpu)
}

// initPlacement records the CPUs this process may use, for Rebalance.
func (t *Transport) initPlacement() {
	if t.cpus = cpus.Allowed(); len(t.cpus) > 0 {
		t.perCPU = make([]int, t.cpus[len(t.cpus)-1]+1)
	}
}
