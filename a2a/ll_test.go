package a2a

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestLL runs AllToAllV through the LL epoch/slot protocol: forced over shm
// and over TCP (frames), and under auto selection where small blocks go LL
// and larger ones by frames in the same call. Many back-to-back calls with
// sizes changing every call show that no rank takes a previous epoch's data.
func TestLL(t *testing.T) {
	url := startNATS(t)
	for _, tc := range []struct {
		name      string
		n         int
		algo      string
		transport string
		llBytes   int
		wantAlgo  string // LastAlgo after an exchange of small blocks
	}{
		{"ll-shm", 4, "ll", "", 0, "ll"},
		{"ll-tcp", 3, "ll", "tcp", 0, "ll"},
		{"auto-shm", 3, "", "", 64, "ll"},
		{"auto-shm-off", 3, "", "", -1, ""},
		{"forced-fullmesh", 3, "fullmesh", "", 0, "fullmesh"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := group(t, url, tc.n, func(c *Config) {
				c.Algo, c.Transport, c.LLBytes = tc.algo, tc.transport, tc.llBytes
			})
			rng := rand.New(rand.NewPCG(uint64(tc.n), 11))
			for i := range 60 {
				m := make([]int, tc.n*tc.n)
				for k := range m {
					switch i % 3 {
					case 0:
						m[k] = rng.IntN(40) // all LL
					case 1:
						m[k] = rng.IntN(300) // some above the auto cutoff of 64
					default:
						m[k] = rng.IntN(9000) // some above the slot
					}
				}
				exchange(t, comms, m, i%4 == 3)
			}
			exchange(t, comms, matrixOf("giant", tc.n, rng), false)
			exchange(t, comms, matrixOf("uniform", tc.n, rng), false)
			small := make([]int, tc.n*tc.n)
			for k := range small {
				small[k] = 24
			}
			exchange(t, comms, small, false)
			if tc.wantAlgo != "" {
				for _, c := range comms {
					if got := c.LastAlgo(); got != tc.wantAlgo {
						t.Errorf("rank %d ran %s, want %s", c.Rank(), got, tc.wantAlgo)
					}
				}
			} else if got := comms[0].LastAlgo(); got == "ll" {
				t.Errorf("LL with LLBytes < 0 under auto selection")
			}
		})
	}
}

// TestLLMismatch: ranks that disagree on a block's length, or run different
// operations, fail with ErrMismatch in the LL round instead of hanging or
// delivering wrong data.
func TestLLMismatch(t *testing.T) {
	url := startNATS(t)
	for _, tc := range []struct {
		name      string
		algo      string
		transport string
		sent, exp int // rank 1 sends rank 0 sent bytes; rank 0 expects exp
	}{
		{"shm-small-small", "ll", "", 10, 12},
		{"shm-small-large", "ll", "", 10, 9000},
		{"shm-large-small", "ll", "", 9000, 10},
		{"shm-large-large", "ll", "", 9000, 9001},
		{"tcp-small-small", "ll", "tcp", 10, 12},
		{"tcp-small-large", "ll", "tcp", 10, 9000},
		// Under auto, TCP peers are quiet (no length announcement for a
		// larger block): the frame headers catch every disagreement.
		{"auto-tcp-small-small", "", "tcp", 10, 12},
		{"auto-tcp-small-large", "", "tcp", 10, 9000},
		{"auto-tcp-large-small", "", "tcp", 9000, 10},
		{"auto-tcp-large-large", "", "tcp", 9000, 9001},
		// Under auto, shm peers are quiet too: the receiver of frames
		// watches the sender's slot, a Load sees a frame.
		{"auto-shm-small-small", "", "", 10, 12},
		{"auto-shm-small-large", "", "", 10, 9000},
		{"auto-shm-large-small", "", "", 9000, 10},
		{"auto-shm-large-large", "", "", 9000, 9001},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := group(t, url, 2, func(c *Config) { c.Algo, c.Transport = tc.algo, tc.transport })
			start := time.Now()
			errs := onAll(comms, func(c *Comm) error {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				sc, rc := []int{0, 0}, []int{0, 0}
				if c.Rank() == 1 {
					sc[0] = tc.sent
				} else {
					rc[1] = tc.exp
				}
				return c.AllToAllV(ctx, make([]byte, sum(sc)), sc, make([]byte, sum(rc)), rc)
			})
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("released after %v", d)
			}
			if !errors.Is(errs[0], ErrMismatch) {
				t.Errorf("rank 0: %v, want ErrMismatch", errs[0])
			}
			// Rank 1 may finish first, learn of the abort, or see its frame
			// rejected (shm tells the sender).
			if errs[1] != nil && !errors.Is(errs[1], ErrAborted) && !errors.Is(errs[1], ErrMismatch) {
				t.Errorf("rank 1: %v, want nil, ErrAborted or ErrMismatch", errs[1])
			}
		})
	}
	t.Run("different-operations", func(t *testing.T) {
		comms := group(t, url, 2, func(c *Config) { c.Algo = "ll" })
		errs := onAll(comms, func(c *Comm) error {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if c.Rank() == 0 {
				return c.AllReduce(ctx, make([]byte, 8), make([]byte, 8), Float32, Sum)
			}
			return c.AllToAll(ctx, make([]byte, 8), make([]byte, 8))
		})
		for r, err := range errs {
			if !errors.Is(err, ErrMismatch) && !errors.Is(err, ErrAborted) {
				t.Errorf("rank %d: %v, want ErrMismatch or ErrAborted", r, err)
			}
		}
		if !errors.Is(errs[0], ErrMismatch) && !errors.Is(errs[1], ErrMismatch) {
			t.Errorf("no rank saw the mismatch: %v", errs)
		}
	})
}

