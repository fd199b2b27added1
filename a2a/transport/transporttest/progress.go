package transporttest

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/transport"
)

// The engine's idle policy, for the tests' and benchmarks' progress loops:
// spin (letting other goroutines run) for IdleSpin, then give the core away
// with sched_yield until IdleYield, then park in Wait.
const (
	IdleSpin  = 50 * time.Microsecond
	IdleYield = time.Millisecond
)

// Idler applies the idle policy to a progress loop. The zero value is ready.
type Idler struct {
	start time.Time // of the current idle stretch; zero while moving
	Parks int       // parks in Wait so far
}

// Moved ends an idle stretch.
func (d *Idler) Moved() { d.start = time.Time{} }

// Idle waits one step of the policy on tr and returns how long the stretch
// has lasted.
func (d *Idler) Idle(tr transport.Transport) time.Duration {
	now := time.Now()
	if d.start.IsZero() {
		d.start = now
	}
	switch idle := now.Sub(d.start); {
	case idle < IdleSpin:
		runtime.Gosched()
	case idle < IdleSpin+IdleYield:
		unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	default:
		d.Parks++
		tr.Wait(time.Millisecond)
	}
	return now.Sub(d.start)
}

// Progress drives one send and one receive (either may be nil) on c until
// both are done, idling like the engine, without allocating. It returns how
// often it parked.
func Progress(tr transport.Transport, c transport.Conn, s *transport.SendOp, r *transport.RecvOp) (parks int, err error) {
	sDone, rDone := s == nil, r == nil
	var d Idler
	for !sDone || !rDone {
		moved := false
		if !sDone {
			before := s.Progress
			done, err := c.TrySend(s)
			if err != nil {
				return d.Parks, err
			}
			sDone, moved = done, done || s.Progress != before
		}
		if !rDone {
			before := r.Progress
			done, err := c.TryRecv(r)
			if err != nil {
				return d.Parks, err
			}
			rDone, moved = done, moved || done || r.Progress != before
		}
		if moved {
			d.Moved()
			continue
		}
		d.Idle(tr)
	}
	return d.Parks, nil
}
