package control

import (
	"math"
	"time"
)

// A rank that runs a MoE layer (package dispatch) adds the layer's figures
// to its traffic reports, so that a2ad serve's live view draws the MoE
// panel from the reports it already gets: no collective of its own, and
// nothing on NATS beyond the report each period.

// Bounds on a report's MoE part, as for its operations: a malformed or
// hostile one cannot grow the service. MaxReportExperts is the most experts
// a report may count rows of (MoEReport.Tokens).
const (
	MaxReportExperts = 4096
	maxReportWires   = 8
)

// MoEBuckets is the number of buckets of MoEReport's duration histograms:
// bucket i (i < MoEBuckets-1) counts durations up to MoEBucketBound(i), the
// last one the longer ones.
const MoEBuckets = 26

// MoEBucketBound is the upper bound of duration bucket i: 1µs doubled i
// times, up to about 16.8 s (the buckets of package metrics' histograms).
func MoEBucketBound(i int) time.Duration {
	if i >= MoEBuckets-1 {
		return time.Duration(math.MaxInt64)
	}
	return time.Microsecond << i
}

// MoEBucket is the bucket of duration d.
func MoEBucket(d time.Duration) int {
	for i := range MoEBuckets - 1 {
		if d <= MoEBucketBound(i) {
			return i
		}
	}
	return MoEBuckets - 1
}

// MoEReport is what one rank's MoE layers did since the rank started: every
// figure is cumulative, so a lost report costs resolution only.
type MoEReport struct {
	// Dispatches and Combines count the steps.
	Dispatches, Combines uint64
	// Tokens[e] is the rows this rank dispatched to global expert e.
	Tokens []uint64
	// RankRows[j] is the rows this rank dispatched to rank j (itself
	// included): summed over the senders, rank j's load.
	RankRows []uint64
	// Dropped counts the token assignments dropped over capacity.
	Dropped uint64
	// DispatchTime and CombineTime count the steps by duration, in the
	// buckets of MoEBucketBound (MoEBuckets entries each, or none);
	// DispatchTotal and CombineTotal are the durations summed.
	DispatchTime, CombineTime   []uint64
	DispatchTotal, CombineTotal time.Duration
	// Local[j] is the bytes this rank moved to rank j through shared memory
	// (rows and expert outputs), which its transport never sees.
	Local []uint64
	// Wire is the rows' bytes by wire format.
	Wire []WireBytes
	// Replacements counts the re-placements of the experts, ReplaceBytes
	// the expert parameter bytes this rank sent in them.
	Replacements, ReplaceBytes uint64
	// RankImbalance is the max/mean rank load of the dispatcher's load
	// estimate under its current placement (0: no estimate yet).
	RankImbalance float64
}

// WireBytes is how many bytes the rows sent to other ranks took in one wire
// format (Wire) and would have taken in their element type (DType): the
// difference is what the format saved.
type WireBytes struct {
	Format      string
	DType, Wire uint64
}

type moeMsg struct {
	_msgpack     struct{} `msgpack:",as_array"`
	Dispatches   uint64
	Combines     uint64
	Tokens       []uint64
	RankRows     []uint64
	Dropped      uint64
	DispatchTime []uint64
	CombineTime  []uint64
	Local        []uint64
	Wire         []wireMsg
	Replacements uint64
	ReplaceBytes uint64
	Imbalance    float64
	DispatchNS   int64
	CombineNS    int64
}

type wireMsg struct {
	_msgpack    struct{} `msgpack:",as_array"`
	Format      string
	DType, Wire uint64
}

// moeMsgOf encodes m for a group of n ranks; it is an error, which Report
// returns, when m does not fit.
func moeMsgOf(m *MoEReport, n int) (*moeMsg, bool) {
	if m == nil {
		return nil, true
	}
	msg := &moeMsg{Dispatches: m.Dispatches, Combines: m.Combines, Tokens: m.Tokens, RankRows: m.RankRows, Dropped: m.Dropped,
		DispatchTime: m.DispatchTime, CombineTime: m.CombineTime, Local: m.Local, Replacements: m.Replacements,
		ReplaceBytes: m.ReplaceBytes, Imbalance: m.RankImbalance, DispatchNS: int64(m.DispatchTotal), CombineNS: int64(m.CombineTotal)}
	for _, w := range m.Wire {
		msg.Wire = append(msg.Wire, wireMsg{Format: w.Format, DType: w.DType, Wire: w.Wire})
	}
	return msg, msg.fits(n)
}

