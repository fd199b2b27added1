package main

import (
	"strings"
	"testing"
)

func TestFDB(t *testing.T) {
	f := fdb{}
	a := []byte{0x02, 0, 0, 0, 0, 0xa}
	b := []byte{0x02, 0, 0, 0, 0, 0xb}
	bcast := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	mcast := []byte{0x33, 0x33, 0, 0, 0, 1} // IPv6 all-nodes
	if got := f.lookup(a); got != -1 {
		t.Errorf("unknown destination: port %d, want -1 (flood)", got)
	}
	f.learn(a, 2)
	f.learn(b, 0)
	if got := f.lookup(a); got != 2 {
		t.Errorf("learned destination: port %d, want 2", got)
	}
	f.learn(a, 3) // moved
	if got := f.lookup(a); got != 3 {
		t.Errorf("moved destination: port %d, want 3", got)
	}
	f.learn(bcast, 1) // group addresses are never sources
	f.learn(mcast, 1)
	for _, dst := range [][]byte{bcast, mcast} {
		if got := f.lookup(dst); got != -1 {
			t.Errorf("group destination %x: port %d, want -1 (flood)", dst, got)
		}
	}
	if len(f) != 2 {
		t.Errorf("%d entries, want 2", len(f))
	}
}

func TestFIFOOrder(t *testing.T) {
	var q fifo
	next, want, most, storage := 0, 0, 0, 0
	// Interleave pushes and pops so the queue compacts many times.
	for round := range 50 {
		for range 100 + round*7 {
			q.push(frame{due: int64(next)})
			next++
		}
		most = max(most, q.len())
		storage = max(storage, len(q.q))
		for range 90 + round*5 {
			if q.front().due != int64(want) {
				t.Fatalf("front %d, want %d", q.front().due, want)
			}
			if got := q.pop().due; got != int64(want) {
				t.Fatalf("popped %d, want %d", got, want)
			}
			want++
		}
		if q.len() != next-want {
			t.Fatalf("len %d, want %d", q.len(), next-want)
		}
	}
	for q.len() > 0 {
		if got := q.pop().due; got != int64(want) {
			t.Fatalf("popped %d, want %d", got, want)
		}
		want++
	}
	if want != next {
		t.Fatalf("popped %d frames, pushed %d", want, next)
	}
	if storage > 2*most+1024 {
		t.Errorf("queue storage grew to %d for at most %d queued frames", storage, most)
	}
}

func TestHist(t *testing.T) {
	var h hist
	if h.String() != "none" {
		t.Errorf("empty: %q", h.String())
	}
	for i := range 100 {
		h.add(int64(i) * 1000) // 0..99 us
	}
	h.add(-5)       // clamped to 0
	h.add(10_000e3) // 10 ms: past the buckets
	if got := h.quantile(0.5); got < 49 || got > 51 {
		t.Errorf("p50 %v us, want ~50", got)
	}
	if got := h.quantile(1); got != 10_000 {
		t.Errorf("p100 %v us, want the maximum 10000", got)
	}
	if s := h.String(); !strings.Contains(s, "max 10000.0") || !strings.Contains(s, "(102)") {
		t.Errorf("summary %q", s)
	}
}
