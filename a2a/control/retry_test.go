package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// exchangeAll runs one ExchangeCounts of matrix mat (n x n, row-major) for
// seq on every member and checks each column, returning the first error and
// the longest call.
func exchangeAll(ctx context.Context, mems []*Member, seq uint64, mat []int) (time.Duration, error) {
	n := len(mems)
	errs := make([]error, n)
	took := make([]time.Duration, n)
	var wg sync.WaitGroup
	for i, m := range mems {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := m.Rank()
			recv := make([]int, n)
			start := time.Now()
			err := m.ExchangeCounts(ctx, seq, mat[r*n:(r+1)*n], recv, nil)
			took[i] = time.Since(start)
			if err != nil {
				errs[i] = fmt.Errorf("rank %d seq %d: %w", r, seq, err)
				return
			}
			for src := range n {
				if recv[src] != mat[src*n+r] {
					errs[i] = fmt.Errorf("rank %d seq %d: recv[%d]=%d, want %d", r, seq, src, recv[src], mat[src*n+r])
					return
				}
			}
		}()
	}
	wg.Wait()
	return slices.Max(took), errors.Join(errs...)
}

// TestCountsRowsLost: the coordinator's subscription to the counts subject
// is gone for 400 ms (its NATS server died and its reconnect has not reached
// the cluster yet), so the rows published meanwhile reach no one. The ranks
// re-send them and the exchange completes with the right columns, each row
// counted once although it arrives several times.
func TestCountsRowsLost(t *testing.T) {
	e := newEnv(t)
	svc := e.service()
	mems := e.mustJoin(configs("glost", []int{0, 1, 2}, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := exchangeAll(ctx, mems, 1, []int{1, 2, 3, 4, 5, 6, 7, 8, 9}); err != nil {
		t.Fatal(err)
	}
	var sub int
	for i, s := range svc.subs {
		if s.Subject == svcPrefix+"*."+opCounts {
			sub = i
		}
	}
	if err := svc.subs[sub].Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	back := make(chan struct{})
	time.AfterFunc(400*time.Millisecond, func() {
		defer close(back)
		s, err := svc.nc.Subscribe(svcPrefix+"*."+opCounts, svc.onCounts)
		if err != nil {
			t.Error(err)
			return
		}
		svc.mu.Lock()
		svc.subs[sub] = s
		svc.mu.Unlock()
	})
	defer func() { <-back }()
	took, err := exchangeAll(ctx, mems, 2, []int{0, 10, 20, 30, 0, 50, 60, 70, 0})
	if err != nil {
		t.Fatal(err)
	}
	var resends uint64
	for _, m := range mems {
		resends += m.CountsResends()
	}
	if resends == 0 || took < 400*time.Millisecond || took > 2*time.Second {
		t.Errorf("exchange took %v with %d rows re-sent, want 400 ms to 2 s and some", took, resends)
	}
	if g := svc.Groups(); len(g) != 1 || g[0].PendingCounts != 0 {
		t.Errorf("coordinator still holds counts operations: %+v", g)
	}
	if _, err := exchangeAll(ctx, mems, 3, []int{9, 8, 7, 6, 5, 4, 3, 2, 1}); err != nil {
		t.Fatal(err)
	}
}

// TestCountsColumnLost: rank 1's counts inbox is gone while the coordinator
// answers seq 1, so its column is lost while the others get theirs. Rank 1
// re-sends its row and the coordinator, which keeps the completed op,
// answers it with the same column again.
func TestCountsColumnLost(t *testing.T) {
	e := newEnv(t)
	svc := e.service()
	mems := e.mustJoin(configs("gcol", []int{0, 1, 2}, nil))
	m1 := mems[1]
	if err := m1.subs.countsSub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	back := make(chan struct{})
	defer func() { <-back }()
	time.AfterFunc(400*time.Millisecond, func() {
		defer close(back)
		s, err := m1.nc.ChanSubscribe(m1.subs.countsInbox, m1.subs.countsCh)
		if err != nil {
			t.Error(err)
			return
		}
		m1.subs.countsSub = s
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mat := []int{1, 2, 3, 4, 5, 6, 7, 8, 9}
	took, err := exchangeAll(ctx, mems, 1, mat)
	if err != nil {
		t.Fatal(err)
	}
	if n := svc.ColumnsResent(); n == 0 || took < 400*time.Millisecond || took > 2*time.Second {
		t.Errorf("exchange took %v with %d columns sent again, want 400 ms to 2 s and some", took, n)
	}
	if _, err := exchangeAll(ctx, mems, 2, mat); err != nil {
		t.Fatal(err)
	}

	// A row sent again for a completed seq with other counts is a bug of
	// the caller (a seq used twice): the coordinator refuses it.
	bad := make([]int, 3)
	err = m1.ExchangeCounts(ctx, 1, []int{7, 7, 7}, bad, nil)
	if !errors.Is(err, fault.ErrMismatch) {
		t.Errorf("seq 1 again with other counts: %v, want ErrMismatch", err)
	}
}
