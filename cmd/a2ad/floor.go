package main

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/internal/cpus"
)

// The cross-CPU floor: how long one cache line takes to go from one CPU to
// another and back. On the 2-vCPU VMs this project is measured on, the
// hypervisor moves the two vCPUs every few seconds to minutes, whatever the
// guest runs, between three placements: ~40-55 ns (by the figures, two
// threads of one core), ~90-110 ns (two cores sharing a cache) and
// ~400-500 ns (cores on separate dies). In the last, every copy between
// ranks crosses the chip and the shm cells run up to 6x slower (2 ranks,
// AllReduce 1 MiB: ~240 against ~40 us); the guest cannot tell but by
// timing it (docs/PERFORMANCE.md, "Bimodal runs on the 2-core machine").
const (
	floorRounds = 20000 // round trips timed, in batches
	floorBatch  = 100   // round trips per timed batch: the clock costs ~20 ns
	floorLimit  = time.Second
)

// crossCPURoundTrip times a cache line's round trip between CPUs a and b,
// the median over batches, with one thread pinned to each and spinning. It
// stops at floorLimit (CPUs busy with other work answer late): with ten
// batches timed by then it has a median, otherwise it gives up.
func crossCPURoundTrip(a, b int) (time.Duration, error) {
	if runtime.GOMAXPROCS(0) < 2 {
		return 0, errors.New("two spinning threads need GOMAXPROCS >= 2")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return 0, err
	}
	if err := pinThread(a); err != nil {
		return 0, err
	}
	defer unix.SchedSetaffinity(0, &old)

	// This thread writes ping.v, the peer's echoes it into pong.v: two
	// cache lines, as scripts/peers/shm_pingpong.c, so the figures compare
	// with make compare's floor. stop ends the peer's spin.
	type paddedLine struct {
		v atomic.Uint64
		_ [56]byte
	}
	var ping, pong paddedLine
	var stop atomic.Uint64
	pinned := make(chan error, 1)
	go func() {
		// The goroutine ends locked: its thread, pinned, exits with it.
		runtime.LockOSThread()
		err := pinThread(b)
		pinned <- err
		for want := uint64(1); err == nil && stop.Load() == 0; {
			if ping.v.Load() == want {
				pong.v.Store(want)
				want++
			}
		}
	}()
	if err := <-pinned; err != nil {
		return 0, err
	}
	defer stop.Store(1)
	batches := make([]time.Duration, 0, floorRounds/floorBatch)
	give := time.Now().Add(floorLimit)
	next := uint64(1)
	for range floorRounds / floorBatch {
		t0 := time.Now()
		for range floorBatch {
			ping.v.Store(next)
			for spins := 0; pong.v.Load() != next; spins++ {
				if spins&0xfff == 0xfff && time.Now().After(give) {
					if len(batches) >= 10 {
						return median(batches), nil
					}
					return 0, fmt.Errorf("CPU %d did not answer within %v", b, floorLimit)
				}
			}
			next++
		}
		batches = append(batches, time.Since(t0)/floorBatch)
	}
	return median(batches), nil
}

// median sorts ds and returns its middle element; ds is not empty.
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// pinThread binds the calling thread to cpu.
func pinThread(cpu int) error {
	var one unix.CPUSet
	one.Set(cpu)
	return unix.SchedSetaffinity(0, &one)
}

// floorCPUs are the two CPUs the floor is timed between: the first two this
// process may use, or false with fewer.
func floorCPUs() (a, b int, ok bool) {
	c := cpus.Allowed()
	if len(c) < 2 {
		return 0, 0, false
	}
	return c[0], c[1], true
}

// reportFloor writes the floor timed before a job (before; 0 if it was not)
// and again now, after it, as a comment line.
func reportFloor(w io.Writer, before time.Duration) {
	a, b, ok := floorCPUs()
	if !ok || before == 0 {
		return
	}
	after, err := crossCPURoundTrip(a, b)
	if err != nil {
		return
	}
	fmt.Fprintf(w, "# floor: one cache line's round trip between CPUs %d and %d: %v before the run, %v after (on the 2-vCPU VMs: ~40-110 ns, the vCPUs share a cache; ~400-500 ns, they sit on separate dies and the shm cells run up to 6x slower)\n",
		a, b, before.Round(time.Nanosecond), after.Round(time.Nanosecond))
}

// timeFloor times the floor before a job, or 0 if it cannot.
func timeFloor() time.Duration {
	a, b, ok := floorCPUs()
	if !ok {
		return 0
	}
	d, err := crossCPURoundTrip(a, b)
	if err != nil {
		return 0
	}
	return d
}
