package main

import (
	"os/exec"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	for _, tc := range []struct {
		name string
		data string
		busy time.Duration
		cpus int
		ok   bool
	}{
		{"two cpus", "cpu  100 20 30 5000 7 1 2 9 0 0\ncpu0 50 10 15 2500 3 1 1 4 0 0\ncpu1 50 10 15 2500 4 0 1 5 0 0\nintr 1\n",
			1530 * time.Millisecond, 2, true}, // user+nice+system+irq+softirq: idle, iowait and steal left out
		{"no per-cpu lines", "cpu  100 20 30 5000 7 1 2 9 0 0\n", 0, 0, false},
		{"no aggregate", "cpu0 50 10 15 2500 3 1 1 4 0 0\n", 0, 0, false},
		{"short line", "cpu  100 20 30\ncpu0 100 20 30\n", 0, 0, false},
		{"not a number", "cpu  x 20 30 5000 7 1 2 9 0 0\ncpu0 1 1 1 1 1 1 1 1 0 0\n", 0, 0, false},
	} {
		busy, cpus, err := parseProcStat(tc.data)
		if (err == nil) != tc.ok || busy != tc.busy || cpus != tc.cpus {
			t.Errorf("%s: got %v, %d CPUs, %v; want %v, %d, ok %v", tc.name, busy, cpus, err, tc.busy, tc.cpus, tc.ok)
		}
	}
}

func TestOutsideShare(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := loadMark{at: t0, busy: 10 * time.Second, cpus: 2, job: time.Second}
	for _, tc := range []struct {
		name string
		b    loadMark
		want float64
	}{
		{"half of two CPUs outside", loadMark{at: t0.Add(time.Second), busy: 11500 * time.Millisecond, cpus: 2, job: 1500 * time.Millisecond}, 0.5},
		{"only the job", loadMark{at: t0.Add(time.Second), busy: 12 * time.Second, cpus: 2, job: 3 * time.Second}, 0},
		{"job counted above the ticks", loadMark{at: t0.Add(time.Second), busy: 10 * time.Second, cpus: 2, job: 2 * time.Second}, 0},
		{"no time passed", loadMark{at: t0, busy: 12 * time.Second, cpus: 2, job: time.Second}, 0},
	} {
		if got := outsideShare(a, tc.b); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestMarkLoadSeesAnotherProcess: a busy process outside the job, still
// running at the second mark, shows as outside load; once reaped, it is a
// child of the launcher, as the ranks are, and counts as the job.
func TestMarkLoadSeesAnotherProcess(t *testing.T) {
	burn := exec.Command("sh", "-c", "while :; do :; done")
	if err := burn.Start(); err != nil {
		t.Fatal(err)
	}
	defer burn.Process.Kill()
	a, err := markLoad()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	b, err := markLoad()
	if err != nil {
		t.Fatal(err)
	}
	burn.Process.Kill()
	burn.Wait()
	c, err := markLoad()
	if err != nil {
		t.Fatal(err)
	}
	ps := burn.ProcessState
	burnShare := float64(ps.UserTime()+ps.SystemTime()) / float64(b.at.Sub(a.at)*time.Duration(b.cpus))
	// The burner gets at least a third of one CPU even on a busy 2-CPU
	// machine: over 2 CPUs, well above 5%.
	if got := outsideShare(a, b); got < 0.05 || burnShare < 0.05 {
		t.Errorf("a busy process outside the job: outside share %.2f (the burner's own %.2f), want both >= 0.05", got, burnShare)
	}
	if before, after := outsideShare(a, b), outsideShare(a, c); before-after < burnShare/2 {
		t.Errorf("reaped, the burner still counts as outside: share %.2f before, %.2f after (its own %.2f)", before, after, burnShare)
	}
}
