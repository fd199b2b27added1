package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/a2a-moe/a2a/a2a/control"
)

// TrafficSource is what a control-plane service (*control.Service) knows of
// its groups: their membership and the traffic their ranks report.
type TrafficSource interface {
	Groups() []control.GroupView
	Traffic(group string) (control.TrafficView, bool)
}

// RegisterControlTraffic registers on reg the traffic and wait matrices of
// every group src serves, the ones a2ad serve's live view (/ui/) draws, read
// at scrape time. Series are by group and by the pair of ranks: from is the
// reporting rank, to its peer.
//
//	a2a_control_traffic_sent_bytes_total{group,from,to}          counter, bytes from sent to since the group formed
//	a2a_control_traffic_sent_bytes_per_second{group,from,to}     gauge, the same lately (the live view's rate)
//	a2a_control_traffic_wait_seconds_total{group,from,to}        counter, time from waited for to's data
//	a2a_control_traffic_wait_share{group,from,to}                gauge, part of from's recent time spent so
//	a2a_control_traffic_last_arrivals_total{group,from,to}       counter, operations of from in which to arrived last
//	a2a_control_traffic_operations_total{group,op,algo}          counter, the algorithm mix
//	a2a_control_traffic_local_bytes_total{group,from,to}         counter, bytes from moved to through shared memory
//	a2a_control_traffic_local_bytes_per_second{group,from,to}    gauge, the same lately
//
// The local series are the traffic matrix's class "local": the rows and
// expert outputs the MoE dispatcher moves through shared memory, which the
// transport (and so sent_bytes) never sees. Pairs that moved none have none.
//
// A group appears once it has formed and every rank of its current epoch
// has reported; a new epoch (a group formed again) restarts its counters,
// which Prometheus reads as a counter reset.
func RegisterControlTraffic(reg prometheus.Registerer, src TrafficSource) error {
	pair := []string{"group", "from", "to"}
	return reg.Register(&trafficCollector{
		src: src,
		sent: prometheus.NewDesc("a2a_control_traffic_sent_bytes_total",
			"Bytes rank from sent rank to since the group formed, as the ranks report them.", pair, nil),
		rate: prometheus.NewDesc("a2a_control_traffic_sent_bytes_per_second",
			"Bytes per second rank from sent rank to over its latest report interval.", pair, nil),
		wait: prometheus.NewDesc("a2a_control_traffic_wait_seconds_total",
			"Seconds rank from waited for rank to's data since the group formed.", pair, nil),
		share: prometheus.NewDesc("a2a_control_traffic_wait_share",
			"Part of rank from's latest report interval spent waiting for rank to.", pair, nil),
		last: prometheus.NewDesc("a2a_control_traffic_last_arrivals_total",
			"Operations of rank from in which rank to arrived last.", pair, nil),
		ops: prometheus.NewDesc("a2a_control_traffic_operations_total",
			"Operations of the group by name and algorithm, as counted by the rank that ran the most.", []string{"group", "op", "algo"}, nil),
		local: prometheus.NewDesc("a2a_control_traffic_local_bytes_total",
			"Bytes rank from moved to rank to through shared memory (the MoE dispatcher's rows), outside its transport.", pair, nil),
		localRate: prometheus.NewDesc("a2a_control_traffic_local_bytes_per_second",
			"Bytes per second rank from moved to rank to through shared memory over its latest report interval.", pair, nil),
	})
}

type trafficCollector struct {
	src                                TrafficSource
	sent, rate, wait, share, last, ops *prometheus.Desc
	local, localRate                   *prometheus.Desc
}

func (c *trafficCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.sent, c.rate, c.wait, c.share, c.last, c.ops, c.local, c.localRate} {
		ch <- d
	}
}

func (c *trafficCollector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range c.src.Groups() {
		tv, ok := c.src.Traffic(g.Group)
		// As the live view: only the current epoch of a formed group,
		// whose matrix has one row per member.
		if !ok || g.Forming || tv.Epoch != g.Epoch || tv.Size != len(g.Ranks) {
			continue
		}
		c.collectGroup(ch, tv)
	}
}

// collectGroup sends the matrices of one group: a row for every rank that
// has reported.
func (c *trafficCollector) collectGroup(ch chan<- prometheus.Metric, tv control.TrafficView) {
	counter, gauge := prometheus.CounterValue, prometheus.GaugeValue
	for from, rt := range tv.Ranks {
		if rt.Reported.IsZero() {
			continue
		}
		f := strconv.Itoa(from)
		for to := range tv.Size {
			t := strconv.Itoa(to)
			if to < len(rt.Sent) {
				ch <- prometheus.MustNewConstMetric(c.sent, counter, float64(rt.Sent[to]), tv.Group, f, t)
			}
			if to < len(rt.SentRate) {
				ch <- prometheus.MustNewConstMetric(c.rate, gauge, rt.SentRate[to], tv.Group, f, t)
			}
			if to < len(rt.Wait) {
				ch <- prometheus.MustNewConstMetric(c.wait, counter, rt.Wait[to].Seconds(), tv.Group, f, t)
			}
			if to < len(rt.WaitShare) {
				ch <- prometheus.MustNewConstMetric(c.share, gauge, rt.WaitShare[to], tv.Group, f, t)
			}
			if to < len(rt.Last) {
				ch <- prometheus.MustNewConstMetric(c.last, counter, float64(rt.Last[to]), tv.Group, f, t)
			}
			if to < len(rt.Local) && to < len(rt.LocalRate) && rt.Local[to] > 0 {
				ch <- prometheus.MustNewConstMetric(c.local, counter, float64(rt.Local[to]), tv.Group, f, t)
				ch <- prometheus.MustNewConstMetric(c.localRate, gauge, rt.LocalRate[to], tv.Group, f, t)
			}
		}
	}
	for _, o := range tv.Ops {
		ch <- prometheus.MustNewConstMetric(c.ops, counter, float64(o.Calls), tv.Group, o.Op, o.Algo)
	}
}
