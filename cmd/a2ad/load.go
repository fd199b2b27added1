package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// loadMark is how busy the host's CPUs have been since boot and how much
// CPU time the launcher and its reaped ranks used, at one moment. Two marks
// around a job tell how much of the machine processes outside the job took
// while it ran: on a shared machine that, not the launch, is what decides
// whether a run's figures are the quiet machine's (docs/PERFORMANCE.md,
// "Bimodal runs on the 2-core machine").
type loadMark struct {
	at   time.Time
	busy time.Duration // non-idle time of every CPU together
	cpus int
	job  time.Duration // this process's and its reaped children's CPU time
}

// userHZ is the unit of /proc/stat's times: USER_HZ, 100 on every Linux
// architecture whatever the kernel's tick.
const userHZ = 100

// markLoad reads the CPUs' busy time (/proc/stat) and the job's CPU time
// (getrusage of this process and of its reaped children).
func markLoad() (loadMark, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return loadMark{}, err
	}
	m := loadMark{at: time.Now()}
	if m.busy, m.cpus, err = parseProcStat(string(data)); err != nil {
		return loadMark{}, err
	}
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err != nil {
			return loadMark{}, err
		}
		m.job += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return m, nil
}

// parseProcStat reads /proc/stat's aggregate "cpu" line: the busy time of
// all CPUs together (user, nice, system, irq, softirq; not idle, iowait or
// steal, which no process of this machine used), and counts the per-CPU
// lines.
func parseProcStat(data string) (busy time.Duration, cpus int, err error) {
	var total []string
	for line := range strings.SplitSeq(data, "\n") {
		fields := strings.Fields(line)
		switch {
		case len(fields) == 0:
		case fields[0] == "cpu":
			total = fields[1:]
		case strings.HasPrefix(fields[0], "cpu"):
			cpus++
		}
	}
	if len(total) < 7 || cpus == 0 {
		return 0, 0, errors.New("/proc/stat: no aggregate cpu line")
	}
	var ticks uint64
	for _, i := range []int{0, 1, 2, 5, 6} { // user nice system _ _ irq softirq
		v, err := strconv.ParseUint(total[i], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: cpu field %d: %w", i+1, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / userHZ, cpus, nil
}

// outsideShare is the fraction of the CPUs' time between a and b that
// processes outside the job kept busy: the CPUs' busy time less the job's
// CPU time, over the elapsed time of every CPU. It is 0 for marks that say
// nothing (no time passed, or b not after a); the job's time, counted
// exactly, can exceed the busy time counted in ticks, so it is clamped at 0.
func outsideShare(a, b loadMark) float64 {
	wall := b.at.Sub(a.at)
	if wall <= 0 || b.cpus <= 0 {
		return 0
	}
	outside := (b.busy - a.busy) - (b.job - a.job)
	return max(0, min(1, float64(outside)/float64(wall*time.Duration(b.cpus))))
}

// reportLoad writes, after a job that began at start, the share of the
// CPUs that processes outside it took meanwhile, as a comment line.
func reportLoad(w *os.File, start loadMark) {
	end, err := markLoad()
	if err != nil {
		return
	}
	fmt.Fprintf(w, "# load: processes outside this job kept %.0f%% of the %d CPUs busy while it ran (/proc/stat less the job's CPU time); above ~10%% the figures may not be the quiet machine's\n",
		100*outsideShare(start, end), end.cpus)
}
