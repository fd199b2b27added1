package main

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCrossCPURoundTrip: the floor between two CPUs is a plausible cache
// line round trip, and the calling thread gets its affinity back.
func TestCrossCPURoundTrip(t *testing.T) {
	a, b, ok := floorCPUs()
	if !ok {
		t.Fatal("the floor needs two CPUs this process may use; the test machines have them")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before, after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		t.Fatal(err)
	}
	d, err := crossCPURoundTrip(a, b)
	if err != nil {
		t.Fatal(err)
	}
	// A cache line's round trip between two CPUs of one machine: tens of
	// nanoseconds at least, a few microseconds at the very most.
	if d < 10*time.Nanosecond || d > 20*time.Microsecond {
		t.Errorf("round trip between CPUs %d and %d: %v, want 10 ns-20 us", a, b, d)
	}
	if err := unix.SchedGetaffinity(0, &after); err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Errorf("affinity not restored: %v before, %v after", before, after)
	}
}

// TestCrossCPURoundTripOneCPU: a peer CPU this process may not use is an
// error, not a hang.
func TestCrossCPURoundTripOneCPU(t *testing.T) {
	a, _, ok := floorCPUs()
	if !ok {
		t.Fatal("the floor needs two CPUs this process may use; the test machines have them")
	}
	start := time.Now()
	if _, err := crossCPURoundTrip(a, 1<<20); err == nil {
		t.Error("CPU 1<<20: want an error")
	}
	if time.Since(start) > time.Second {
		t.Errorf("the error took %v", time.Since(start))
	}
}

// TestReportFloor: the line names the CPUs and both figures; without a
// figure from before the run there is no line.
func TestReportFloor(t *testing.T) {
	var b strings.Builder
	reportFloor(&b, 123*time.Nanosecond)
	if got := b.String(); !strings.HasPrefix(got, "# floor: ") || !strings.Contains(got, "123ns before the run") {
		t.Errorf("got %q", got)
	}
	b.Reset()
	reportFloor(&b, 0)
	if b.Len() != 0 {
		t.Errorf("no figure before: got %q, want nothing", b.String())
	}
}
