package control

import (
	"errors"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// waitFailed waits until s.FailedAt(seq) reports an error, or fails.
func waitFailed(t *testing.T, s *Scope, seq uint64) error {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := s.FailedAt(seq); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			t.Fatalf("scope never failed op %d", seq)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestScope: an abort of a scope reaches its members only, from its own
// op number on, and leaves the group and other scopes alone; a scope's
// LeaveAt fails its peers' later ops with ErrPeerLost; a rank that leaves
// the group fails every scope that holds it; and a lost rank fails the
// scopes that hold it only.
func TestScope(t *testing.T) {
	e := newEnv(t)
	e.service()
	mems := e.mustJoin(configs("gscope", []int{0, 1, 2, 3}, nil))
	halves := make([]*Scope, 4) // scope 5: ranks 1, 0; scope 6: ranks 2, 3
	for r, m := range mems {
		comm, ranks := uint16(5), []int{1, 0}
		if r >= 2 {
			comm, ranks = 6, []int{2, 3}
		}
		s, err := m.OpenScope(comm, ranks)
		if err != nil {
			t.Fatal(err)
		}
		halves[r] = s
	}
	if _, err := mems[0].OpenScope(7, []int{1, 2}); !errors.Is(err, fault.ErrInvalidArgument) {
		t.Errorf("a scope without this rank: %v", err)
	}
	halves[1].AbortAt(4, errors.New("boom"))
	err := waitFailed(t, halves[0], 4)
	if !errors.Is(err, fault.ErrAborted) {
		t.Errorf("peer in the aborted scope: %v", err)
	}
	if err := halves[0].FailedAt(2); err != nil {
		t.Errorf("op 2, before the abort's scope: %v", err)
	}
	time.Sleep(100 * time.Millisecond) // the abort reached every member by now
	for r, m := range mems {
		if err := m.FailedAt(10); err != nil {
			t.Errorf("rank %d: the group failed: %v", r, err)
		}
	}
	for _, s := range halves[2:] {
		if err := s.FailedAt(10); err != nil {
			t.Errorf("the other scope failed: %v", err)
		}
	}
	halves[3].LeaveAt(6)
	if err := waitFailed(t, halves[2], 6); !errors.Is(err, fault.ErrPeerLost) {
		t.Errorf("after the peer closed the scope: %v, want ErrPeerLost", err)
	}
	if err := halves[2].FailedAt(4); err != nil {
		t.Errorf("op 4, which the closer finished: %v", err)
	}
	// Rank 0 leaves the group: scope 5 fails on rank 1 with ErrPeerLost.
	s1, err := mems[1].OpenScope(8, []int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := mems[0].LeaveAt(0); err != nil {
		t.Fatal(err)
	}
	if err := waitFailed(t, s1, 0); !errors.Is(err, fault.ErrPeerLost) {
		t.Errorf("after rank 0 left the group: %v, want ErrPeerLost", err)
	}
	// The group's abort for a lost rank fails the scopes that hold it only.
	with, err := mems[2].OpenScope(9, []int{2, 3})
	if err != nil {
		t.Fatal(err)
	}
	without, err := mems[2].OpenScope(10, []int{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	mems[2].abort(&fault.Error{Kind: fault.ErrAborted, Rank: 3, Detail: "rank 3 lost", Err: fault.New(fault.ErrPeerLost, 3, "no heartbeat")}, false)
	if err := with.FailedAt(0); !errors.Is(err, fault.ErrPeerLost) {
		t.Errorf("the scope holding the lost rank: %v, want ErrPeerLost", err)
	}
	if err := without.FailedAt(0); err != nil {
		t.Errorf("the scope without the lost rank: %v", err)
	}
}
