package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/a2a-moe/a2a/a2a/control"
)

// RegisterControlMoE registers on reg the MoE layer of every group src
// serves, summed over its ranks as their traffic reports give it (the MoE
// panel of a2ad serve's live view), read at scrape time:
//
//	a2a_control_moe_tokens_total{group,expert}              counter, rows dispatched to each expert
//	a2a_control_moe_rank_rows_total{group,rank}             counter, rows dispatched to each rank (its load)
//	a2a_control_moe_load_imbalance{group}                   gauge, max/mean of the ranks' rows per second lately
//	a2a_control_moe_estimated_imbalance{group}              gauge, the dispatchers' estimate under their placement
//	a2a_control_moe_dropped_total{group}                    counter, assignments dropped over capacity
//	a2a_control_moe_dispatch_duration_seconds{group}        histogram, every rank's dispatches
//	a2a_control_moe_combine_duration_seconds{group}         histogram, every rank's combines
//	a2a_control_moe_wire_bytes_total{group,format}          counter, rows' bytes on the wire
//	a2a_control_moe_wire_saved_bytes_total{group,format}    counter, what the wire format saved against the dtype
//	a2a_control_moe_replacements_total{group}               counter, re-placements of the experts
//	a2a_control_moe_replace_bytes_total{group}              counter, parameter bytes they moved
//
// The counters count since the ranks started (a rank's Observer outlives a
// shrink); a group appears once a rank of its current epoch reported MoE
// figures.
func RegisterControlMoE(reg prometheus.Registerer, src TrafficSource) error {
	g := []string{"group"}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("a2a_control_moe_"+name, help, append(g, labels...), nil)
	}
	return reg.Register(&moeCollector{src: src,
		tokens:    d("tokens_total", "Rows the group's ranks dispatched to each expert.", "expert"),
		rankRows:  d("rank_rows_total", "Rows the group's ranks dispatched to each rank: its load.", "rank"),
		imbalance: d("load_imbalance", "Max over mean rows per second to a rank over the latest report intervals (1 is balanced, 0 idle)."),
		estimate:  d("estimated_imbalance", "Max over mean rank load the dispatchers' load estimate gives under their current placement (0: none)."),
		dropped:   d("dropped_total", "Token assignments the group's ranks dropped over capacity."),
		dispatch:  d("dispatch_duration_seconds", "Duration of the group's ranks' MoE dispatches."),
		combine:   d("combine_duration_seconds", "Duration of the group's ranks' MoE combines."),
		wire:      d("wire_bytes_total", "Bytes of the rows the group's ranks dispatched to other ranks, in their wire format.", "format"),
		saved:     d("wire_saved_bytes_total", "Bytes the wire format saved on those rows against their element type.", "format"),
		repl:      d("replacements_total", "Re-placements of the group's experts."),
		replBytes: d("replace_bytes_total", "Expert parameter bytes the re-placements moved."),
	})
}

type moeCollector struct {
	src                                             TrafficSource
	tokens, rankRows, imbalance, estimate, dropped  *prometheus.Desc
	dispatch, combine, wire, saved, repl, replBytes *prometheus.Desc
}

func (c *moeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.tokens, c.rankRows, c.imbalance, c.estimate, c.dropped,
		c.dispatch, c.combine, c.wire, c.saved, c.repl, c.replBytes} {
		ch <- d
	}
}

func (c *moeCollector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range c.src.Groups() {
		tv, ok := c.src.Traffic(g.Group)
		if !ok || g.Forming || tv.Epoch != g.Epoch || tv.Size != len(g.Ranks) {
			continue
		}
		if s, ok := sumMoE(tv); ok {
			c.collectGroup(ch, tv.Group, &s)
		}
	}
}

// groupMoE is a group's MoE figures summed over its ranks.
type groupMoE struct {
	tokens, rankRows          []uint64
	load                      []float64 // rows per second to each rank
	estimate                  float64
	dropped                   uint64
	dispatch, combine         []uint64
	dispatchSum, combineSum   float64
	wire                      []control.WireBytes
	replacements, replaceSent uint64
}

