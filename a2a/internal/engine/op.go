package engine

import "time"

// opState is what the engine knows of the running operation (collective or
// point to point): its name, its figures and its deadline.
type opState struct {
	// name and seq name the operation in errors ("AllToAllV", its op
	// sequence number).
	name string
	seq  uint64
	// start is when the operation started (the zero Time while nobody
	// timed it, until it first waits); deadline ends its waiting, and
	// ownDeadline says the engine set it (Options.Timeout).
	start, deadline time.Time
	ownDeadline     bool
	traffic         Traffic
	// The peer whose data arrived last after the engine had to wait, and
	// how long after start.
	lastPeer int
	lastWait time.Duration
	sameHost []bool // by peer: shares this rank's host
}

// StartOp resets the per-operation figures (bytes, wait attribution) for
// the operation name (the API's name, for errors) numbered seq that started
// at start (the zero Time: nobody reads its waits), whose runs add to them,
// and sets its deadline: the given one, or, if that is zero, the engine's
// timeout after the operation first waits.
func (e *Engine) StartOp(name string, seq uint64, start, deadline time.Time) {
	e.op.name, e.op.seq = name, seq
	e.op.start, e.op.deadline, e.op.ownDeadline, e.op.traffic = start, deadline, false, Traffic{}
	e.op.lastPeer, e.op.lastWait = -1, 0
}

// Traffic is what the operation moved so far (see StartOp).
func (e *Engine) Traffic() Traffic { return e.op.traffic }

// LastArrival is the wait attribution of the operation: the peer whose data
// arrived last after the engine had to wait (-1 if none), and how long after
// the operation's start.
func (e *Engine) LastArrival() (peer int, wait time.Duration) { return e.op.lastPeer, e.op.lastWait }

// arrived attributes the wait to peer, whose data just arrived.
func (o *opState) arrived(peer int, waited bool) {
	// Arrivals come in time order; without a wait since the last clock
	// read this one adds no waiting time.
	w := o.lastWait
	if waited && !o.start.IsZero() {
		w = time.Since(o.start)
	}
	if w >= o.lastWait {
		o.lastPeer, o.lastWait = peer, w
	}
}

// Traffic is what one operation moved to and from other ranks, in bytes,
// with the part exchanged with ranks of this host.
type Traffic struct {
	Sent, Received           int64
	SentLocal, ReceivedLocal int64
}

// merge adds o's counts to t.
func (t *Traffic) merge(o *Traffic) {
	t.Sent, t.Received = t.Sent+o.Sent, t.Received+o.Received
	t.SentLocal, t.ReceivedLocal = t.SentLocal+o.SentLocal, t.ReceivedLocal+o.ReceivedLocal
}

// Add counts n bytes sent (send) or received, to or from a rank of this
// host (local) or not.
func (t *Traffic) Add(send, local bool, n int) {
	switch {
	case send && local:
		t.Sent, t.SentLocal = t.Sent+int64(n), t.SentLocal+int64(n)
	case send:
		t.Sent += int64(n)
	case local:
		t.Received, t.ReceivedLocal = t.Received+int64(n), t.ReceivedLocal+int64(n)
	default:
		t.Received += int64(n)
	}
}
