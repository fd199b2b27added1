package a2a

import (
	"testing"

	"github.com/a2a-moe/a2a/a2a/algo"
)

func TestPlanCache(t *testing.T) {
	var p planCache
	plan := func(op string, a algo.Algo, send, recv []int) (*algo.Schedule, bool) {
		s, _, planned := p.lookup(op, a, send, recv)
		return s, planned
	}
	x, y := []int{1, 2}, []int{3, 4}
	first, planned := plan("alltoallv", algo.AlgoLL, x, y)
	if planned {
		t.Fatal("empty cache reported a plan")
	}
	// The key is a copy: the caller may reuse its count slices.
	x[0] = 9
	if _, planned := plan("alltoallv", algo.AlgoLL, []int{1, 2}, y); !planned {
		t.Fatal("same inputs missed")
	}
	x[0] = 1
	for _, c := range []struct {
		name       string
		op         string
		a          algo.Algo
		send, recv []int
	}{
		{"other algorithm", "alltoallv", algo.AlgoFullmesh, x, y},
		{"other op", "barrier", algo.AlgoLL, x, y},
		{"other send counts", "alltoallv", algo.AlgoLL, []int{1, 3}, y},
	} {
		if s, planned := plan(c.op, c.a, c.send, c.recv); planned || s == first {
			t.Errorf("%s: planned=%v, same schedule=%v; want a fresh entry", c.name, planned, s == first)
		}
	}
	if s, planned := plan("alltoallv", algo.AlgoLL, x, y); !planned || s != first {
		t.Errorf("first plan after %d others: planned=%v, same schedule=%v", planCacheSize-1, planned, s == first)
	}
	// A fifth shape replaces the oldest entry.
	if _, planned := plan("alltoallv", algo.AlgoLL, x, []int{3}); planned {
		t.Error("other recv counts: reported planned")
	}
	if _, planned := plan("alltoallv", algo.AlgoLL, x, y); planned {
		t.Errorf("oldest entry survived %d later plans", planCacheSize)
	}
	_, entry, _ := p.lookup("barrier", algo.AlgoDissemination, nil, nil)
	entry.forget()
	if _, _, planned := p.lookup("barrier", algo.AlgoDissemination, nil, nil); planned {
		t.Error("a forgotten plan was reused")
	}
}
