package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/a2a-moe/a2a/a2a/control"
)

func TestControlCollector(t *testing.T) {
	views := []control.GroupView{
		{Group: "job1", Epoch: 7, Size: 3, Ranks: []control.RankView{{Rank: 0}, {Rank: 1, Lost: true}, {Rank: 2, Left: true}}, PendingCounts: 2},
		{Group: "job2", Size: 4, Forming: true, Ranks: []control.RankView{{Rank: -1}}},
	}
	reg := prometheus.NewRegistry()
	if err := RegisterControl(reg, func() []control.GroupView { return views }); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP a2a_control_groups Groups the control-plane service coordinates.
# TYPE a2a_control_groups gauge
a2a_control_groups 2
# HELP a2a_control_members Ranks that joined the group.
# TYPE a2a_control_members gauge
a2a_control_members{group="job1"} 3
a2a_control_members{group="job2"} 1
# HELP a2a_control_lost_members Ranks of the group silent longer than their peer timeout.
# TYPE a2a_control_lost_members gauge
a2a_control_lost_members{group="job1"} 1
a2a_control_lost_members{group="job2"} 0
# HELP a2a_control_group_forming 1 while the group is still waiting for ranks to join.
# TYPE a2a_control_group_forming gauge
a2a_control_group_forming{group="job1"} 0
a2a_control_group_forming{group="job2"} 1
# HELP a2a_control_pending_counts_exchanges Counts exchanges waiting for rows.
# TYPE a2a_control_pending_counts_exchanges gauge
a2a_control_pending_counts_exchanges{group="job1"} 2
a2a_control_pending_counts_exchanges{group="job2"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "a2a_control_groups", "a2a_control_members",
		"a2a_control_lost_members", "a2a_control_group_forming", "a2a_control_pending_counts_exchanges"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "a2a_control_left_members", "a2a_control_group_aborted"); err != nil || n != 4 {
		t.Fatalf("left/aborted series: %d, %v", n, err)
	}
}

func TestControlRejects(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := control.Rejects{3, 1, 0, 2, 0, 5}
	if err := RegisterControlRejects(reg, func() control.Rejects { return r }); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP a2a_control_rejected_messages_total Control messages refused: failed authentication, replayed, of another epoch, from a non-member, malformed, or over the service's rate.
# TYPE a2a_control_rejected_messages_total counter
a2a_control_rejected_messages_total{reason="auth"} 3
a2a_control_rejected_messages_total{reason="epoch"} 0
a2a_control_rejected_messages_total{reason="malformed"} 0
a2a_control_rejected_messages_total{reason="rate"} 5
a2a_control_rejected_messages_total{reason="replay"} 1
a2a_control_rejected_messages_total{reason="sender"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "a2a_control_rejected_messages_total"); err != nil {
		t.Fatal(err)
	}
}
