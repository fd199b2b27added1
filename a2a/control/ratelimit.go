package control

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// bucket is a token bucket: rate tokens a second, at most one second's
// worth saved up. NATS limits an account's connections, subscriptions and
// payload but not its message rate, so a service that must not be flooded
// (ServiceConfig.MaxRate) counts for itself. Safe for concurrent use: the
// handlers of a service's subscriptions run on goroutines of their own.
type bucket struct {
	mu     sync.Mutex
	rate   float64
	tokens float64
	last   time.Time
}

func newBucket(rate float64, now time.Time) *bucket {
	return &bucket{rate: rate, tokens: rate, last: now}
}

// take reports whether a token was there at now, and takes it.
func (b *bucket) take(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.tokens = min(b.rate, b.tokens+dt*b.rate)
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// limited wraps a handler of the service's subscriptions with its rate
// limit: a message over it is dropped before anything else is done with it.
func (s *Service) limited(h nats.MsgHandler) nats.MsgHandler {
	if s.rate == nil {
		return h
	}
	return func(msg *nats.Msg) {
		if !s.rate.take(time.Now()) {
			s.reject(RejectRate, msg.Subject)
			return
		}
		h(msg)
	}
}
