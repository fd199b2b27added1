package a2a

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// everyCall is one call of every kind a Comm answers, for a group of 3, with
// valid arguments: after an abort or Close each must fail without waiting.
var everyCall = []struct {
	name string
	call func(ctx context.Context, c *Comm) error
}{
	{"AllToAllV", func(ctx context.Context, c *Comm) error {
		return c.AllToAllV(ctx, make([]byte, 3), []int{1, 1, 1}, make([]byte, 3), []int{1, 1, 1})
	}},
	{"AllToAll", func(ctx context.Context, c *Comm) error { return c.AllToAll(ctx, make([]byte, 3), make([]byte, 3)) }},
	{"AllToAllVInBand", func(ctx context.Context, c *Comm) error {
		return c.AllToAllVInBand(ctx, make([]byte, 3), []int{1, 1, 1}, make([]byte, 3), make([]int, 3))
	}},
	{"AllToAllVMatrix", func(ctx context.Context, c *Comm) error {
		return c.AllToAllVMatrix(ctx, make([]byte, 3), make([]byte, 3), []int{1, 1, 1, 1, 1, 1, 1, 1, 1})
	}},
	{"AllToAllVSpans", func(ctx context.Context, c *Comm) error {
		return c.AllToAllVSpans(ctx, nil, make([][]Span, 3), nil, make([][]Span, 3))
	}},
	{"ExchangeCounts", func(ctx context.Context, c *Comm) error {
		_, err := c.ExchangeCounts(ctx, []int{1, 1, 1})
		return err
	}},
	{"ExchangeCountsMatrix", func(ctx context.Context, c *Comm) error {
		return c.ExchangeCountsMatrix(ctx, []int{1, 1, 1}, make([]int, 3), make([]int, 9))
	}},
	{"AllReduce", func(ctx context.Context, c *Comm) error {
		return c.AllReduce(ctx, make([]byte, 12), make([]byte, 12), Float32, Sum)
	}},
	{"ReduceScatter", func(ctx context.Context, c *Comm) error {
		return c.ReduceScatter(ctx, make([]byte, 12), make([]byte, 4), Float32, Sum)
	}},
	{"AllGather", func(ctx context.Context, c *Comm) error { return c.AllGather(ctx, make([]byte, 1), make([]byte, 3)) }},
	{"AllGatherV", func(ctx context.Context, c *Comm) error {
		return c.AllGatherV(ctx, make([]byte, 1), make([]byte, 3), []int{1, 1, 1})
	}},
	{"Broadcast", func(ctx context.Context, c *Comm) error { return c.Broadcast(ctx, make([]byte, 4), 0) }},
	{"Reduce", func(ctx context.Context, c *Comm) error {
		return c.Reduce(ctx, make([]byte, 4), make([]byte, 4), Float32, Sum, 0)
	}},
	{"Gather", func(ctx context.Context, c *Comm) error { return c.Gather(ctx, make([]byte, 1), make([]byte, 3), 0) }},
	{"GatherV", func(ctx context.Context, c *Comm) error {
		return c.GatherV(ctx, make([]byte, 1), make([]byte, 3), []int{1, 1, 1}, 0)
	}},
	{"Scatter", func(ctx context.Context, c *Comm) error { return c.Scatter(ctx, make([]byte, 3), make([]byte, 1), 0) }},
	{"ScatterV", func(ctx context.Context, c *Comm) error {
		return c.ScatterV(ctx, make([]byte, 3), []int{1, 1, 1}, make([]byte, 1), 0)
	}},
	{"Barrier", func(ctx context.Context, c *Comm) error { return c.Barrier(ctx) }},
	{"Send", func(ctx context.Context, c *Comm) error { return c.Send(ctx, make([]byte, 1), (c.Rank()+1)%3, 0) }},
	{"Recv", func(ctx context.Context, c *Comm) error {
		_, err := c.Recv(ctx, make([]byte, 1), (c.Rank()+2)%3, 0)
		return err
	}},
	{"SendRecv", func(ctx context.Context, c *Comm) error {
		_, err := c.SendRecv(ctx, make([]byte, 1), (c.Rank()+1)%3, 0, make([]byte, 1), (c.Rank()+2)%3, 0)
		return err
	}},
	{"Isend", func(ctx context.Context, c *Comm) error {
		_, err := c.Isend(ctx, make([]byte, 1), (c.Rank()+1)%3, 0).Wait(ctx)
		return err
	}},
	{"Irecv", func(ctx context.Context, c *Comm) error {
		_, err := c.Irecv(ctx, make([]byte, 1), (c.Rank()+2)%3, 0).Wait(ctx)
		return err
	}},
	{"Group", func(ctx context.Context, c *Comm) error {
		g := c.NewGroup()
		g.Send(make([]byte, 1), (c.Rank()+1)%3, 0)
		g.Recv(make([]byte, 1), (c.Rank()+2)%3, 0)
		return g.Wait(ctx)
	}},
	{"bad argument", func(ctx context.Context, c *Comm) error {
		return c.AllToAll(ctx, make([]byte, 2), make([]byte, 2))
	}},
}

// TestAbortedAnswersAlike: once rank 0 failed a call (a send buffer 1 byte
// short), every call of every rank matches ErrAborted and wraps that first
// cause, naming rank 0; after Close every call is ErrClosed, abort or not.
func TestAbortedAnswersAlike(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 3, nil)
	errs := onAll(comms, func(c *Comm) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		send := make([]byte, 3)
		if c.Rank() == 0 {
			send = send[:2]
		}
		return c.AllToAllV(ctx, send, []int{1, 1, 1}, make([]byte, 3), []int{1, 1, 1})
	})
	if !errors.Is(errs[0], ErrInvalidArgument) || errors.Is(errs[0], ErrAborted) {
		t.Fatalf("rank 0, the failing call: %v, want ErrInvalidArgument only", errs[0])
	}
	for r, c := range comms {
		for _, tc := range everyCall {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := tc.call(ctx, c)
			cancel()
			if !errors.Is(err, ErrAborted) || !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "rank 0") {
				t.Errorf("rank %d %s after the abort: %v, want ErrAborted wrapping rank 0's ErrInvalidArgument", r, tc.name, err)
			}
		}
		if err := c.Err(); !errors.Is(err, ErrAborted) || !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("rank %d Err: %v", r, err)
		}
	}
	if err := comms[0].Abort(nil); !errors.Is(err, ErrAborted) || !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Abort after the abort: %v, want the first cause", err)
	}
	if err := comms[0].Err(); !strings.Contains(err.Error(), "Join again") {
		t.Errorf("rank 0 Err does not say what to do: %v", err)
	}

	// A healthy Comm, closed, answers ErrClosed too.
	healthy := group(t, url, 3, nil)
	for _, cs := range [][]*Comm{comms, healthy} {
		for _, c := range cs {
			c.Close()
		}
	}
	for i, cs := range [][]*Comm{comms, healthy} {
		for r, c := range cs {
			for _, tc := range everyCall {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := tc.call(ctx, c)
				cancel()
				if !errors.Is(err, ErrClosed) || errors.Is(err, ErrAborted) {
					t.Errorf("group %d rank %d %s after Close: %v, want ErrClosed only", i, r, tc.name, err)
				}
			}
		}
	}
	// Err still tells why the aborted one stopped.
	if err := comms[1].Err(); !errors.Is(err, ErrAborted) {
		t.Errorf("Err after Close of the aborted Comm: %v", err)
	}
	if err := healthy[1].Err(); !errors.Is(err, ErrClosed) {
		t.Errorf("Err after Close of a healthy Comm: %v", err)
	}
}
