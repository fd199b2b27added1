package tcp

import (
	"runtime"
	"sync/atomic"
	"time"
)

// closedBias is added to a guard's user count when it closes, making the
// count negative for as long as any plausible number of users hold it.
const closedBias = -(1 << 40)

// fdGuard protects a descriptor we own from being closed (and its number
// reused by an unrelated open) while another goroutine is inside a syscall on
// it. It costs two atomic adds per use, the same as Go's own fdMutex.
type fdGuard struct {
	n      atomic.Int64
	closed atomic.Bool
}

// acquire reports whether the descriptor is open; if so the caller must
// release it after its syscall.
func (g *fdGuard) acquire() bool {
	if g.n.Add(1) < 0 {
		g.n.Add(-1)
		return false
	}
	return true
}

func (g *fdGuard) release() { g.n.Add(-1) }

// shut makes every later acquire fail. It reports false if the guard was
// already shut.
func (g *fdGuard) shut() bool {
	if !g.closed.CompareAndSwap(false, true) {
		return false
	}
	g.n.Add(closedBias)
	return true
}

// drain waits until no user holds the guard, calling nudge between checks so
// that a user parked in a syscall can be woken.
func (g *fdGuard) drain(nudge func()) {
	for i := 0; g.n.Load() != closedBias; i++ {
		if nudge != nil {
			nudge()
		}
		if i < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(100 * time.Microsecond)
		}
	}
}
