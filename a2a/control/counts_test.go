package control

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// randomMatrix returns an n x n row-major matrix with some zero rows/entries.
func randomMatrix(rng *rand.Rand, n int) []int {
	m := make([]int, n*n)
	zeroRow := -1
	if rng.IntN(3) == 0 {
		zeroRow = rng.IntN(n)
	}
	for i := range m {
		switch {
		case i/n == zeroRow, rng.IntN(4) == 0:
		case rng.IntN(10) == 0:
			m[i] = 1<<40 + rng.IntN(1000) // beyond 32 bits
		default:
			m[i] = rng.IntN(1 << 20)
		}
	}
	return m
}

func TestExchangeCounts(t *testing.T) {
	for _, tc := range []struct {
		world   int
		service bool
		seqs    int
	}{
		{1, true, 5},
		{2, true, 60},
		{3, false, 40},
		{5, true, 40},
		{8, false, 20},
	} {
		t.Run(fmt.Sprintf("world=%d service=%v", tc.world, tc.service), func(t *testing.T) {
			e := newEnv(t)
			if tc.service {
				e.service()
			}
			ranks := make([]int, tc.world)
			for i := range ranks {
				ranks[i] = i
			}
			mems := e.mustJoin(configs("gc", ranks, nil))
			rng := rand.New(rand.NewPCG(uint64(tc.world), 7))
			mats := make([][]int, tc.seqs)
			for s := range mats {
				mats[s] = randomMatrix(rng, tc.world)
			}
			n := tc.world
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for _, m := range mems {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := m.Rank()
					recv := make([]int, n)
					for s, mat := range mats {
						var full []int
						if (s+r)%2 == 0 { // only some ranks ask for the matrix
							full = make([]int, n*n)
						}
						if err := m.ExchangeCounts(ctx, uint64(s+1), mat[r*n:(r+1)*n], recv, full); err != nil {
							errs <- fmt.Errorf("rank %d seq %d: %w", r, s+1, err)
							return
						}
						for i := 0; i < n; i++ {
							if recv[i] != mat[i*n+r] {
								errs <- fmt.Errorf("rank %d seq %d: recv[%d]=%d, want %d", r, s+1, i, recv[i], mat[i*n+r])
								return
							}
						}
						if full != nil && !slices.Equal(full, mat) {
							errs <- fmt.Errorf("rank %d seq %d: matrix %v, want %v", r, s+1, full, mat)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

// TestExchangeCountsOutOfOrder: rank 0 posts seq 2 before seq 1 (two calls in
// flight), rank 1 races ahead to seq 2 while rank 2 lingers on seq 1; the
// coordinator keeps the early rows and everyone gets the right columns.
func TestExchangeCountsOutOfOrder(t *testing.T) {
	e := newEnv(t)
	svc := e.service()
	mems := e.mustJoin(configs("gooo", []int{0, 1, 2}, nil))
	const n = 3
	mats := map[uint64][]int{1: {1, 2, 3, 4, 5, 6, 7, 8, 9}, 2: {0, 10, 20, 30, 0, 50, 60, 70, 0}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	type res struct {
		rank int
		seq  uint64
		recv []int
		err  error
	}
	out := make(chan res, 6)
	call := func(m *Member, seq uint64) {
		recv := make([]int, n)
		err := m.ExchangeCounts(ctx, seq, mats[seq][m.Rank()*n:(m.Rank()+1)*n], recv, nil)
		out <- res{m.Rank(), seq, recv, err}
	}
	go call(mems[0], 2)
	time.Sleep(30 * time.Millisecond)
	go call(mems[0], 1)
	go func() { call(mems[1], 1); call(mems[1], 2) }()
	time.Sleep(100 * time.Millisecond) // rank 1's seq-2 row waits at the coordinator... once seq 1 completes
	go func() { call(mems[2], 1); time.Sleep(50 * time.Millisecond); call(mems[2], 2) }()
	for i := 0; i < 6; i++ {
		r := <-out
		if r.err != nil {
			t.Fatalf("rank %d seq %d: %v", r.rank, r.seq, r.err)
		}
		for src := 0; src < n; src++ {
			if want := mats[r.seq][src*n+r.rank]; r.recv[src] != want {
				t.Errorf("rank %d seq %d: recv[%d]=%d, want %d", r.rank, r.seq, src, r.recv[src], want)
			}
		}
	}
	if g := svc.Groups(); len(g) != 1 || g[0].PendingCounts != 0 {
		t.Errorf("coordinator still holds counts operations: %+v", g)
	}
}

func TestExchangeCountsInvalid(t *testing.T) {
	e := newEnv(t)
	e.service()
	mems := e.mustJoin(configs("ginv", []int{0, 1}, nil))
	m := mems[0]
	ctx := context.Background()
	for _, tc := range []struct {
		name             string
		send, recv, full []int
	}{
		{"short send", []int{1}, make([]int, 2), nil},
		{"long recv", []int{1, 2}, make([]int, 3), nil},
		{"negative", []int{1, -2}, make([]int, 2), nil},
		{"matrix length", []int{1, 2}, make([]int, 2), make([]int, 3)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := m.ExchangeCounts(ctx, 1, tc.send, tc.recv, tc.full)
			if !errors.Is(err, fault.ErrInvalidArgument) || fault.KindOf(err) != fault.ErrInvalidArgument {
				t.Fatalf("got %v", err)
			}
		})
	}
	t.Run("timeout and duplicate seq", func(t *testing.T) {
		// Rank 1 never calls: rank 0 times out; a second call with the same seq
		// while the first is in flight is refused.
		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		first := make(chan error, 1)
		go func() { first <- m.ExchangeCounts(tctx, 9, []int{1, 2}, make([]int, 2), nil) }()
		time.Sleep(50 * time.Millisecond)
		if err := m.ExchangeCounts(tctx, 9, []int{1, 2}, make([]int, 2), nil); !errors.Is(err, fault.ErrInvalidArgument) {
			t.Errorf("duplicate seq: %v", err)
		}
		err := <-first
		if !errors.Is(err, fault.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, fault.ErrAborted) {
			t.Errorf("timeout: %v", err)
		}
	})
	t.Run("abort wakes waiter", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { done <- m.ExchangeCounts(ctx, 10, []int{1, 2}, make([]int, 2), nil) }()
		time.Sleep(50 * time.Millisecond)
		mems[1].Abort(fault.New(fault.ErrMismatch, 1, "test"))
		select {
		case err := <-done:
			if !errors.Is(err, fault.ErrAborted) || !errors.Is(err, fault.ErrMismatch) {
				t.Errorf("got %v", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("ExchangeCounts did not return after the abort")
		}
		if err := m.ExchangeCounts(ctx, 11, []int{1, 2}, make([]int, 2), nil); !errors.Is(err, fault.ErrAborted) {
			t.Errorf("after abort: %v", err)
		}
	})
}
