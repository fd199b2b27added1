package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/a2a-moe/a2a/a2a/control"
)

// moeTraffic is a control-plane service whose group "moe" has two ranks
// reporting MoE figures, rank 0 with shared-memory bytes to rank 1.
func moeTraffic() fakeTraffic {
	now := time.Now()
	hist := func(at int) []uint64 {
		h := make([]uint64, control.MoEBuckets)
		h[at] = 2
		return h
	}
	r0 := &control.RankMoE{MoEReport: control.MoEReport{Dispatches: 2, Combines: 2, Tokens: []uint64{6, 2}, RankRows: []uint64{5, 3},
		Dropped: 1, DispatchTime: hist(10), CombineTime: hist(3), DispatchTotal: 2 * time.Millisecond, CombineTotal: 16 * time.Microsecond,
		Wire: []control.WireBytes{{Format: "fp8", DType: 1000, Wire: 520}}, Replacements: 1, ReplaceBytes: 64, RankImbalance: 1.25},
		RankRowRate: []float64{30, 10}}
	r1 := &control.RankMoE{MoEReport: control.MoEReport{Dispatches: 2, Combines: 2, Tokens: []uint64{1, 1}, RankRows: []uint64{1, 1},
		DispatchTime: hist(11), CombineTime: hist(3), DispatchTotal: 4 * time.Millisecond, CombineTotal: 16 * time.Microsecond,
		Wire: []control.WireBytes{{Format: "fp8", DType: 500, Wire: 260}}, Replacements: 1, ReplaceBytes: 32, RankImbalance: 1.25},
		RankRowRate: []float64{10, 10}}
	two := []control.RankView{{Rank: 0}, {Rank: 1}}
	return fakeTraffic{
		groups: []control.GroupView{{Group: "moe", Epoch: 2, Size: 2, Ranks: two}},
		traffic: map[string]control.TrafficView{"moe": {Group: "moe", Epoch: 2, Size: 2, Ranks: []control.RankTraffic{
			{Reported: now, Sent: []uint64{0, 10}, SentRate: []float64{0, 1}, Wait: make([]time.Duration, 2), WaitShare: []float64{0, 0},
				Last: []uint64{0, 0}, Local: []uint64{0, 4096}, LocalRate: []float64{0, 512}, MoE: r0},
			{Reported: now, Sent: []uint64{10, 0}, SentRate: []float64{1, 0}, Wait: make([]time.Duration, 2), WaitShare: []float64{0, 0},
				Last: []uint64{0, 0}, Local: []uint64{0, 0}, LocalRate: []float64{0, 0}, MoE: r1},
		}}},
	}
}

// TestControlMoE: serve's MoE series sum the ranks' figures of a group, the
// re-placements counted once, and the traffic matrix's local class has the
// pairs that moved shared-memory bytes.
func TestControlMoE(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := RegisterControlMoE(reg, moeTraffic()); err != nil {
		t.Fatal(err)
	}
	if err := RegisterControlTraffic(reg, moeTraffic()); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP a2a_control_moe_tokens_total Rows the group's ranks dispatched to each expert.
# TYPE a2a_control_moe_tokens_total counter
a2a_control_moe_tokens_total{expert="0",group="moe"} 7
a2a_control_moe_tokens_total{expert="1",group="moe"} 3
# HELP a2a_control_moe_rank_rows_total Rows the group's ranks dispatched to each rank: its load.
# TYPE a2a_control_moe_rank_rows_total counter
a2a_control_moe_rank_rows_total{group="moe",rank="0"} 6
a2a_control_moe_rank_rows_total{group="moe",rank="1"} 4
# HELP a2a_control_moe_load_imbalance Max over mean rows per second to a rank over the latest report intervals (1 is balanced, 0 idle).
# TYPE a2a_control_moe_load_imbalance gauge
a2a_control_moe_load_imbalance{group="moe"} 1.3333333333333333
# HELP a2a_control_moe_estimated_imbalance Max over mean rank load the dispatchers' load estimate gives under their current placement (0: none).
# TYPE a2a_control_moe_estimated_imbalance gauge
a2a_control_moe_estimated_imbalance{group="moe"} 1.25
# HELP a2a_control_moe_dropped_total Token assignments the group's ranks dropped over capacity.
# TYPE a2a_control_moe_dropped_total counter
a2a_control_moe_dropped_total{group="moe"} 1
# HELP a2a_control_moe_wire_bytes_total Bytes of the rows the group's ranks dispatched to other ranks, in their wire format.
# TYPE a2a_control_moe_wire_bytes_total counter
a2a_control_moe_wire_bytes_total{format="fp8",group="moe"} 780
# HELP a2a_control_moe_wire_saved_bytes_total Bytes the wire format saved on those rows against their element type.
# TYPE a2a_control_moe_wire_saved_bytes_total counter
a2a_control_moe_wire_saved_bytes_total{format="fp8",group="moe"} 720
# HELP a2a_control_moe_replacements_total Re-placements of the group's experts.
# TYPE a2a_control_moe_replacements_total counter
a2a_control_moe_replacements_total{group="moe"} 1
# HELP a2a_control_moe_replace_bytes_total Expert parameter bytes the re-placements moved.
# TYPE a2a_control_moe_replace_bytes_total counter
a2a_control_moe_replace_bytes_total{group="moe"} 96
# HELP a2a_control_traffic_local_bytes_total Bytes rank from moved to rank to through shared memory (the MoE dispatcher's rows), outside its transport.
# TYPE a2a_control_traffic_local_bytes_total counter
a2a_control_traffic_local_bytes_total{from="0",group="moe",to="1"} 4096
# HELP a2a_control_traffic_local_bytes_per_second Bytes per second rank from moved to rank to through shared memory over its latest report interval.
# TYPE a2a_control_traffic_local_bytes_per_second gauge
a2a_control_traffic_local_bytes_per_second{from="0",group="moe",to="1"} 512
`
	names := []string{"a2a_control_moe_tokens_total", "a2a_control_moe_rank_rows_total", "a2a_control_moe_load_imbalance",
		"a2a_control_moe_estimated_imbalance", "a2a_control_moe_dropped_total", "a2a_control_moe_wire_bytes_total",
		"a2a_control_moe_wire_saved_bytes_total", "a2a_control_moe_replacements_total", "a2a_control_moe_replace_bytes_total",
		"a2a_control_traffic_local_bytes_total", "a2a_control_traffic_local_bytes_per_second"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	// The step histograms: both ranks' steps, their summed durations.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "a2a_control_moe_dispatch_duration_seconds":
			h := mf.GetMetric()[0].GetHistogram()
			if h.GetSampleCount() != 4 || h.GetSampleSum() != 0.006 || h.GetBucket()[10].GetCumulativeCount() != 2 ||
				h.GetBucket()[11].GetCumulativeCount() != 4 || h.GetBucket()[10].GetUpperBound() != 1024e-6 {
				t.Errorf("dispatch histogram %v", h)
			}
		case "a2a_control_moe_combine_duration_seconds":
			if h := mf.GetMetric()[0].GetHistogram(); h.GetSampleCount() != 4 {
				t.Errorf("combine histogram %v", h)
			}
		}
	}
}
