package dispatch

import (
	"encoding/binary"
	"slices"
	"sync"

	"github.com/a2a-moe/a2a/routing"
)

// LoadDecay is the weight of the newest dispatch in the load estimate of
// [Dispatcher.Load]: load = LoadDecay*rows + (1-LoadDecay)*load, about the
// last 1/LoadDecay dispatches.
const LoadDecay = 0.125

// LoadObserver is an Observer that also wants the load estimate: after
// every dispatch that updated it, the rows per logical expert
// ([Dispatcher.Load], not to be kept: the slice is reused) and the max/mean
// rank load it gives under the current placement
// ([routing.Placement.RankLoad]). *metrics.Observer implements it.
type LoadObserver interface {
	// ObserveLoad runs on the goroutine that ran the dispatch: keep it fast.
	ObserveLoad(load []float64, rankImbalance float64)
}

// loadState is the estimate of Load. Every rank learns every slot's rows
// from the counts exchange the dispatch runs anyway: each rank appends to
// the counts it sends every peer the rows its own slots received in its
// previous dispatch (the counts of this one are known only once the
// exchange is done). The estimate therefore trails by one dispatch, and
// every rank folds the same integers in the same order, so the floats are
// the same everywhere.
type loadState struct {
	mu      sync.Mutex // guards ema and samples: Load reads them from the caller's goroutine
	ema     []float64  // rows per logical expert, nil before the first sample
	samples int
	rankLd  []float64 // scratch: the estimate per rank

	prev      []int // rows this rank's slots received in its last dispatch
	prevValid bool  // prev is of a dispatch under the current placement
	sum       []int // scratch: the group's rows per logical expert
}

// countsBlock is the number of uint32 each rank sends each peer in the
// in-band counts exchange: the rows for each of the peer's slots, then the
// sender's rows of its previous dispatch for each of its own slots.
func countsBlock(maxLocal int) int { return 2 * maxLocal }

// putLoads writes this rank's rows per local slot of its previous dispatch
// (zeros before the first) into b, little-endian uint32 each.
func (d *Dispatcher) putLoads(b []byte) {
	ls := &d.replicas.load
	if !ls.prevValid {
		return // b is cleared
	}
	for l, n := range ls.prev {
		binary.LittleEndian.PutUint32(b[4*l:], uint32(n))
	}
}

// foldLoads adds the group's rows of the previous dispatch, which the counts
// exchange of this one brought, to the estimate, and keeps this dispatch's
// rows for the next. It allocates only on the first dispatch of a placement.
func (h *Handle) foldLoads() {
	d := h.d
	ls := &d.replicas.load
	if ls.prevValid {
		ls.sum = growInts(ls.sum, d.cfg.Experts)
		clear(ls.sum)
		for i := range d.size {
			src := h.loadBlock(i)
			for l, v := range d.rt.slots.PerRank[i] {
				var n int
				if i == d.rank {
					n = ls.prev[l]
				} else {
					n = int(binary.LittleEndian.Uint32(src[4*l:]))
				}
				ls.sum[d.rt.expertOf[v]] += n
			}
		}
		d.addSample(ls.sum)
	}
	ls.prev = append(ls.prev[:0], h.expertRows...)
	ls.prevValid = true
}

// loadBlock is the part of rank i's counts (in-band) or block header
// (CountsNATS) that holds its rows of the previous dispatch.
func (h *Handle) loadBlock(i int) []byte {
	d := h.d
	if i == d.rank {
		return nil
	}
	if d.cfg.Counts == CountsInBand {
		blk := countsBlock(d.maxLocal)
		return h.hdrIn[4*(i*blk+d.maxLocal) : 4*(i+1)*blk]
	}
	return h.recv[h.recvDispl[i]+4*d.nLocal : h.recvDispl[i]+d.hdrSelf]
}

// addSample folds one dispatch's rows per logical expert into the estimate
// and tells a LoadObserver.
func (d *Dispatcher) addSample(rows []int) {
	ls := &d.replicas.load
	ls.mu.Lock()
	if ls.ema == nil {
		ls.ema = make([]float64, len(rows))
		for e, n := range rows {
			ls.ema[e] = float64(n)
		}
	} else {
		for e, n := range rows {
			ls.ema[e] = LoadDecay*float64(n) + (1-LoadDecay)*ls.ema[e]
		}
	}
	ls.samples++
	ls.mu.Unlock()
	if o, ok := d.cfg.Observer.(LoadObserver); ok {
		o.ObserveLoad(ls.ema, d.rankImbalance(ls.ema))
	}
}

// rankImbalance is the max/mean rank load of load under the current
// placement, its experts' rows split evenly over their replicas (as
// routing.Placement.RankLoad, without allocating).
func (d *Dispatcher) rankImbalance(load []float64) float64 {
	ls, rt := &d.replicas.load, d.rt
	if cap(ls.rankLd) < d.size {
		ls.rankLd = make([]float64, d.size)
	}
	ls.rankLd = ls.rankLd[:d.size]
	clear(ls.rankLd)
	for v, e := range rt.expertOf {
		ls.rankLd[rt.slots.Owner[v]] += load[e] / float64(rt.copies[e])
	}
	return routing.Imbalance(ls.rankLd)
}

// Load returns the estimated load of every logical expert: an exponential
// moving average (weight [LoadDecay]) of the rows it received per dispatch,
// summed over the group, and the same on every rank. It costs no
// collective: the counts exchange of each dispatch carries the rows of the
// one before, so the estimate trails by one dispatch (and restarts that lag
// after a Replace). It returns nil before any sample (the first two
// dispatches). Rows count kept assignments: what capacity dropped is not
// load.
func (d *Dispatcher) Load() []float64 {
	if d.hier != nil {
		return d.hier.inner.Load() // every row reaches its expert through the forward
	}
	ls := &d.replicas.load
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return slices.Clone(ls.ema)
}
