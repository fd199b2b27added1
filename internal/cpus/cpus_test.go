package cpus

import (
	"runtime"
	"testing"
)

func TestListLen(t *testing.T) {
	for list, want := range map[string]int{"0": 1, "0-1": 2, "0-3,8,10-11": 7, "": 0, "1-0": 0, "x": 0, "0-": 0, "-1": 0} {
		if got := listLen(list); got != want {
			t.Errorf("listLen(%q) = %d, want %d", list, got, want)
		}
	}
	if n := Online(); n < runtime.NumCPU() {
		t.Errorf("Online() = %d, below the %d this process may use", n, runtime.NumCPU())
	}
	if got := Allowed(); len(got) != runtime.NumCPU() {
		t.Errorf("Allowed() = %v, want %d CPUs (runtime.NumCPU)", got, runtime.NumCPU())
	}
}
