package a2a

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/reduce"
)

// input is rank r's deterministic input of n elements of dt: small integers
// (and halves for Prod), so float reductions are exact in any order.
func input(dt DType, op Op, r, n int) []byte {
	b := make([]byte, n*dt.Size())
	rng := rand.New(rand.NewPCG(uint64(r), uint64(n)))
	for i := range n {
		v := float64(rng.IntN(7) - 3)
		if op == Prod {
			v = []float64{1, -1, 2, 0.5}[rng.IntN(4)]
		}
		off := i * dt.Size()
		switch dt {
		case Float32:
			binary.LittleEndian.PutUint32(b[off:], math.Float32bits(float32(v)))
		case Float64:
			binary.LittleEndian.PutUint64(b[off:], math.Float64bits(v))
		case BFloat16:
			binary.LittleEndian.PutUint16(b[off:], reduce.F32ToBF16(float32(v)))
		case Float16:
			binary.LittleEndian.PutUint16(b[off:], reduce.F32ToF16(float32(v)))
		case Int32:
			binary.LittleEndian.PutUint32(b[off:], uint32(int32(rng.Int32())))
		case Int64:
			binary.LittleEndian.PutUint64(b[off:], rng.Uint64())
		case Uint8:
			b[off] = byte(rng.Uint32())
		}
	}
	return b
}

// reference reduces the inputs of ranks 0..p-1 sequentially.
func reference(t *testing.T, dt DType, op Op, p, n int) []byte {
	t.Helper()
	kop := op
	if op == Avg {
		kop = Sum
	}
	ref := input(dt, op, 0, n)
	for r := 1; r < p; r++ {
		if err := reduce.Reduce(dt, kop, ref, input(dt, op, r, n)); err != nil {
			t.Fatal(err)
		}
	}
	if op == Avg {
		if err := reduce.Finish(dt, Avg, ref, p); err != nil {
			t.Fatal(err)
		}
	}
	return ref
}

func TestReductionCollectives(t *testing.T) {
	url := startNATS(t)
	dtypes := []DType{Float32, Float64, BFloat16, Float16, Int32, Int64, Uint8}
	ops := []Op{Sum, Prod, Max, Min, Avg}
	for _, p := range []int{1, 2, 3, 5} {
		comms := group(t, url, p, nil)
		for _, dt := range dtypes {
			for _, op := range ops {
				for _, n := range []int{0, 1, 7, 1000} {
					name := fmt.Sprintf("p%d/%s/%s/%d", p, dt, op, n)
					ref := reference(t, dt, op, p, n)
					mustAll(t, onAll(comms, func(c *Comm) error {
						ctx := context.Background()
						r := c.Rank()
						in := input(dt, op, r, n)
						out := make([]byte, len(in))
						if err := c.AllReduce(ctx, in, out, dt, op); err != nil {
							return fmt.Errorf("%s allreduce: %w", name, err)
						}
						if !bytes.Equal(out, ref) {
							return fmt.Errorf("%s allreduce differs from the sequential reference", name)
						}
						inPlace := input(dt, op, r, n)
						if err := c.AllReduce(ctx, inPlace, inPlace, dt, op); err != nil || !bytes.Equal(inPlace, ref) {
							return fmt.Errorf("%s in-place allreduce: %v", name, err)
						}
						root := n % p
						var rout []byte
						if r == root {
							rout = make([]byte, len(in))
						}
						if err := c.Reduce(ctx, in, rout, dt, op, root); err != nil {
							return fmt.Errorf("%s reduce: %w", name, err)
						}
						if r == root && !bytes.Equal(rout, ref) {
							return fmt.Errorf("%s reduce to %d differs", name, root)
						}
						// ReduceScatter of p blocks of n elements.
						big := make([]byte, 0, p*len(in))
						for b := range p {
							big = append(big, input(dt, op, r*p+b, n)...)
						}
						rs := make([]byte, len(in))
						if err := c.ReduceScatter(ctx, big, rs, dt, op); err != nil {
							return fmt.Errorf("%s reducescatter: %w", name, err)
						}
						want := input(dt, op, r, n) // block r of every rank: inputs (i*p + r)
						kop := op
						if op == Avg {
							kop = Sum
						}
						copy(want, input(dt, op, r, n))
						want = input(dt, op, 0*p+r, n)
						for i := 1; i < p; i++ {
							reduce.Reduce(dt, kop, want, input(dt, op, i*p+r, n))
						}
						if op == Avg {
							reduce.Finish(dt, Avg, want, p)
						}
						if !bytes.Equal(rs, want) {
							return fmt.Errorf("%s reducescatter block %d differs", name, r)
						}
						return nil
					}))
				}
			}
		}
	}
}

