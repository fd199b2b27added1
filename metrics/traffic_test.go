package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/a2a-moe/a2a/a2a/control"
)

// fakeTraffic is a control-plane service with fixed groups and reports.
type fakeTraffic struct {
	groups  []control.GroupView
	traffic map[string]control.TrafficView
}

func (f fakeTraffic) Groups() []control.GroupView { return f.groups }

func (f fakeTraffic) Traffic(group string) (control.TrafficView, bool) {
	tv, ok := f.traffic[group]
	return tv, ok
}

func TestControlTraffic(t *testing.T) {
	now := time.Now()
	two := []control.RankView{{Rank: 0}, {Rank: 1}}
	src := fakeTraffic{
		groups: []control.GroupView{
			{Group: "job", Epoch: 3, Size: 2, Ranks: two},
			{Group: "stale", Epoch: 5, Size: 2, Ranks: two}, // its report is of epoch 4
			{Group: "forming", Size: 2, Forming: true, Ranks: []control.RankView{{Rank: -1}}},
		},
		traffic: map[string]control.TrafficView{
			"job": {Group: "job", Epoch: 3, Size: 2, Ranks: []control.RankTraffic{
				{Reported: now, Sent: []uint64{0, 1000}, SentRate: []float64{0, 250}, Wait: []time.Duration{0, 1500 * time.Millisecond},
					WaitShare: []float64{0, 0.25}, Last: []uint64{0, 7}},
				{}, // rank 1 has not reported yet
			}, Ops: []control.OpTotal{{Op: "alltoallv", Algo: "ll", Calls: 9, Total: 18}}},
			"stale":   {Group: "stale", Epoch: 4, Size: 2, Ranks: []control.RankTraffic{{Reported: now, Sent: []uint64{1, 1}}, {}}},
			"forming": {Group: "forming", Size: 2},
		},
	}
	reg := prometheus.NewRegistry()
	if err := RegisterControlTraffic(reg, src); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP a2a_control_traffic_sent_bytes_total Bytes rank from sent rank to since the group formed, as the ranks report them.
# TYPE a2a_control_traffic_sent_bytes_total counter
a2a_control_traffic_sent_bytes_total{from="0",group="job",to="0"} 0
a2a_control_traffic_sent_bytes_total{from="0",group="job",to="1"} 1000
# HELP a2a_control_traffic_sent_bytes_per_second Bytes per second rank from sent rank to over its latest report interval.
# TYPE a2a_control_traffic_sent_bytes_per_second gauge
a2a_control_traffic_sent_bytes_per_second{from="0",group="job",to="0"} 0
a2a_control_traffic_sent_bytes_per_second{from="0",group="job",to="1"} 250
# HELP a2a_control_traffic_wait_seconds_total Seconds rank from waited for rank to's data since the group formed.
# TYPE a2a_control_traffic_wait_seconds_total counter
a2a_control_traffic_wait_seconds_total{from="0",group="job",to="0"} 0
a2a_control_traffic_wait_seconds_total{from="0",group="job",to="1"} 1.5
# HELP a2a_control_traffic_wait_share Part of rank from's latest report interval spent waiting for rank to.
# TYPE a2a_control_traffic_wait_share gauge
a2a_control_traffic_wait_share{from="0",group="job",to="0"} 0
a2a_control_traffic_wait_share{from="0",group="job",to="1"} 0.25
# HELP a2a_control_traffic_last_arrivals_total Operations of rank from in which rank to arrived last.
# TYPE a2a_control_traffic_last_arrivals_total counter
a2a_control_traffic_last_arrivals_total{from="0",group="job",to="0"} 0
a2a_control_traffic_last_arrivals_total{from="0",group="job",to="1"} 7
# HELP a2a_control_traffic_operations_total Operations of the group by name and algorithm, as counted by the rank that ran the most.
# TYPE a2a_control_traffic_operations_total counter
a2a_control_traffic_operations_total{algo="ll",group="job",op="alltoallv"} 9
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
