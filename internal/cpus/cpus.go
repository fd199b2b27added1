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
	if set := map[int]bool{}; err == nil && Parse(strings.TrimSpace(string(b)), set) {
		return len(set)
	}
	return runtime.NumCPU()
}

// Format writes a CPU list in the kernel's form ("0-3,8,10-11"); cpus must
// be increasing.
func Format(cpus []int) string {
	var b strings.Builder
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(cpus[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return b.String()
}

// Parse reads a kernel CPU list into set (CPU numbers as keys) and reports
// whether it was well formed and not empty.
func Parse(list string, set map[int]bool) bool {
	if list == "" {
		return false
	}
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := strconv.Atoi(lo)
		last := first
		if err == nil && isRange {
			last, err = strconv.Atoi(hi)
		}
		if err != nil || first < 0 || last < first || last-first > 1<<16 {
			return false
		}
		for c := first; c <= last; c++ {
			set[c] = true
		}
	}
	return true
}
