package metrics

import (
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// balanceSeries are the MoE load-balancing families: the dispatcher's load
// estimate and its re-placements (dispatch.LoadObserver and
// dispatch.ReplaceObserver).
type balanceSeries struct {
	load          *prometheus.GaugeVec
	rankImbalance prometheus.Gauge
	replacements  prometheus.Counter
	replaceBytes  prometheus.Counter

	mu     sync.Mutex         // guards gauges
	gauges []prometheus.Gauge // the load gauge of each expert, resolved once
}

func newBalanceSeries(ns string) *balanceSeries {
	return &balanceSeries{
		load: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: "moe", Name: "expert_load",
			Help: "Estimated rows per dispatch of each logical expert over the group (moving average, the same on every rank).",
		}, []string{"expert"}),
		rankImbalance: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: "moe", Name: "rank_imbalance",
			Help: "Max over mean rank load that the load estimate gives under the current placement, replicas included (1 is balanced).",
		}),
		replacements: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: "moe", Name: "replacements_total",
			Help: "Re-placements of the experts (dispatch.Replace, manual or automatic).",
		}),
		replaceBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: "moe", Name: "replace_bytes_total",
			Help: "Expert parameter bytes this rank sent in re-placements (summed over the ranks: the bytes moved).",
		}),
	}
}

func (b *balanceSeries) collectors() []prometheus.Collector {
	return []prometheus.Collector{b.load, b.rankImbalance, b.replacements, b.replaceBytes}
}

// ObserveLoad records the dispatcher's load estimate: rows per logical
// expert and the rank imbalance they give. Experts past maxCachedIndex and
// NaN values are ignored.
func (o *Observer) ObserveLoad(load []float64, rankImbalance float64) {
	b := o.balance
	b.mu.Lock()
	for e := len(b.gauges); e < min(len(load), maxCachedIndex); e++ {
		b.gauges = append(b.gauges, b.load.WithLabelValues(strconv.Itoa(e)))
	}
	for e, v := range load[:min(len(load), len(b.gauges))] {
		if !math.IsNaN(v) {
			b.gauges[e].Set(v)
		}
	}
	b.mu.Unlock()
	if !math.IsNaN(rankImbalance) {
		b.rankImbalance.Set(rankImbalance)
	}
	o.moe.load(rankImbalance)
}

// ObserveReplace counts one re-placement and the parameter bytes this rank
// sent in it.
func (o *Observer) ObserveReplace(changedSlots int, sentBytes int64, d time.Duration) {
	o.balance.replacements.Inc()
	o.moe.replace(sentBytes)
	if sentBytes > 0 {
		o.balance.replaceBytes.Add(float64(sentBytes))
	}
}
