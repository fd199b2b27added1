package transport

import (
	"runtime"
	"sync/atomic"
	"time"
)

// closedBias is added to a guard's user count when it is shut, making the
// count negative for as long as any plausible number of users hold it.
const closedBias = -(1 << 40)

// Guard keeps a resource a transport owns (a socket descriptor, mapped
// memory) from being released while another goroutine is using it: a closed
// descriptor's number could be reused by an unrelated open, unmapped memory
// would fault. It costs two uncontended atomic adds per use, as Go's own
// fdMutex does. The zero value is an open guard.
type Guard struct {
	n      atomic.Int64
	closed atomic.Bool
}

// Acquire reports whether the resource is still open; if so the caller must
// Release the guard when done with it.
func (g *Guard) Acquire() bool {
	if g.n.Add(1) < 0 {
		g.n.Add(-1)
		return false
	}
	return true
}

// Enter is Acquire for a call that fails with closed once the resource is
// released (a transport's or conn's fault.ErrClosed): it returns nil, and
// the caller must then Release the guard when done, or closed.
func (g *Guard) Enter(closed error) error {
	if g.Acquire() {
		return nil
	}
	return closed
}

// Release ends a use begun by a successful Acquire or Enter.
func (g *Guard) Release() { g.n.Add(-1) }

// Shut makes every later Acquire fail. It reports false if the guard was
// already shut.
func (g *Guard) Shut() bool {
	if !g.closed.CompareAndSwap(false, true) {
		return false
	}
	g.n.Add(closedBias)
	return true
}

// Drain waits until no user holds the guard, calling nudge (if not nil)
// between checks so that a user parked in a syscall or on a futex can be woken.
func (g *Guard) Drain(nudge func()) {
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
