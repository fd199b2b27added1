package a2a

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"
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
// segmented, with new contents each time.
func TestPersistentAllReduce(t *testing.T) {
	url := startNATS(t)
	comms := planeGroup(t, url, 3, dataPlanes[1].mod)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, elems := range []int{1, 1000, (allReduceSegment*2 + 4096) / 8} {
		mustAll(t, onAll(comms, func(c *Comm) error {
			in, out := make([]byte, 8*elems), make([]byte, 8*elems)
			p, err := c.AllReduceInit(in, out, Float64, Avg)
			if err != nil {
				return err
			}
			for k := range 20 {
				for i := range elems {
					binary.LittleEndian.PutUint64(in[8*i:], math.Float64bits(float64(3*(c.Rank()+k+i))))
				}
				if err := p.Start(ctx); err != nil {
					return err
				}
				if err := p.Wait(ctx); err != nil {
					return fmt.Errorf("%d elems, use %d: %w", elems, k, err)
				}
				for i := range elems {
					want := float64(3 * (1 + k + i)) // the mean of ranks 0..2
					if got := math.Float64frombits(binary.LittleEndian.Uint64(out[8*i:])); got != want {
						return fmt.Errorf("%d elems, use %d, [%d]: %v, want %v", elems, k, i, got, want)
					}
				}
			}
			return p.Close()
		}))
	}
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
