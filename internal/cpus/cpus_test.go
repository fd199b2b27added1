package cpus

import (
	"runtime"
	"testing"
)

func TestOnlineAllowed(t *testing.T) {
	if n := Online(); n < runtime.NumCPU() {
		t.Errorf("Online() = %d, below the %d this process may use", n, runtime.NumCPU())
	}
	if got := Allowed(); len(got) != runtime.NumCPU() {
		t.Errorf("Allowed() = %v, want %d CPUs (runtime.NumCPU)", got, runtime.NumCPU())
	}
}

func TestFormatParse(t *testing.T) {
	for _, c := range []struct {
		cpus []int
		list string
	}{{nil, ""}, {[]int{0}, "0"}, {[]int{0, 1}, "0-1"}, {[]int{0, 1, 2, 3, 8, 10, 11}, "0-3,8,10-11"}, {[]int{1, 3, 5}, "1,3,5"}} {
		if got := Format(c.cpus); got != c.list {
			t.Errorf("Format(%v) = %q, want %q", c.cpus, got, c.list)
		}
		set := map[int]bool{}
		if ok := Parse(c.list, set); ok != (len(c.cpus) > 0) || len(set) != len(c.cpus) {
			t.Errorf("Parse(%q) = %v, %v", c.list, ok, set)
		}
		for _, cpu := range c.cpus {
			if !set[cpu] {
				t.Errorf("Parse(%q) lacks %d", c.list, cpu)
			}
		}
	}
	for _, bad := range []string{"x", "1-0", "0-", "-1", "0,,1", "0-99999999"} {
		if Parse(bad, map[int]bool{}) {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}