// fits reports whether m has one entry per rank of a group of n ranks
// where it has any, and stays within a report's bounds.
func (m *moeMsg) fits(n int) bool {
	if m == nil {
		return true
	}
	perRank := func(s []uint64) bool { return len(s) == 0 || len(s) == n }
	hist := func(s []uint64) bool { return len(s) == 0 || len(s) == MoEBuckets }
	if !perRank(m.RankRows) || !perRank(m.Local) || !hist(m.DispatchTime) || !hist(m.CombineTime) ||
		len(m.Tokens) > MaxReportExperts || len(m.Wire) > maxReportWires || math.IsNaN(m.Imbalance) || m.Imbalance < 0 {
		return false
	}
	for _, w := range m.Wire {
		if len(w.Format) > maxReportNameLen {
			return false
		}
	}
	return true
}

// RankMoE is one rank's latest MoE figures (RankTraffic.MoE): its report's,
// plus the rates over the interval between its last two reports, which fall
// to zero as RankTraffic's do.
type RankMoE struct {
	MoEReport
	// TokenRate[e] is the rows per second lately to expert e, RankRowRate[j]
	// to rank j, DroppedRate the assignments dropped per second.
	TokenRate, RankRowRate []float64
	DroppedRate            float64
}

// moeReports is the MoE part of a rank's reports in the service.
type moeReports struct {
	latest                 MoEReport
	tokenRate, rankRowRate []float64
	droppedRate            float64
	localRate              []float64
}

// update adopts m, the MoE part of a report that came dt seconds (of the
// rank's clock) after the previous one.
func (k *moeReports) update(m *moeMsg, dt float64) {
	prev := &k.latest
	k.tokenRate = rates(k.tokenRate, prev.Tokens, m.Tokens, dt)
	k.rankRowRate = rates(k.rankRowRate, prev.RankRows, m.RankRows, dt)
	k.localRate = rates(k.localRate, prev.Local, m.Local, dt)
	k.droppedRate = 0
	if dt > 0 && m.Dropped > prev.Dropped {
		k.droppedRate = float64(m.Dropped-prev.Dropped) / dt
	}
	k.latest = MoEReport{Dispatches: m.Dispatches, Combines: m.Combines, Tokens: m.Tokens, RankRows: m.RankRows,
		Dropped: m.Dropped, DispatchTime: m.DispatchTime, CombineTime: m.CombineTime, Local: m.Local,
		Replacements: m.Replacements, ReplaceBytes: m.ReplaceBytes, RankImbalance: m.Imbalance,
		DispatchTotal: time.Duration(m.DispatchNS), CombineTotal: time.Duration(m.CombineNS)}
	k.latest.Wire = k.latest.Wire[:0]
	for _, w := range m.Wire {
		k.latest.Wire = append(k.latest.Wire, WireBytes{Format: w.Format, DType: w.DType, Wire: w.Wire})
	}
}

// rates returns the per-second growth from prev to cur over dt seconds in
// dst's storage: zero where a figure fell (a new dispatcher) or is new.
func rates(dst []float64, prev, cur []uint64, dt float64) []float64 {
	dst = append(dst[:0], make([]float64, len(cur))...)
	for i, v := range cur {
		if dt > 0 && i < len(prev) && v > prev[i] {
			dst[i] = float64(v-prev[i]) / dt
		}
	}
	return dst
}

// view copies k for a TrafficView; fresh tells whether its rates still hold.
func (k *moeReports) view(fresh bool) *RankMoE {
	v := &RankMoE{MoEReport: k.latest}
	v.Tokens = append([]uint64(nil), k.latest.Tokens...)
	v.RankRows = append([]uint64(nil), k.latest.RankRows...)
	v.DispatchTime = append([]uint64(nil), k.latest.DispatchTime...)
	v.CombineTime = append([]uint64(nil), k.latest.CombineTime...)
	v.Local = append([]uint64(nil), k.latest.Local...)
	v.Wire = append([]WireBytes(nil), k.latest.Wire...)
	v.TokenRate = make([]float64, len(k.tokenRate))
	v.RankRowRate = make([]float64, len(k.rankRowRate))
	if fresh {
		copy(v.TokenRate, k.tokenRate)
		copy(v.RankRowRate, k.rankRowRate)
		v.DroppedRate = k.droppedRate
	}
	return v
}
