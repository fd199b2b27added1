package a2a

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"
)

// splitAll calls Split(color(r), key(r)) on every rank at once.
func splitAll(t *testing.T, comms []*Comm, color, key func(r int) int) []*Comm {
	t.Helper()
	kids := make([]*Comm, len(comms))
	mustAll(t, onAll(comms, func(c *Comm) error {
		k, err := c.Split(context.Background(), color(c.Rank()), key(c.Rank()))
		kids[c.Rank()] = k
		return err
	}))
	t.Cleanup(func() {
		for _, k := range kids {
			if k != nil {
				k.Close()
			}
		}
	})
	return kids
}

// splitExchange runs a verified AllToAllV of round k on c: rank s sends
// rank d vCount(s, d, k)*scale bytes of a pattern that names the sender's
// rank in the root, tag and k.
func splitExchange(ctx context.Context, c *Comm, tag, k, scale int) error {
	n, me := c.Size(), c.Rank()
	sc, rc := make([]int, n), make([]int, n)
	for d := range n {
		sc[d], rc[d] = vCount(me, d, k)*scale, vCount(d, me, k)*scale
	}
	send, recv := make([]byte, sum(sc)), make([]byte, sum(rc))
	off := 0
	for d := range n {
		for i := range sc[d] {
			send[off+i] = byte(c.share.rootRank(me)*29 + d*7 + tag*3 + k + i)
		}
		off += sc[d]
	}
	if err := c.AllToAllV(ctx, send, sc, recv, rc); err != nil {
		return err
	}
	off = 0
	for s := range n {
		for i := range rc[s] {
			if want := byte(c.share.rootRank(s)*29 + me*7 + tag*3 + k + i); recv[off+i] != want {
				return fmt.Errorf("tag %d round %d: byte %d from rank %d is %d, want %d", tag, k, i, s, recv[off+i], want)
			}
		}
		off += rc[s]
	}
	return nil
}

// rootRanks gathers every rank's number in the root, in c's rank order.
func rootRanks(ctx context.Context, c *Comm) ([]int, error) {
	send := binary.LittleEndian.AppendUint64(nil, uint64(c.share.rootRank(c.Rank())))
	recv := make([]byte, 8*c.Size())
	if err := c.AllGather(ctx, send, recv); err != nil {
		return nil, err
	}
	out := make([]int, c.Size())
	for i := range out {
		out[i] = int(binary.LittleEndian.Uint64(recv[8*i:]))
	}
	return out, nil
}

// fdCount is the number of open file descriptors of this process.
func fdCount(t *testing.T) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestSplit splits 4 ranks over every data plane in several ways and
// checks each child's membership and order, that it moves data and reduces
// right, and that splitting opened no file descriptor (socket, segment,
// memfd) in the process the ranks share.
func TestSplit(t *testing.T) {
	cases := []struct {
		name       string
		color, key func(r int) int
		want       [][]int // by rank: the child's ranks in the root, in order; nil for Undefined
	}{
		{"halves", func(r int) int { return r / 2 }, func(int) int { return 0 },
			[][]int{{0, 1}, {0, 1}, {2, 3}, {2, 3}}},
		{"parity, reversed by key", func(r int) int { return 5 + r%2 }, func(r int) int { return -r },
			[][]int{{2, 0}, {3, 1}, {2, 0}, {3, 1}}},
		{"equal keys keep the old order", func(int) int { return 9 }, func(r int) int { return r / 2 },
			[][]int{{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}}},
		{"undefined", func(r int) int {
			if r == 1 {
				return Undefined
			}
			return 0
		}, func(r int) int { return 10 - r }, [][]int{{3, 2, 0}, nil, {3, 2, 0}, {3, 2, 0}}},
	}
	url := startNATS(t)
	for _, dp := range dataPlanes {
		t.Run(dp.name, func(t *testing.T) {
			comms := planeGroup(t, url, 4, dp.mod)
			for _, tc := range cases {
				fds := fdCount(t)
				kids := splitAll(t, comms, tc.color, tc.key)
				if got := fdCount(t); got != fds {
					t.Errorf("%s: Split opened %d file descriptors", tc.name, got-fds)
				}
				for r, k := range kids {
					if (k == nil) != (tc.want[r] == nil) {
						t.Fatalf("%s: rank %d got child %v, want ranks %v", tc.name, r, k, tc.want[r])
					}
					if k != nil && (k.Size() != len(tc.want[r]) || tc.want[r][k.Rank()] != r) {
						t.Fatalf("%s: rank %d is rank %d of %d, want one of %v", tc.name, r, k.Rank(), k.Size(), tc.want[r])
					}
				}
				var live []*Comm
				for _, k := range kids {
					if k != nil {
						live = append(live, k)
					}
				}
				ctx := context.Background()
				mustAll(t, onAll(live, func(k *Comm) error {
					got, err := rootRanks(ctx, k)
					if err == nil && !slices.Equal(got, tc.want[k.share.rootRank(k.Rank())]) {
						err = fmt.Errorf("%s: members %v, want %v", tc.name, got, tc.want[k.share.rootRank(k.Rank())])
					}
					for round := 0; err == nil && round < 3; round++ {
						err = splitExchange(ctx, k, 1, round, 1+round*300)
					}
					if err == nil {
						err = checkSplitAllReduce(ctx, k)
					}
					return err
				}))
			}
			// Dup: the same ranks in the same order; the parent still works.
			dups := make([]*Comm, len(comms))
			mustAll(t, onAll(comms, func(c *Comm) error {
				d, err := c.Dup(context.Background())
				dups[c.Rank()] = d
				return err
			}))
			mustAll(t, onAll(dups, func(d *Comm) error {
				defer d.Close()
				if d.Rank() != d.share.rootRank(d.Rank()) || d.Size() != 4 {
					return fmt.Errorf("Dup: rank %d of %d", d.Rank(), d.Size())
				}
				return splitExchange(context.Background(), d, 2, 0, 50)
			}))
			mustAll(t, onAll(comms, func(c *Comm) error { return splitExchange(context.Background(), c, 3, 1, 50) }))
		})
	}
}

