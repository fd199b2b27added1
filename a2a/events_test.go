package a2a

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// eventLog is an Observer that keeps every OpEvent.
type eventLog struct {
	mu     sync.Mutex
	events []OpEvent
}

func (l *eventLog) OpDone(ev OpEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, ev)
}

func (*eventLog) CountsExchanged(time.Duration, error) {}

func (l *eventLog) last(op string) (OpEvent, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.events) - 1; i >= 0; i-- {
		if l.events[i].Op == op {
			return l.events[i], true
		}
	}
	return OpEvent{}, false
}

// TestTrafficBreakdown: every collective reports, besides its bytes, the part
// exchanged with ranks of the same host. Whatever the algorithm, what ranks
// send locally (remotely) is what ranks receive locally (remotely), and on a
// group spread over two hosts both parts move.
func TestTrafficBreakdown(t *testing.T) {
	const n = 4
	logs := make([]*eventLog, n)
	for r := range logs {
		logs[r] = new(eventLog)
	}
	url := startNATS(t)
	comms := group(t, url, n, func(c *Config) {
		c.Host = fmt.Sprintf("host%d", c.Rank/2)
		c.Observer = logs[c.Rank]
	})
	ops := []struct {
		name string
		run  func(c *Comm) error
	}{
		{"alltoallv", func(c *Comm) error {
			send, recv := []int{100, 200, 300, 400}, make([]int, n) // rank j gets 100(j+1) from everyone
			for i := range recv {
				recv[i] = 100 * (c.Rank() + 1)
			}
			return c.AllToAllV(context.Background(), make([]byte, 1000), send, make([]byte, 400*(c.Rank()+1)), recv)
		}},
		{"allgather", func(c *Comm) error {
			return c.AllGather(context.Background(), make([]byte, 64), make([]byte, 64*n))
		}},
		{"allreduce", func(c *Comm) error {
			return c.AllReduce(context.Background(), make([]byte, 4096), make([]byte, 4096), Float32, Sum)
		}},
		{"send", func(c *Comm) error { // and recv: 0->1 local, 2->3 local, none remote
			buf := make([]byte, 77)
			if c.Rank()%2 == 0 {
				return c.Send(context.Background(), buf, c.Rank()+1, 5)
			}
			_, err := c.Recv(context.Background(), buf, c.Rank()-1, 5)
			return err
		}},
	}
	for _, op := range ops {
		mustAll(t, onAll(comms, op.run))
		var sent, received, sentLocal, receivedLocal int64
		for r := range n {
			name := op.name
			if name == "send" && r%2 == 1 {
				name = "recv"
			}
			ev, ok := logs[r].last(name)
			if !ok {
				t.Fatalf("%s: rank %d reported no %s", op.name, r, name)
			}
			if ev.BytesSentLocal < 0 || ev.BytesSentLocal > ev.BytesSent || ev.BytesReceivedLocal < 0 || ev.BytesReceivedLocal > ev.BytesReceived {
				t.Fatalf("%s: rank %d: local parts %d/%d of %d/%d", op.name, r, ev.BytesSentLocal, ev.BytesReceivedLocal, ev.BytesSent, ev.BytesReceived)
			}
			sent, received = sent+ev.BytesSent, received+ev.BytesReceived
			sentLocal, receivedLocal = sentLocal+ev.BytesSentLocal, receivedLocal+ev.BytesReceivedLocal
		}
		if sent != received || sentLocal != receivedLocal || sentLocal == 0 {
			t.Errorf("%s: ranks sent %d (%d local) and received %d (%d local): want equal, with a local part", op.name, sent, sentLocal, received, receivedLocal)
		}
		if op.name != "send" && sentLocal == sent {
			t.Errorf("%s: all %d bytes counted local on two hosts", op.name, sent)
		}
	}
}
