package a2a

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/algo"
)

// TestPersistentAllToAllV reuses one persistent AllToAllV for 1000 Starts
// with new contents each time, checks every byte, and counts the
// allocations of the Start-Wait pairs after the first on every rank.
func TestPersistentAllToAllV(t *testing.T) {
	url := startNATS(t)
	const ranks, uses = 3, 1000
	for _, dp := range dataPlanes {
		t.Run(dp.name, func(t *testing.T) {
			comms := planeGroup(t, url, ranks, func(c *Config) {
				dp.mod(c)
				c.HeartbeatInterval, c.PeerTimeout, c.Report = 10*time.Second, 30*time.Second, -1
			})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			allocs := make([]float64, ranks)
			mustAll(t, onAll(comms, func(c *Comm) error {
				r := c.Rank()
				sc, rc := make([]int, ranks), make([]int, ranks)
				for j := range ranks {
					sc[j], rc[j] = vCount(r, j, 1)+8, vCount(j, r, 1)+8 // small and large blocks: LL and frames
				}
				send, recv := make([]byte, sum(sc)), make([]byte, sum(rc))
				p, err := c.AllToAllVInit(send, sc, recv, rc)
				if err != nil {
					return err
				}
				defer p.Close()
				k := 0
				var bad error
				use := func() {
					for j, off := 0, 0; j < ranks; off, j = off+sc[j], j+1 {
						for b := range sc[j] {
							send[off+b] = pat(r, j, b+k)
						}
					}
					if err := p.Start(ctx); err != nil && bad == nil {
						bad = err
					}
					if err := p.Wait(ctx); err != nil && bad == nil {
						bad = fmt.Errorf("use %d: %w", k, err)
					}
					for j, off := 0, 0; j < ranks; off, j = off+rc[j], j+1 {
						for b := range rc[j] {
							if recv[off+b] != pat(j, r, b+k) && bad == nil {
								bad = fmt.Errorf("use %d: byte %d from %d", k, b, j)
							}
						}
					}
					k++
				}
				use() // the first: AllocsPerRun's warm-up is one more
				allocs[r] = testing.AllocsPerRun(uses-2, use)
				if bad == nil && p.direct != uses {
					bad = fmt.Errorf("%d of %d uses ran in a direct turn, want all", p.direct, uses)
				}
				return bad
			}))
			for r, a := range allocs {
				if a != 0 {
					t.Errorf("rank %d: %v allocations per Start-Wait, want 0", r, a)
				}
			}
		})
	}
}

// TestPersistentAllReduce reuses persistent AllReduces, small (LL) and
// segmented (at 3 ranks), with new contents each time, on 2 and 3 ranks
// over shm. A small one at 2 ranks runs the LL round resolved at Init (one
// round); at 3 the LL tree's rounds run the schedule.
func TestPersistentAllReduce(t *testing.T) {
	url := startNATS(t)
	for _, tc := range []struct {
		ranks int
		elems []int
	}{
		{2, []int{1, 1000}},
		{3, []int{1, 1000, (allReduceSegment*2 + 4096) / 8}},
	} {
		t.Run(fmt.Sprint(tc.ranks, "ranks"), func(t *testing.T) {
			comms := planeGroup(t, url, tc.ranks, dataPlanes[1].mod)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for _, elems := range tc.elems {
				mustAll(t, onAll(comms, func(c *Comm) error {
					return persistentAvg(ctx, c, elems)
				}))
			}
		})
	}
}

// persistentAvg runs 20 uses of a persistent Avg AllReduce of elems float64
// elements with new contents, checks every element, and checks when the LL
// round was resolved.
func persistentAvg(ctx context.Context, c *Comm, elems int) error {
	in, out := make([]byte, 8*elems), make([]byte, 8*elems)
	p, err := c.AllReduceInit(in, out, Float64, Avg)
	if err != nil {
		return err
	}
	n := c.Size()
	if p.ll != nil && (n != 2 || p.algo != algo.AlgoLL) || p.ll == nil && n == 2 && elems == 1 && runtime.NumCPU() >= 2 {
		return fmt.Errorf("%d ranks, %d elems (%s): resolved LL round %v", n, elems, p.algo, p.ll != nil)
	}
	for k := range 20 {
		for i := range elems {
			binary.LittleEndian.PutUint64(in[8*i:], math.Float64bits(float64(2*3*(c.Rank()+k+i))))
		}
		if err := p.Start(ctx); err != nil {
			return err
		}
		if err := p.Wait(ctx); err != nil {
			return fmt.Errorf("%d elems, use %d: %w", elems, k, err)
		}
		for i := range elems {
			want := float64(2*3*(k+i) + 3*(n-1)) // the mean of 6(r+k+i) over ranks 0..n-1
			if got := math.Float64frombits(binary.LittleEndian.Uint64(out[8*i:])); got != want {
				return fmt.Errorf("%d elems, use %d, [%d]: %v, want %v", elems, k, i, got, want)
			}
		}
	}
	return p.Close()
}

// TestPersistentMisuse: Start twice, Close while started, Start after Close.
func TestPersistentMisuse(t *testing.T) {
	url := startNATS(t)
	comms := planeGroup(t, url, 2, dataPlanes[0].mod)
	ctx := context.Background()
	if _, err := comms[0].AllToAllVInit(make([]byte, 4), []int{4, 4}, make([]byte, 8), []int{4, 4}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Init with short send: %v", err)
	}
	mustAll(t, onAll(comms, func(c *Comm) error {
		p, err := c.AllToAllVInit(make([]byte, 8), []int{4, 4}, make([]byte, 8), []int{4, 4})
		if err != nil {
			return err
		}
		if err := p.Start(ctx); err != nil {
			return err
		}
		if err := p.Start(ctx); !errors.Is(err, ErrInvalidArgument) {
			return fmt.Errorf("second Start: %v", err)
		}
		if err := p.Close(); !errors.Is(err, ErrInvalidArgument) {
			return fmt.Errorf("Close while started: %v", err)
		}
		if err := p.Wait(ctx); err != nil {
			return err
		}
		if err := p.Close(); err != nil {
			return err
		}
		if err := p.Start(ctx); !errors.Is(err, ErrInvalidArgument) {
			return fmt.Errorf("Start after Close: %v", err)
		}
		return nil
	}))
}