// checkSplitAllReduce sums every member's root rank + 1 over c.
func checkSplitAllReduce(ctx context.Context, c *Comm) error {
	members, err := rootRanks(ctx, c)
	if err != nil {
		return err
	}
	want := int64(0)
	for _, r := range members {
		want += int64(r + 1)
	}
	send := binary.LittleEndian.AppendUint64(nil, uint64(c.share.rootRank(c.Rank())+1))
	recv := make([]byte, 8)
	if err := c.AllReduce(ctx, send, recv, Int64, Sum); err != nil {
		return err
	}
	if got := int64(binary.LittleEndian.Uint64(recv)); got != want {
		return fmt.Errorf("AllReduce: %d, want %d", got, want)
	}
	return nil
}

// TestSplitConcurrent runs collectives on the parent and on both halves
// of a split at once, each from its own goroutine on every rank, with
// messages from a few bytes to two frames (BlockSize), and checks every
// byte: the frames of the three communicators share the streams.
func TestSplitConcurrent(t *testing.T) {
	url := startNATS(t)
	for _, dp := range dataPlanes {
		t.Run(dp.name, func(t *testing.T) {
			comms := planeGroup(t, url, 4, dp.mod)
			kids := splitAll(t, comms, func(r int) int { return r % 2 }, func(r int) int { return -r })
			dups := splitAll(t, comms, func(int) int { return 0 }, func(r int) int { return r })
			ctx := context.Background()
			const rounds = 6
			errs := make([]error, 3*len(comms))
			var wg sync.WaitGroup
			for r := range comms {
				wg.Go(func() {
					for k := 0; k < rounds && errs[3*r] == nil; k++ {
						errs[3*r] = splitExchange(ctx, comms[r], 4, k, []int{1, 8, 300}[k%3])
					}
				})
				wg.Go(func() {
					for k := 0; k < rounds && errs[3*r+1] == nil; k++ {
						if errs[3*r+1] = splitExchange(ctx, kids[r], 5, k, []int{300, 1, 8}[k%3]); errs[3*r+1] == nil {
							errs[3*r+1] = checkSplitAllReduce(ctx, kids[r])
						}
					}
				})
				wg.Go(func() {
					for k := 0; k < rounds && errs[3*r+2] == nil; k++ {
						if errs[3*r+2] = splitExchange(ctx, dups[r], 6, k, []int{8, 300, 1}[k%3]); errs[3*r+2] == nil {
							errs[3*r+2] = dups[r].Barrier(ctx)
						}
					}
				})
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("rank %d, %s: %v", i/3, []string{"parent", "half", "dup"}[i%3], err)
				}
			}
		})
	}
}

