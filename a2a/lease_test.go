package a2a

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// leaseUses runs n uses of u numbered from k, checking every byte.
func leaseUses(ctx context.Context, u *directUse, k, n int) error {
	for i := k; i < k+n; i++ {
		u.fill(i)
		if err := u.p.Start(ctx); err != nil {
			return err
		}
		if err := u.p.Wait(ctx); err != nil {
			return fmt.Errorf("use %d: %w", i, err)
		}
		if err := u.check(i); err != nil {
			return err
		}
	}
	return nil
}

// TestPersistentLeaseRevoke ends a persistent AllToAllV's lease (lease.go)
// with every kind of call, in each state the lease can be in: idle (the
// holder between uses), started (between its Start and Wait) and busy (its
// use runs, waiting for the late peer, while another goroutine calls).
// Every call must complete with its right result, every byte of every use
// must arrive, nothing may hang, and the uses after must take the lease
// again. Over TCP, shm and mixed.
func TestPersistentLeaseRevoke(t *testing.T) {
	url := startNATS(t)
	type call func(ctx context.Context, c *Comm, k int) error
	// others are a second persistent collective per rank, made before the
	// calls: Init plans on the Comm's state, not to be done while a
	// collective runs.
	type other struct {
		p   *Persistent
		out []byte
	}
	var others []other
	calls := []struct {
		name string
		do   call
	}{
		{"p2p", func(ctx context.Context, c *Comm, k int) error {
			rr, sr, check := ringP2P(ctx, c, k)
			if err := WaitAll(ctx, rr, sr); err != nil {
				return err
			}
			return check()
		}},
		{"blocking", func(ctx context.Context, c *Comm, k int) error {
			out := make([]byte, 8)
			if err := c.AllReduce(ctx, []byte{byte(k), 0, 0, 0, 0, 0, 0, 0}, out, Int64, Sum); err != nil {
				return err
			}
			if out[0] != byte(c.Size()*k) {
				return fmt.Errorf("allreduce: %d, want %d", out[0], c.Size()*k)
			}
			return nil
		}},
		{"nonblocking", func(ctx context.Context, c *Comm, k int) error {
			out := make([]byte, 8)
			r := c.IAllReduce(ctx, []byte{1, 0, 0, 0, 0, 0, 0, 0}, out, Int64, Sum)
			if _, err := r.Wait(ctx); err != nil {
				return err
			}
			if int(out[0]) != c.Size() {
				return fmt.Errorf("iallreduce: %d, want %d", out[0], c.Size())
			}
			return nil
		}},
		{"other-persistent", func(ctx context.Context, c *Comm, k int) error {
			o := others[c.Rank()]
			if err := o.p.Start(ctx); err != nil {
				return err
			}
			if err := o.p.Wait(ctx); err != nil {
				return err
			}
			if int(o.out[0]) != 2*c.Size() {
				return fmt.Errorf("persistent allreduce: %d, want %d", o.out[0], 2*c.Size())
			}
			return nil
		}},
	}
	states := []string{"idle", "started", "busy"}
	for _, dp := range dataPlanes {
		t.Run(dp.name, func(t *testing.T) {
			ranks := planeRanks(dp.name)
			comms := planeGroup(t, url, ranks, dp.mod)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			us := make([]*directUse, ranks)
			others = make([]other, ranks)
			mustAll(t, onAll(comms, func(c *Comm) error {
				u, err := newDirectUse(c, 8)
				us[c.Rank()] = u
				if err != nil {
					return err
				}
				o := &others[c.Rank()]
				o.out = make([]byte, 8)
				o.p, err = c.AllReduceInit([]byte{2, 0, 0, 0, 0, 0, 0, 0}, o.out, Int64, Sum)
				return err
			}))
			k := 0
			for _, state := range states {
				for _, cl := range calls {
					t.Run(state+"/"+cl.name, func(t *testing.T) {
						mustAll(t, onAll(comms, func(c *Comm) error {
							u := us[c.Rank()]
							if err := leaseUses(ctx, u, k, 3); err != nil { // the lease is taken
								return err
							}
							if u.p.leased == 0 {
								return errors.New("no use ran under a lease")
							}
							switch state {
							case "idle":
								if err := cl.do(ctx, c, k); err != nil {
									return fmt.Errorf("%s: %w", cl.name, err)
								}
							case "started":
								u.fill(k + 3)
								if err := u.p.Start(ctx); err != nil {
									return err
								}
								if err := cl.do(ctx, c, k); err != nil { // runs the started use first
									return fmt.Errorf("%s: %w", cl.name, err)
								}
								if err := u.p.Wait(ctx); err != nil {
									return err
								}
								if err := u.check(k + 3); err != nil {
									return err
								}
							case "busy":
								// Rank 0's use waits for the others, late by 30 ms;
								// another goroutine of rank 0 calls meanwhile. Every
								// rank's call comes after the use, in call order.
								u.fill(k + 3)
								if c.Rank() != 0 {
									time.Sleep(30 * time.Millisecond)
								}
								if err := u.p.Start(ctx); err != nil {
									return err
								}
								done := make(chan error, 1)
								if c.Rank() == 0 {
									go func() {
										time.Sleep(5 * time.Millisecond)
										done <- cl.do(ctx, c, k)
									}()
								}
								if err := u.p.Wait(ctx); err != nil {
									return err
								}
								if err := u.check(k + 3); err != nil {
									return err
								}
								if c.Rank() != 0 {
									go func() { done <- cl.do(ctx, c, k) }()
								}
								if err := <-done; err != nil {
									return fmt.Errorf("%s: %w", cl.name, err)
								}
							}
							before := u.p.leased
							if err := leaseUses(ctx, u, k+4, 3); err != nil {
								return fmt.Errorf("after: %w", err)
							}
							if u.p.leased < before+2 {
								return fmt.Errorf("%d of 3 uses after ran under a lease, want at least 2", u.p.leased-before)
							}
							return nil
						}))
					})
					k += 7
				}
			}
		})
	}
}

