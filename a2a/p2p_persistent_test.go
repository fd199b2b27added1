package a2a

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// TestPersistentPointToPoint runs a ring of persistent sends and receives
// over each data plane: lengths and buffers change from Start to Start,
// a Barrier sits between some steps, and every byte is checked. Then the
// misuse cases, and the allocations of warm steps (none).
func TestPersistentPointToPoint(t *testing.T) {
	url := startNATS(t)
	const n, steps, room = 4, 40, 3000
	for _, dp := range dataPlanes {
		t.Run(dp.name, func(t *testing.T) {
			comms := planeGroup(t, url, n, dp.mod)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			mustAll(t, onAll(comms, func(c *Comm) error {
				r := c.Rank()
				next, prev := (r+1)%n, (r+n-1)%n
				send, recv := c.SendInit(next, 7), c.RecvInit(prev, 7)
				if _, err := send.Wait(ctx); !errors.Is(err, ErrInvalidArgument) {
					return fmt.Errorf("Wait before the first Start: %v", err)
				}
				bufs := [2][]byte{make([]byte, room), make([]byte, room)}
				in := make([]byte, room)
				for s := range steps {
					length := (r*131 + s*577) % room // some steps send nothing
					out := bufs[s%2][:length]
					for i := range out {
						out[i] = byte(r + 3*s + i)
					}
					if err := recv.Start(ctx, in); err != nil {
						return err
					}
					if err := send.Start(ctx, out); err != nil {
						return err
					}
					got, err := recv.Wait(ctx)
					if err != nil {
						return fmt.Errorf("step %d: %w", s, err)
					}
					if _, err := send.Wait(ctx); err != nil {
						return fmt.Errorf("step %d: %w", s, err)
					}
					want := (prev*131 + s*577) % room
					if got != want {
						return fmt.Errorf("step %d: received %d bytes from rank %d, want %d", s, got, prev, want)
					}
					for i, b := range in[:got] {
						if b != byte(prev+3*s+i) {
							return fmt.Errorf("step %d: byte %d from rank %d is %d, want %d", s, i, prev, b, byte(prev+3*s+i))
						}
					}
					if s%7 == 3 {
						if err := c.Barrier(ctx); err != nil {
							return err
						}
					}
				}
				// A second Start while the receive is in flight (its peer
				// sends only after its own check) posts nothing.
				if err := recv.Start(ctx, in); err != nil {
					return err
				}
				if err := recv.Start(ctx, in); !errors.Is(err, ErrInvalidArgument) {
					return fmt.Errorf("Start in flight: %v", err)
				}
				if err := send.Start(ctx, bufs[0][:5]); err != nil {
					return err
				}
				isend := c.Isend(ctx, nil, next, 8)
				if err := isend.Start(ctx, nil); !errors.Is(err, ErrInvalidArgument) {
					return fmt.Errorf("Start of an Isend: %v", err)
				}
				if _, err := c.Recv(ctx, make([]byte, 1), prev, 8); err != nil {
					return err
				}
				if err := WaitAll(ctx, send, recv, isend); err != nil {
					return err
				}
				// The Comm is still usable.
				return c.Barrier(ctx)
			}))
		})
	}
	t.Run("allocations", func(t *testing.T) {
		comms := planeGroup(t, url, n, func(c *Config) {
			dataPlanes[2].mod(c)
			c.HeartbeatInterval, c.PeerTimeout, c.Report = 10*time.Second, 30*time.Second, -1
		})
		ctx := context.Background()
		type ring struct {
			send, recv *Request
			out, in    []byte
		}
		rings := make([]ring, n)
		for r, c := range comms {
			rings[r] = ring{send: c.SendInit((r+1)%n, 9), recv: c.RecvInit((r+n-1)%n, 9), out: make([]byte, 256), in: make([]byte, 256)}
		}
		run := func(iters int) {
			mustAll(t, onAll(comms, func(c *Comm) error {
				g := &rings[c.Rank()]
				for i := range iters {
					if err := g.recv.Start(ctx, g.in); err != nil {
						return err
					}
					if err := g.send.Start(ctx, g.out[:i%256]); err != nil {
						return err
					}
					if err := WaitAll(ctx, g.recv, g.send); err != nil {
						return err
					}
				}
				return nil
			}))
		}
		run(30)
		const iters = 500
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		run(iters)
		runtime.ReadMemStats(&after)
		perStep := (float64(after.Mallocs-before.Mallocs) - 64) / float64(n*iters)
		t.Logf("%.3f allocations per step (a send and a receive)", perStep)
		if perStep > 0.1 {
			t.Errorf("%.2f allocations per step, want 0", perStep)
		}
	})
}