// BenchmarkLL compares the LL protocol with ring frames for small blocks on
// shared memory (in-process ranks; `a2ad bench` measures processes).
func BenchmarkLL(b *testing.B) {
	url := startNATS(b)
	for _, algo := range []string{"ll", "fullmesh"} {
		for _, n := range []int{2, 4} {
			comms := group(b, url, n, func(c *Config) { c.Algo = algo })
			for _, size := range []int{8, 1024, 4096, 8192} {
				b.Run(fmt.Sprintf("%s/n%d/%dB", algo, n, size), func(b *testing.B) {
					benchRanks(b, comms, size, allToAll)
				})
			}
		}
	}
}

func allToAll(ctx context.Context, c *Comm, send, recv []byte) error {
	return c.AllToAll(ctx, send, recv)
}

// TestSetAlgo switches one communicator between algorithms between calls:
// each call runs the one set (forced fullmesh without LL blocks, forced ll,
// back to auto, which sends these small blocks LL over shm), every exchange
// verified, and a bad name is refused.
func TestSetAlgo(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 3, nil)
	small := make([]int, 9)
	for k := range small {
		small[k] = 24
	}
	for _, algo := range []string{"", "fullmesh", "ll", "pairwise", "auto", "fullmesh"} {
		mustAll(t, onAll(comms, func(c *Comm) error { return c.SetAlgo(algo) }))
		exchange(t, comms, small, false)
		want := algo
		if algo == "" || algo == "auto" {
			want = "ll" // auto: blocks under LLBytes go LL over shm
		}
		for _, c := range comms {
			if got := c.LastAlgo(); got != want {
				t.Errorf("SetAlgo(%q): rank %d ran %s, want %s", algo, c.Rank(), got, want)
			}
		}
	}
	if err := comms[0].SetAlgo("bogus"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("SetAlgo(bogus): %v, want ErrInvalidArgument", err)
	}
}

// TestSetAlgoMatchesJoin: after SetAlgo, Barrier and a small AllReduce
// run as on a Comm that joined with that algorithm (a forced one other
// than ll turns their LL round off, auto and ll turn it on), whichever one
// the Comm joined with, and over several switches back and forth.
func TestSetAlgoMatchesJoin(t *testing.T) {
	url := startNATS(t)
	const lls, none = "ll/ll", "dissemination/recdoubling"
	for _, tc := range []struct {
		joined string
		sets   []string // SetAlgo before each step ("-": none)
		want   []string // Barrier's and then an 8-byte AllReduce's algorithm
	}{
		{joined: "pairwise", sets: []string{"-", "", "fullmesh", "ll", "pairwise", "auto"}, want: []string{none, lls, none, lls, none, lls}},
		{joined: "", sets: []string{"-", "fullmesh", "", "staged", "ll"}, want: []string{lls, none, lls, none, lls}},
	} {
		t.Run("joined="+tc.joined, func(t *testing.T) {
			comms := group(t, url, 4, func(c *Config) { c.Algo = tc.joined })
			for step, set := range tc.sets {
				mustAll(t, onAll(comms, func(c *Comm) error {
					if set != "-" {
						if err := c.SetAlgo(set); err != nil {
							return err
						}
					}
					ctx := context.Background()
					if err := c.Barrier(ctx); err != nil {
						return err
					}
					barrier := c.LastAlgo()
					send, recv := binary.LittleEndian.AppendUint64(nil, uint64(c.Rank()+1)), make([]byte, 8)
					if err := c.AllReduce(ctx, send, recv, Int64, Sum); err != nil {
						return err
					}
					if got := binary.LittleEndian.Uint64(recv); got != 10 {
						return fmt.Errorf("step %d, SetAlgo(%q): AllReduce gave %d, want 10", step, set, got)
					}
					if got := barrier + "/" + c.LastAlgo(); got != tc.want[step] {
						return fmt.Errorf("step %d, SetAlgo(%q): Barrier/AllReduce ran %s, want %s", step, set, got, tc.want[step])
					}
					return nil
				}))
			}
		})
	}
}

