// Package cpus answers which CPUs a process may use and how many a host has,
// for the launcher's binding and the ranks' waiting and placement.
package cpus

import (
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Allowed lists the CPUs the calling thread may run on (its affinity), in
// increasing order, or nil if the kernel does not say.
func Allowed() []int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil
	}
	var out []int
	for c := 0; c < len(set)*64 && len(out) < set.Count(); c++ {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out
}

// Online is the number of CPUs online on this host (not only those this
// process may use), or runtime.NumCPU if the kernel does not say.
func Online() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if n := listLen(strings.TrimSpace(string(b))); err == nil && n > 0 {
		return n
	}
	return runtime.NumCPU()
}

// listLen counts the CPUs of a kernel CPU list ("0-3,8,10-11"), or returns
// 0 for a malformed one.
func listLen(list string) int {
	n := 0
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := strconv.Atoi(lo)
		last := first
		if err == nil && isRange {
			last, err = strconv.Atoi(hi)
		}
		if err != nil || first < 0 || last < first {
			return 0
		}
		n += last - first + 1
	}
	return n
}