// TestPersistentLeaseClose: a lease held between uses must not keep the
// Comm's Close (which waits for the running calls) or SetAlgo waiting, nor
// outlive its Persistent's Close.
func TestPersistentLeaseClose(t *testing.T) {
	url := startNATS(t)
	for _, dp := range dataPlanes[:2] {
		t.Run(dp.name, func(t *testing.T) {
			comms := planeGroup(t, url, 2, dp.mod)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			mustAll(t, onAll(comms, func(c *Comm) error {
				u, err := newDirectUse(c, 8)
				if err != nil {
					return err
				}
				if err := leaseUses(ctx, u, 0, 5); err != nil {
					return err
				}
				// SetAlgo between uses, on every rank: the lease gives way.
				if err := c.SetAlgo("pairwise"); err != nil {
					return fmt.Errorf("SetAlgo under a lease: %w", err)
				}
				if err := leaseUses(ctx, u, 5, 5); err != nil {
					return err
				}
				second, err := newDirectUse(c, 8)
				if err != nil {
					return err
				}
				// Closing the holder gives the turn back: the other
				// Persistent takes the next lease.
				if err := u.p.Close(); err != nil {
					return err
				}
				if c.queue.lease.word.Load() != leaseNone {
					return errors.New("the lease outlived its Persistent's Close")
				}
				if err := leaseUses(ctx, second, 10, 5); err != nil {
					return err
				}
				if second.p.leased == 0 {
					return errors.New("the second Persistent never held the lease")
				}
				// The Comm's Close with the lease held (the Persistent left
				// open) must return.
				closed := make(chan error, 1)
				go func() { closed <- c.Close() }()
				select {
				case err := <-closed:
					if err != nil {
						return fmt.Errorf("Close: %w", err)
					}
				case <-time.After(10 * time.Second):
					return errors.New("Close did not return within 10 s under a lease")
				}
				if err := second.p.Start(ctx); err != nil {
					return err
				}
				if err := second.p.Wait(ctx); !errors.Is(err, ErrClosed) {
					return fmt.Errorf("a use after Close: %v, want ErrClosed", err)
				}
				return nil
			}))
		})
	}
}