func TestDataCollectives(t *testing.T) {
	url := startNATS(t)
	for _, p := range []int{1, 2, 3, 4, 7} {
		comms := group(t, url, p, nil)
		for _, n := range []int{0, 1, 13, 70000} {
			mustAll(t, onAll(comms, func(c *Comm) error {
				ctx := context.Background()
				r := c.Rank()
				block := func(rank, n int) []byte {
					b := make([]byte, n)
					for k := range b {
						b[k] = pat(rank, 99, k)
					}
					return b
				}
				// AllGather
				all := make([]byte, p*n)
				if err := c.AllGather(ctx, block(r, n), all); err != nil {
					return err
				}
				for i := range p {
					if !bytes.Equal(all[i*n:(i+1)*n], block(i, n)) {
						return fmt.Errorf("allgather n=%d block %d", n, i)
					}
				}
				// AllGatherV with uneven counts
				counts := make([]int, p)
				total := 0
				for i := range counts {
					counts[i] = (n + i*3) % 50
					total += counts[i]
				}
				allv := make([]byte, total)
				if err := c.AllGatherV(ctx, block(r, counts[r]), allv, counts); err != nil {
					return err
				}
				off := 0
				for i := range p {
					if !bytes.Equal(allv[off:off+counts[i]], block(i, counts[i])) {
						return fmt.Errorf("allgatherv block %d", i)
					}
					off += counts[i]
				}
				for root := range p {
					// Broadcast
					buf := make([]byte, n)
					if r == root {
						copy(buf, block(root, n))
					}
					if err := c.Broadcast(ctx, buf, root); err != nil {
						return err
					}
					if !bytes.Equal(buf, block(root, n)) {
						return fmt.Errorf("broadcast from %d n=%d", root, n)
					}
					// Gather / Scatter
					var g []byte
					if r == root {
						g = make([]byte, p*n)
					}
					if err := c.Gather(ctx, block(r, n), g, root); err != nil {
						return err
					}
					if r == root && !bytes.Equal(g, all) {
						return fmt.Errorf("gather at %d", root)
					}
					sc := make([]byte, n)
					var src []byte
					if r == root {
						src = all
					}
					if err := c.Scatter(ctx, src, sc, root); err != nil {
						return err
					}
					if !bytes.Equal(sc, block(r, n)) {
						return fmt.Errorf("scatter from %d", root)
					}
					// GatherV / ScatterV
					var gv []byte
					var gc []int
					if r == root {
						gv, gc = make([]byte, total), counts
					}
					if err := c.GatherV(ctx, block(r, counts[r]), gv, gc, root); err != nil {
						return err
					}
					if r == root && !bytes.Equal(gv, allv) {
						return fmt.Errorf("gatherv at %d", root)
					}
					sv := make([]byte, counts[r])
					var svSrc []byte
					var svCounts []int
					if r == root {
						svSrc, svCounts = allv, counts
					}
					if err := c.ScatterV(ctx, svSrc, svCounts, sv, root); err != nil {
						return err
					}
					if !bytes.Equal(sv, block(r, counts[r])) {
						return fmt.Errorf("scatterv from %d", root)
					}
				}
				return c.Barrier(ctx)
			}))
		}
	}
}