// sumMoE sums the MoE figures of tv's ranks; false when none reported any.
func sumMoE(tv control.TrafficView) (groupMoE, bool) {
	s := groupMoE{load: make([]float64, tv.Size)}
	have := false
	for _, rt := range tv.Ranks {
		m := rt.MoE
		if m == nil {
			continue
		}
		have = true
		s.tokens = addTo(s.tokens, m.Tokens)
		s.rankRows = addTo(s.rankRows, m.RankRows)
		for j, v := range m.RankRowRate {
			if j < len(s.load) {
				s.load[j] += v
			}
		}
		s.estimate = max(s.estimate, m.RankImbalance)
		s.dropped += m.Dropped
		s.dispatch, s.combine = addTo(s.dispatch, m.DispatchTime), addTo(s.combine, m.CombineTime)
		s.dispatchSum += m.DispatchTotal.Seconds()
		s.combineSum += m.CombineTotal.Seconds()
		s.wire = addWireBytes(s.wire, m.Wire)
		s.replacements = max(s.replacements, m.Replacements) // each is collective
		s.replaceSent += m.ReplaceBytes
	}
	return s, have
}

func (c *moeCollector) collectGroup(ch chan<- prometheus.Metric, group string, s *groupMoE) {
	counter, gauge := prometheus.CounterValue, prometheus.GaugeValue
	for e, v := range s.tokens {
		ch <- prometheus.MustNewConstMetric(c.tokens, counter, float64(v), group, strconv.Itoa(e))
	}
	for j, v := range s.rankRows {
		ch <- prometheus.MustNewConstMetric(c.rankRows, counter, float64(v), group, strconv.Itoa(j))
	}
	ch <- prometheus.MustNewConstMetric(c.imbalance, gauge, loadImbalance(s.load), group)
	ch <- prometheus.MustNewConstMetric(c.estimate, gauge, s.estimate, group)
	ch <- prometheus.MustNewConstMetric(c.dropped, counter, float64(s.dropped), group)
	ch <- constHistogram(c.dispatch, s.dispatch, s.dispatchSum, group)
	ch <- constHistogram(c.combine, s.combine, s.combineSum, group)
	for _, w := range s.wire {
		ch <- prometheus.MustNewConstMetric(c.wire, counter, float64(w.Wire), group, w.Format)
		ch <- prometheus.MustNewConstMetric(c.saved, counter, float64(w.DType-min(w.Wire, w.DType)), group, w.Format)
	}
	ch <- prometheus.MustNewConstMetric(c.repl, counter, float64(s.replacements), group)
	ch <- prometheus.MustNewConstMetric(c.replBytes, counter, float64(s.replaceSent), group)
}

// constHistogram turns counts by control.MoEBucketBound's buckets into a
// Prometheus histogram (cumulative, the open bucket as +Inf).
func constHistogram(d *prometheus.Desc, counts []uint64, sum float64, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, control.MoEBuckets-1)
	var acc uint64
	for i := range control.MoEBuckets - 1 {
		if i < len(counts) {
			acc += counts[i]
		}
		buckets[control.MoEBucketBound(i).Seconds()] = acc
	}
	if len(counts) == control.MoEBuckets {
		acc += counts[control.MoEBuckets-1]
	}
	return prometheus.MustNewConstHistogram(d, acc, sum, buckets, labels...)
}

// loadImbalance is max over mean of load, 0 when there is none (idle).
func loadImbalance(load []float64) float64 {
	var sum, top float64
	for _, v := range load {
		sum += v
		top = max(top, v)
	}
	if sum <= 0 {
		return 0
	}
	return top / (sum / float64(len(load)))
}

func addTo(dst, src []uint64) []uint64 {
	for len(dst) < len(src) {
		dst = append(dst, 0)
	}
	for i, v := range src {
		dst[i] += v
	}
	return dst
}

func addWireBytes(dst, src []control.WireBytes) []control.WireBytes {
next:
	for _, w := range src {
		for i := range dst {
			if dst[i].Format == w.Format {
				dst[i].DType, dst[i].Wire = dst[i].DType+w.DType, dst[i].Wire+w.Wire
				continue next
			}
		}
		dst = append(dst, w)
	}
	return dst
}
