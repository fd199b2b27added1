package metrics

import (
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/a2a-moe/a2a/a2a/control"
)

// moeTally is what the Observer keeps of the MoE layer for the Comm's
// traffic reports (a2a.MoEReporter): a2ad serve's live view draws its MoE
// panel from them. Cumulative since the Observer was made, except the
// figures by rank, which a shrink (new rank numbers) restarts.
// maxWireName bounds a wire format's name, as a report does.
const maxWireName = 32

type moeTally struct {
	mu  sync.Mutex
	ver uint64 // grows with every change
	r   control.MoEReport
}

// grow extends s to n entries, bounding the figures by index, as the Prometheus caches do.
func grow(s []uint64, n int) []uint64 {
	n = min(n, maxCachedIndex)
	if len(s) < n {
		s = append(s, make([]uint64, n-len(s))...)
	}
	return s
}

func (t *moeTally) dispatch(d time.Duration, tokens []int, dropped int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ver++
	t.r.Dispatches++
	t.r.Tokens = grow(t.r.Tokens, len(tokens))
	for e, n := range tokens[:min(len(tokens), len(t.r.Tokens))] {
		if n > 0 {
			t.r.Tokens[e] += uint64(n)
		}
	}
	if dropped > 0 {
		t.r.Dropped += uint64(dropped)
	}
	t.r.DispatchTime = grow(t.r.DispatchTime, control.MoEBuckets)
	t.r.DispatchTime[control.MoEBucket(d)]++
	t.r.DispatchTotal += max(d, 0)
}

func (t *moeTally) combine(d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ver++
	t.r.Combines++
	t.r.CombineTime = grow(t.r.CombineTime, control.MoEBuckets)
	t.r.CombineTime[control.MoEBucket(d)]++
	t.r.CombineTotal += max(d, 0)
}

func (t *moeTally) rows(rankRows []int, wire string, dtypeBytes, wireBytes int64) {
	if len(wire) > maxWireName {
		wire = wire[:maxWireName]
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ver++
	t.r.RankRows = grow(t.r.RankRows, len(rankRows))
	if t.r.Local != nil {
		t.r.Local = grow(t.r.Local, len(rankRows)) // one entry per rank, as a report has
	}
	for j, n := range rankRows[:min(len(rankRows), len(t.r.RankRows))] {
		if n > 0 {
			t.r.RankRows[j] += uint64(n)
		}
	}
	if dtypeBytes <= 0 || wireBytes < 0 {
		return
	}
	for i := range t.r.Wire {
		if w := &t.r.Wire[i]; w.Format == wire {
			w.DType, w.Wire = w.DType+uint64(dtypeBytes), w.Wire+uint64(wireBytes)
			return
		}
	}
	t.r.Wire = append(t.r.Wire, control.WireBytes{Format: wire, DType: uint64(dtypeBytes), Wire: uint64(wireBytes)})
}

func (t *moeTally) shared(peer int, sent int64) {
	if peer < 0 || sent <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ver++
	t.r.Local = grow(t.r.Local, max(peer+1, len(t.r.RankRows)))
	if peer < len(t.r.Local) {
		t.r.Local[peer] += uint64(sent)
	}
}

func (t *moeTally) load(rankImbalance float64) {
	if math.IsNaN(rankImbalance) || rankImbalance < 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.r.RankImbalance != rankImbalance {
		t.ver++
		t.r.RankImbalance = rankImbalance
	}
}

func (t *moeTally) replace(sentBytes int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ver++
	t.r.Replacements++
	if sentBytes > 0 {
		t.r.ReplaceBytes += uint64(sentBytes)
	}
}

// shrunk forgets the figures by rank: the survivors have new numbers.
func (t *moeTally) shrunk() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ver++
	t.r.RankRows, t.r.Local = nil, nil
}

// MoEReport copies the MoE figures the Observer was told of into dst,
// reusing its storage, and returns a number that grows with every change
// (0: none yet). It makes the Observer an a2a.MoEReporter: a Comm it
// observes adds the figures to its traffic reports for a2ad serve's live
// view.
func (o *Observer) MoEReport(dst *control.MoEReport) uint64 {
	t := &o.moe
	t.mu.Lock()
	defer t.mu.Unlock()
	wire := append(dst.Wire[:0], t.r.Wire...)
	*dst = control.MoEReport{Dispatches: t.r.Dispatches, Combines: t.r.Combines, Dropped: t.r.Dropped,
		Replacements: t.r.Replacements, ReplaceBytes: t.r.ReplaceBytes, RankImbalance: t.r.RankImbalance,
		DispatchTotal: t.r.DispatchTotal, CombineTotal: t.r.CombineTotal,
		Tokens: copyOrNil(dst.Tokens, t.r.Tokens), RankRows: copyOrNil(dst.RankRows, t.r.RankRows),
		DispatchTime: copyOrNil(dst.DispatchTime, t.r.DispatchTime), CombineTime: copyOrNil(dst.CombineTime, t.r.CombineTime),
		Local: copyOrNil(dst.Local, t.r.Local), Wire: wire}
	return t.ver
}

// copyOrNil copies src into dst's storage; nil stays nil, so that a report
// leaves out what was never observed.
func copyOrNil(dst, src []uint64) []uint64 {
	if src == nil {
		return nil
	}
	return append(dst[:0], src...)
}

// wireSeries count the bytes of the dispatched rows by wire format.
type wireSeries struct {
	bytes, saved *prometheus.CounterVec
}

func newWireSeries(ns string) wireSeries {
	return wireSeries{
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: "moe", Name: "wire_bytes_total",
			Help: "Bytes of the rows this rank dispatched to other ranks, in their wire format.",
		}, []string{"format"}),
		saved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: "moe", Name: "wire_saved_bytes_total",
			Help: "Bytes the wire format saved on the rows this rank dispatched to other ranks, against their element type.",
		}, []string{"format"}),
	}
}

// ObserveRows records a dispatch's rows by destination rank and the bytes
// of the rows sent to other ranks in their element type and in the wire
// format (dispatch.RowsObserver).
func (o *Observer) ObserveRows(rankRows []int, wire string, dtypeBytes, wireBytes int64) {
	o.moe.rows(rankRows, wire, dtypeBytes, wireBytes)
	if dtypeBytes > 0 && wireBytes >= 0 {
		o.wire.bytes.WithLabelValues(wire).Add(float64(wireBytes))
		o.wire.saved.WithLabelValues(wire).Add(float64(max(dtypeBytes-wireBytes, 0)))
	}
}

// ObserveSharedPeer records the bytes a dispatch or combine gave one
// same-host peer through shared memory (dispatch.SharedPeerObserver), for
// the traffic matrix of a2ad serve's live view; ObserveSharedTraffic counts
// them in the byte counters.
func (o *Observer) ObserveSharedPeer(peer int, sent, received int64) { o.moe.shared(peer, sent) }