func TestSendRecvAndTypedHelpers(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 3, nil)
	mustAll(t, onAll(comms, func(c *Comm) error {
		ctx := context.Background()
		r := c.Rank()
		next, prev := (r+1)%3, (r+2)%3
		// A ring of messages of different sizes; even ranks send first.
		msg := bytes.Repeat([]byte{byte(r + 1)}, 1000*(r+1))
		got := make([]byte, 5000)
		var n int
		var err error
		if r%2 == 0 {
			if err = c.Send(ctx, msg, next, 7); err == nil {
				n, err = c.Recv(ctx, got, prev, 7)
			}
		} else {
			if n, err = c.Recv(ctx, got, prev, 7); err == nil {
				err = c.Send(ctx, msg, next, 7)
			}
		}
		if err != nil {
			return err
		}
		if want := bytes.Repeat([]byte{byte(prev + 1)}, 1000*(prev+1)); !bytes.Equal(got[:n], want) {
			return fmt.Errorf("recv from %d: %d bytes", prev, n)
		}
		// Typed helpers on float32 and int64 slices.
		f := []float32{float32(r), 1.5, -2}
		if err := AllReduceSlice(ctx, c, f, f, Sum); err != nil {
			return err
		}
		if f[0] != 3 || f[1] != 4.5 || f[2] != -6 {
			return fmt.Errorf("AllReduceSlice: %v", f)
		}
		g := make([]int64, 6)
		if err := AllGatherSlice(ctx, c, []int64{int64(r), int64(-r)}, g); err != nil {
			return err
		}
		if g[4] != 2 || g[5] != -2 {
			return fmt.Errorf("AllGatherSlice: %v", g)
		}
		b := []float64{0, 0}
		if r == 2 {
			b = []float64{math.Pi, math.E}
		}
		if err := BroadcastSlice(ctx, c, b, 2); err != nil || b[0] != math.Pi {
			return fmt.Errorf("BroadcastSlice: %v %v", b, err)
		}
		return nil
	}))
}

