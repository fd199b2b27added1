package main

import "fmt"

// fdb is the switch's forwarding database: source MAC -> port it was last seen on.
type fdb map[[6]byte]int

// learn records that src sent from port (group addresses are never sources).
func (f fdb) learn(src []byte, port int) {
	if src[0]&1 != 0 {
		return
	}
	f[[6]byte(src)] = port
}

// lookup is the output port of dst, or -1 when the frame is flooded (broadcast,
// multicast, or a destination not seen yet).
func (f fdb) lookup(dst []byte) int {
	if dst[0]&1 != 0 {
		return -1
	}
	if p, ok := f[[6]byte(dst)]; ok {
		return p
	}
	return -1
}

// frame is one queued frame: the virtio-net header and the Ethernet frame, and the
// time it is due on its output port (Unix ns, the clock of kernel receive timestamps).
type frame struct {
	buf []byte
	due int64
}

// fifo is one output port's queue.
type fifo struct {
	q    []frame
	head int
}

func (f *fifo) len() int { return len(f.q) - f.head }

func (f *fifo) push(fr frame) {
	if f.head > 0 && f.head == len(f.q) {
		f.q, f.head = f.q[:0], 0
	} else if f.head >= 1024 && f.head*2 >= len(f.q) {
		n := copy(f.q, f.q[f.head:])
		clear(f.q[n:])
		f.q, f.head = f.q[:n], 0
	}
	f.q = append(f.q, fr)
}

func (f *fifo) front() *frame { return &f.q[f.head] }

func (f *fifo) pop() frame {
	fr := f.q[f.head]
	f.q[f.head] = frame{}
	f.head++
	return fr
}

// hist is a histogram of durations in microseconds (1 us buckets up to 4 ms).
type hist struct {
	n      uint64
	bucket [4096]uint64
	over   uint64
	maxNs  int64
	sumNs  int64
	minNs  int64
}

func (h *hist) add(ns int64) {
	if ns < 0 {
		ns = 0
	}
	h.n++
	h.sumNs += ns
	if ns > h.maxNs {
		h.maxNs = ns
	}
	if h.n == 1 || ns < h.minNs {
		h.minNs = ns
	}
	us := ns / 1000
	if us >= int64(len(h.bucket)) {
		h.over++
		return
	}
	h.bucket[us]++
}

// quantile is the upper edge (us) of the bucket holding quantile q; past the last
// bucket it is the maximum.
func (h *hist) quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n-1)) + 1
	var seen uint64
	for i, c := range h.bucket {
		seen += c
		if seen >= rank {
			return float64(i + 1)
		}
	}
	return float64(h.maxNs) / 1e3
}

func (h *hist) String() string {
	if h.n == 0 {
		return "none"
	}
	return fmt.Sprintf("min %.1f p50 <%.0f p90 <%.0f p99 <%.0f max %.1f mean %.1f us (%d)",
		float64(h.minNs)/1e3, h.quantile(0.5), h.quantile(0.9), h.quantile(0.99),
		float64(h.maxNs)/1e3, float64(h.sumNs)/float64(h.n)/1e3, h.n)
}
