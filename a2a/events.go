package a2a

import (
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/engine"
)

// Observer receives the communicator's events. Package metrics implements it
// with Prometheus collectors, so the core does not depend on Prometheus.
// Methods run on the calling goroutine right after the event, while the
// communicator still holds its operation lock: keep them fast, and do not
// call the Comm from them.
type Observer interface {
	// OpDone is called after every collective, successful or not.
	OpDone(ev OpEvent)
	// CountsExchanged is called after every counts exchange over the control plane.
	CountsExchanged(d time.Duration, err error)
}

// OpEvent describes one finished collective.
type OpEvent struct {
	Op            string // "alltoallv", "alltoall", ...
	Algo          string // algorithm the operation ran
	Rank, Size    int
	Seq           uint64
	BytesSent     int64 // to other ranks (the local block is not counted)
	BytesReceived int64
	// BytesSentLocal and BytesReceivedLocal are the parts of BytesSent and
	// BytesReceived exchanged with other ranks of this host.
	BytesSentLocal, BytesReceivedLocal int64
	Duration                           time.Duration
	Err                                error
	// LastPeer is the peer whose data arrived last and LastWait how long after
	// the start it arrived: the rank this one waited on most (-1 if none).
	// LastWait is 0 when every peer's data was already there when the rank
	// first looked, or came within its first few polls (the clock is only
	// read once a rank has to wait longer).
	LastPeer int
	LastWait time.Duration
}

// setTraffic copies an operation's byte counts into the event.
func (ev *OpEvent) setTraffic(t engine.Traffic) {
	ev.BytesSent, ev.BytesReceived = t.Sent, t.Received
	ev.BytesSentLocal, ev.BytesReceivedLocal = t.SentLocal, t.ReceivedLocal
}
