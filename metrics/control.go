package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/a2a-moe/a2a/a2a/control"
)

// controlCollector reports the control-plane service's view of its groups at
// scrape time, so the numbers are never stale and the service keeps no
// Prometheus state of its own.
type controlCollector struct {
	groups  func() []control.GroupView
	count   *prometheus.Desc
	members *prometheus.Desc
	lost    *prometheus.Desc
	left    *prometheus.Desc
	forming *prometheus.Desc
	aborted *prometheus.Desc
	pending *prometheus.Desc
}

// RegisterControl registers the metrics of a control-plane service (a2ad
// serve) on reg: groups served, and per group its members, lost and departed
// ranks, whether it is forming or aborted, and counts operations in flight.
func RegisterControl(reg prometheus.Registerer, groups func() []control.GroupView) error {
	g := []string{"group"}
	c := &controlCollector{
		groups:  groups,
		count:   prometheus.NewDesc("a2a_control_groups", "Groups the control-plane service coordinates.", nil, nil),
		members: prometheus.NewDesc("a2a_control_members", "Ranks that joined the group.", g, nil),
		lost:    prometheus.NewDesc("a2a_control_lost_members", "Ranks of the group silent longer than their peer timeout.", g, nil),
		left:    prometheus.NewDesc("a2a_control_left_members", "Ranks that left the group.", g, nil),
		forming: prometheus.NewDesc("a2a_control_group_forming", "1 while the group is still waiting for ranks to join.", g, nil),
		aborted: prometheus.NewDesc("a2a_control_group_aborted", "1 once the group was aborted.", g, nil),
		pending: prometheus.NewDesc("a2a_control_pending_counts_exchanges", "Counts exchanges waiting for rows.", g, nil),
	}
	return reg.Register(c)
}

func (c *controlCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.count, c.members, c.lost, c.left, c.forming, c.aborted, c.pending} {
		ch <- d
	}
}

func (c *controlCollector) Collect(ch chan<- prometheus.Metric) {
	views := c.groups()
	ch <- prometheus.MustNewConstMetric(c.count, prometheus.GaugeValue, float64(len(views)))
	for _, v := range views {
		var lost, left int
		for _, r := range v.Ranks {
			if r.Lost {
				lost++
			}
			if r.Left {
				left++
			}
		}
		ch <- prometheus.MustNewConstMetric(c.members, prometheus.GaugeValue, float64(len(v.Ranks)), v.Group)
		ch <- prometheus.MustNewConstMetric(c.lost, prometheus.GaugeValue, float64(lost), v.Group)
		ch <- prometheus.MustNewConstMetric(c.left, prometheus.GaugeValue, float64(left), v.Group)
		ch <- prometheus.MustNewConstMetric(c.forming, prometheus.GaugeValue, b2f(v.Forming), v.Group)
		ch <- prometheus.MustNewConstMetric(c.aborted, prometheus.GaugeValue, b2f(v.Aborted), v.Group)
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(v.PendingCounts), v.Group)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// RegisterControlRejects registers a2a_control_rejected_messages_total on
// reg: the control messages a service (control.Service.Rejects) or a rank
// (a2a.Comm.ControlRejects) refused to believe, by reason (auth: forged,
// corrupted or signed with another secret; replay; epoch; sender; malformed;
// rate: dropped over a service's message rate),
// read from rejects at each scrape. Wrap reg with the group and rank labels
// for a rank's.
func RegisterControlRejects(reg prometheus.Registerer, rejects func() control.Rejects) error {
	return reg.Register(&rejectsCollector{rejects: rejects, desc: prometheus.NewDesc("a2a_control_rejected_messages_total",
		"Control messages refused: failed authentication, replayed, of another epoch, from a non-member, malformed, or over the service's rate.",
		[]string{"reason"}, nil)})
}

type rejectsCollector struct {
	rejects func() control.Rejects
	desc    *prometheus.Desc
}

func (c *rejectsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *rejectsCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.rejects()
	for i, n := range r {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(n), control.RejectReason(i).String())
	}
}
