package engine

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// Waiting defaults (Config.Spin, Config.Yield).
const (
	DefaultSpin = 50 * time.Microsecond // busy-poll before yielding the core
	// DefaultYield is how long a rank gives its core away with sched_yield
	// before parking; parking costs a 30-70 us wake-up on these VMs (2
	// ranks, 8 B AllToAll: 52-62 us parking at once against 0.55 us). A
	// longer yield when ranks outnumber cores was tried: 4 ranks on 2
	// cores ran 4.9-6.9 us with 50 ms against 4.9-8.4 us with 1 ms, within
	// the noise, while a yielding goroutine keeps its P from the
	// application's goroutines (GOMAXPROCS is 1 for a rank bound to a
	// core), so the yield stays short.
	DefaultYield = time.Millisecond
)

// MaxPark bounds one park in Transport.Wait, so a parked rank re-checks its
// context, deadline and abort state at least this often.
const MaxPark = 10 * time.Millisecond

// Waiting is how a rank waits for data that has not arrived: busy-poll for
// Spin, then give the core away with sched_yield until Spin+Yield, then park
// in Transport.Wait.
type Waiting struct {
	Spin, Yield time.Duration
	// SharedProcess: other ranks are goroutines of this process.
	SharedProcess bool
	// Crowded: the group's ranks on this machine outnumber the CPUs they may
	// run on, so ranks share cores.
	Crowded bool
}

// ResolveWaiting resolves the configured spin and yield (Config.Spin,
// Config.Yield: 0 is the default, a negative spin none) for a rank whose
// machine runs ranks of the group on cpus CPUs (every host on the machine
// counts: network namespaces and containers share the kernel's cores), and
// whose process also runs other ranks (sharedProcess).
//
// By default a rank busy-polls, then yields, then parks. When the machine is
// crowded, its ranks outnumbering the CPUs they may run on together, a
// spinning rank would hold the core the rank it waits for needs, so it does
// not spin (Open MPI's yield_when_idle makes the same call). Ranks that are
// goroutines of one process (tests, in-process groups) share the process's
// Ps instead of cores: the engine then also yields to goroutines.
func ResolveWaiting(spin, yield time.Duration, ranks, cpus int, sharedProcess bool) Waiting {
	crowded := ranks > cpus
	switch {
	case spin < 0:
		spin = 0
	case spin == 0 && crowded:
	case spin == 0:
		spin = DefaultSpin
	}
	if yield == 0 {
		yield = DefaultYield
	}
	return Waiting{Spin: spin, Yield: yield, SharedProcess: sharedProcess, Crowded: crowded}
}

// rebalanceEvery is how often a crowded rank that yields looks at how the
// host's ranks sit on its CPUs (Placer), ~0.3 us a look. By time, not by
// yields: a rank that shares its CPU yields less often than one alone on
// its CPU, and it is the one that must move.
const rebalanceEvery = time.Millisecond

// Pause waits once for an operation idle for idle (past the spin): it yields
// the core until spin+yield, then parks in Transport.Wait until deadline, at
// most MaxPark.
func (e *Engine) Pause(idle time.Duration, now, deadline time.Time) error {
	if idle < e.wait.Spin+e.wait.Yield {
		if e.wait.SharedProcess {
			runtime.Gosched() // sched_yield alone keeps this goroutine's P
		}
		if e.wait.Crowded && !e.wait.SharedProcess && e.placer != nil && now.Sub(e.placed) >= rebalanceEvery {
			e.placed = now
			e.placer.Rebalance()
		}
		schedYield() // let an oversubscribed peer rank run on this core
		return nil
	}
	return e.tr.Wait(min(deadline.Sub(now), MaxPark))
}

// schedYield gives the core to another runnable thread of any process; Go's
// runtime.Gosched only yields to goroutines of this process.
func schedYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