// TestAlgoAutoIsDefault: Config.Algo "auto" is the automatic choice, the
// same as "": small blocks go LL over shm (forced algorithms turn LL off).
func TestAlgoAutoIsDefault(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 3, func(c *Config) { c.Algo = "auto" })
	small := make([]int, 9)
	for k := range small {
		small[k] = 24
	}
	exchange(t, comms, small, false)
	for _, c := range comms {
		if got := c.LastAlgo(); got != "ll" || c.Config().Algo != "" {
			t.Errorf("rank %d: Algo \"auto\" ran %s, config %q; want ll, as \"\" does", c.Rank(), got, c.Config().Algo)
		}
	}
}

// TestQuietLLMismatchManyRanks: with quiet peers (TCP, and shm under auto) a pair may disagree
// about whether a block goes by LL (within the cutoff) or by frames, with
// fullmesh's windows in between; the first frame the other side receives
// shows it, and every rank is released with ErrMismatch or ErrAborted
// within the first round's time, not the timeout.
func TestQuietLLMismatchManyRanks(t *testing.T) {
	for _, transport := range []string{"tcp", "shm"} {
		t.Run(transport, func(t *testing.T) { testQuietLLMismatchManyRanks(t, transport) })
	}
}

func testQuietLLMismatchManyRanks(t *testing.T, transport string) {
	url := startNATS(t)
	const n = 12 // three fullmesh windows of 4 peers
	// Twelve ranks in one process on a loaded machine may miss a 1 s
	// heartbeat; this test is about the mismatch, not about loss.
	setup := func(c *Config) { patient(c); c.Transport, c.Window = transport, 4 }
	comms := group(t, url, n, setup)
	for _, tc := range []struct{ sent, exp int }{{10, 9000}, {9000, 10}, {1 << 20, 10}} {
		start := time.Now()
		errs := onAll(comms, func(c *Comm) error {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			sc, rc := make([]int, n), make([]int, n)
			for j := range n {
				if j != c.Rank() {
					sc[j], rc[j] = 9000, 9000
				}
			}
			if c.Rank() == 1 {
				sc[0] = tc.sent
			}
			if c.Rank() == 0 {
				rc[1] = tc.exp
			}
			return c.AllToAllV(ctx, make([]byte, sum(sc)), sc, make([]byte, sum(rc)), rc)
		})
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%d sent, %d expected: released after %v", tc.sent, tc.exp, d)
		}
		mismatch := false
		for r, err := range errs {
			mismatch = mismatch || errors.Is(err, ErrMismatch)
			if err != nil && !errors.Is(err, ErrMismatch) && !errors.Is(err, ErrAborted) {
				t.Errorf("%d sent, %d expected: rank %d: %v, want nil, ErrMismatch or ErrAborted", tc.sent, tc.exp, r, err)
			}
		}
		if !mismatch {
			t.Errorf("%d sent, %d expected: no rank saw the mismatch: %v", tc.sent, tc.exp, errs)
		}
		comms = group(t, url, n, setup) // the mismatch aborted the group
	}
}

// TestLLAllReduceBound: the largest AllReduce sent by LL is llAllReduceBytes
// over packed slots, llAllReduceWordBytes as soon as one peer's slots take
// the word form, and never more than a peer's cutoff less the 8-byte
// signature; this rank's own entry does not count.
func TestLLAllReduceBound(t *testing.T) {
	all := func(int) bool { return true }
	for _, tc := range []struct {
		name   string
		cut    []int // rank 0 is this rank
		packed func(peer int) bool
		want   int
	}{
		{"packed, 4 KiB slots", []int{-1, 4096, 4096}, all, 4088},
		{"packed, a 1 KiB cutoff", []int{-1, 4096, 1024}, all, 1016},
		{"one peer in the word form", []int{-1, 4096, 512}, func(p int) bool { return p != 2 }, llAllReduceWordBytes},
		{"word form, a 64 B cutoff", []int{-1, 64}, func(int) bool { return false }, 56},
		{"this rank alone", []int{-1}, func(int) bool { return false }, llAllReduceBytes},
	} {
		if got := llAllReduceBound(0, tc.cut, tc.packed); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	if !ClassCapabilities("shm").PackedSlots || ClassCapabilities("verbs").PackedSlots || ClassCapabilities("tcp").PackedSlots {
		t.Error("only shm's slots are packed")
	}
}