func TestCollectiveMisuse(t *testing.T) {
	url := startNATS(t)
	f := func(n int) []byte { return make([]byte, n) }
	cases := []struct {
		name string
		call func(c *Comm) error // rank 1 misbehaves, the others call correctly
		kind error
	}{
		{"wrong recv length", func(c *Comm) error {
			if c.Rank() == 1 {
				return c.AllReduce(context.Background(), f(16), f(12), Float32, Sum)
			}
			return c.AllReduce(context.Background(), f(16), f(16), Float32, Sum)
		}, ErrInvalidArgument},
		{"length not a whole number of elements", func(c *Comm) error {
			n := 16
			if c.Rank() == 1 {
				n = 14
			}
			return c.AllReduce(context.Background(), f(n), f(n), Float32, Sum)
		}, ErrInvalidArgument},
		{"root out of range", func(c *Comm) error {
			root := 0
			if c.Rank() == 1 {
				root = 3
			}
			return c.Broadcast(context.Background(), f(8), root)
		}, ErrInvalidArgument},
		{"different roots", func(c *Comm) error {
			return c.Broadcast(context.Background(), f(8), min(c.Rank(), 1))
		}, ErrMismatch},
		{"different ops", func(c *Comm) error {
			op := Sum
			if c.Rank() == 1 {
				op = Max
			}
			return c.AllReduce(context.Background(), f(64), f(64), Float32, op)
		}, ErrMismatch},
		{"different dtypes", func(c *Comm) error {
			dt := Float32
			if c.Rank() == 1 {
				dt = Int32
			}
			return c.AllReduce(context.Background(), f(64), f(64), dt, Sum)
		}, ErrMismatch},
		{"different collectives", func(c *Comm) error {
			if c.Rank() == 1 {
				return c.AllGather(context.Background(), f(8), f(24))
			}
			return c.Barrier(context.Background())
		}, ErrMismatch},
		{"wrong tag", func(c *Comm) error {
			switch c.Rank() {
			case 0:
				return c.Send(context.Background(), f(8), 1, 1)
			case 1:
				_, err := c.Recv(context.Background(), f(8), 0, 2)
				return err
			}
			return nil
		}, ErrMismatch},
		{"receive buffer too small", func(c *Comm) error {
			switch c.Rank() {
			case 0:
				return c.Send(context.Background(), f(9), 1, 1)
			case 1:
				_, err := c.Recv(context.Background(), f(8), 0, 1)
				return err
			}
			return nil
		}, ErrMismatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			comms := group(t, url, 3, nil)
			start := time.Now()
			errs := onAll(comms, func(c *Comm) error {
				return tc.call(c)
			})
			if time.Since(start) > 10*time.Second {
				t.Errorf("took %v", time.Since(start))
			}
			if !errors.Is(errs[1], tc.kind) && !errors.Is(errs[0], tc.kind) {
				t.Errorf("errors %v, want %v on the misbehaving pair", errs, tc.kind)
			}
			for r, err := range errs {
				if err != nil && !errors.Is(err, tc.kind) && !errors.Is(err, ErrAborted) {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// TestSegmentedAllReduce covers AllReduces larger than allReduceSegment, which
// run as consecutive segment AllReduces (sizes not a multiple of it, in place,
// Avg divided once).
func TestSegmentedAllReduce(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 3, nil)
	for _, tc := range []struct {
		dt DType
		op Op
		n  int // elements
	}{{Float32, Sum, allReduceSegment/4*2 + 37}, {Int64, Avg, allReduceSegment/8*3 + 5}, {Float64, Max, allReduceSegment / 8}} {
		ref := reference(t, tc.dt, tc.op, 3, tc.n)
		mustAll(t, onAll(comms, func(c *Comm) error {
			in := input(tc.dt, tc.op, c.Rank(), tc.n)
			out := make([]byte, len(in))
			if err := c.AllReduce(context.Background(), in, out, tc.dt, tc.op); err != nil {
				return err
			}
			if !bytes.Equal(out, ref) {
				return fmt.Errorf("%s %s n=%d differs from the reference", tc.dt, tc.op, tc.n)
			}
			if err := c.AllReduce(context.Background(), in, in, tc.dt, tc.op); err != nil || !bytes.Equal(in, ref) {
				return fmt.Errorf("%s %s n=%d in place: %v", tc.dt, tc.op, tc.n, err)
			}
			return nil
		}))
	}
}

// TestAllReduceLL: on one host a small AllReduce is one LL round (the
// reduction order the same on every rank, so results are bit-identical),
// a larger one is not, and forcing ll on a size no slot carries falls back.
func TestAllReduceLL(t *testing.T) {
	url := startNATS(t)
	for _, c := range []struct {
		name    string
		forced  string
		llBytes int // Config.LLBytes
		n       int // float32 elements
		wantLL  bool
	}{
		{"8 B", "", 0, 2, true},
		{"256 B", "", 0, 64, true},
		{"2 KiB", "", 0, 512, true},
		// The 8-byte signature does not fit a 4 KiB slot after 4 KiB.
		{"4 KiB", "", 0, 1024, false},
		{"forced, 4 KiB", "ll", 0, 1024, false},
		{"forced, 8 B", "ll", 0, 2, true},
		// The message carries an 8-byte signature after the data.
		{"64 B with a 64 B LL cutoff", "", 64, 16, false},
		{"56 B with a 64 B LL cutoff", "", 64, 14, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			logs := make([]*eventLog, 3)
			comms := group(t, url, 3, func(cfg *Config) {
				logs[cfg.Rank] = &eventLog{}
				cfg.Observer, cfg.AlgoAllReduce, cfg.LLBytes = logs[cfg.Rank], c.forced, c.llBytes
			})
			ref := reference(t, Float32, Sum, 3, c.n)
			mustAll(t, onAll(comms, func(cm *Comm) error {
				in := input(Float32, Sum, cm.Rank(), c.n)
				if err := cm.AllReduce(context.Background(), in, in, Float32, Sum); err != nil {
					return err
				}
				if !bytes.Equal(in, ref) {
					return fmt.Errorf("rank %d: result differs from the reference", cm.Rank())
				}
				return nil
			}))
			for r, l := range logs {
				ev, ok := l.last("allreduce")
				if !ok || (ev.Algo == "ll") != c.wantLL {
					t.Errorf("rank %d ran %q (reported %v), want ll %v", r, ev.Algo, ok, c.wantLL)
				}
			}
		})
	}
}

// TestAllReduceLLTwoRanksMismatch: at 2 ranks the LL AllReduce reduces the
// peer's input as it arrives; the signature after it is checked first, so
// ranks running different reductions of one size fail with ErrMismatch
// instead of reducing the other's input.
func TestAllReduceLLTwoRanksMismatch(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 2, nil)
	errs := onAll(comms, func(c *Comm) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		op := Sum
		if c.Rank() == 1 {
			op = Max
		}
		in := input(Float32, op, c.Rank(), 2)
		return c.AllReduce(ctx, in, make([]byte, len(in)), Float32, op)
	})
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) {
			t.Errorf("rank %d: %v, want ErrMismatch", r, err)
		}
	}
	if got := comms[0].LastAlgo(); got != "ll" {
		t.Errorf("ran %q, want ll", got)
	}
}