// TestSplitAbortScope: an abort inside one child fails that child on every
// member, while the parent and the other child go on.
func TestSplitAbortScope(t *testing.T) {
	url := startNATS(t)
	for _, dp := range dataPlanes {
		t.Run(dp.name, func(t *testing.T) {
			comms := planeGroup(t, url, 4, dp.mod)
			kids := splitAll(t, comms, func(r int) int { return r / 2 }, func(r int) int { return r })
			ctx := context.Background()
			cause := errors.New("give up")
			kids[0].Abort(cause)
			for _, r := range []int{0, 1} {
				ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := kids[r].Barrier(ctx)
				cancel()
				if !errors.Is(err, ErrAborted) {
					t.Errorf("rank %d in the aborted child: %v, want ErrAborted", r, err)
				}
			}
			mustAll(t, onAll(kids[2:], func(k *Comm) error { return splitExchange(ctx, k, 7, 0, 100) }))
			mustAll(t, onAll(comms, func(c *Comm) error {
				if err := splitExchange(ctx, c, 8, 0, 100); err != nil {
					return err
				}
				return checkSplitAllReduce(ctx, c)
			}))
			// Closing a child fails its peers' calls with ErrPeerLost, and
			// leaves the parent alone.
			kids[3].Close()
			ctx2, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := kids[2].Barrier(ctx2); !errors.Is(err, ErrPeerLost) {
				t.Errorf("Barrier after the peer closed the child: %v, want ErrPeerLost", err)
			}
			mustAll(t, onAll(comms, func(c *Comm) error { return c.Barrier(ctx) }))
		})
	}
}

// BenchmarkSplit times Split of 8 in-process ranks into 2 x 4 over shared
// memory, as seen by rank 0 (every rank calls it at once; the children are
// closed between iterations).
func BenchmarkSplit(b *testing.B) {
	url := startNATS(b)
	comms := group(b, url, 8, func(c *Config) {
		c.Transport = "shm"
		c.HeartbeatInterval, c.PeerTimeout = time.Second, 30*time.Second
	})
	ctx := context.Background()
	var took time.Duration
	for b.Loop() {
		errs := onAll(comms, func(c *Comm) error {
			start := time.Now()
			k, err := c.Split(ctx, c.Rank()/4, c.Rank())
			if c.Rank() == 0 {
				took += time.Since(start)
			}
			if err == nil {
				err = k.Barrier(ctx) // every rank has its child before any closes
				k.Close()
			}
			return err
		})
		for r, err := range errs {
			if err != nil {
				b.Fatalf("rank %d: %v", r, err)
			}
		}
	}
	b.ReportMetric(float64(took.Microseconds())/float64(b.N), "us/split")
}

// BenchmarkSplitChild compares a small AllToAllV on 2 in-process ranks
// (shm) on the communicator that joined, before any split (the
// transport's own Conns), after a Dup (every stream behind the
// demultiplexer, LL slots still its own), and on the Dup (frames only).
func BenchmarkSplitChild(b *testing.B) {
	url := startNATS(b)
	comms := group(b, url, 2, func(c *Config) {
		c.Transport = "shm"
		c.HeartbeatInterval, c.PeerTimeout = time.Second, 30*time.Second
	})
	ops := map[int]func(ctx context.Context, c *Comm, send, recv []byte) error{}
	for _, size := range []int{8, 64 << 10} {
		counts := []int{size, size}
		ops[size] = func(ctx context.Context, c *Comm, send, recv []byte) error {
			return c.AllToAllV(ctx, send, counts, recv, counts)
		}
		b.Run(fmt.Sprintf("parent-unshared/%d", size), func(b *testing.B) { benchRanks(b, comms, size, ops[size]) })
	}
	dups := make([]*Comm, 2)
	mustAllB(b, onAllB(comms, func(c *Comm) error {
		d, err := c.Dup(context.Background())
		dups[c.Rank()] = d
		return err
	}))
	defer func() {
		for _, d := range dups {
			d.Close()
		}
	}()
	for _, size := range []int{8, 64 << 10} {
		b.Run(fmt.Sprintf("parent-shared/%d", size), func(b *testing.B) { benchRanks(b, comms, size, ops[size]) })
		b.Run(fmt.Sprintf("child/%d", size), func(b *testing.B) { benchRanks(b, dups, size, ops[size]) })
	}
}
