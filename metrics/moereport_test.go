package metrics

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/a2a-moe/a2a/a2a/control"
)

// TestMoEReport: the Observer keeps what the dispatcher tells it for the
// Comm's reports, cumulative, with a version that grows on every change,
// forgets the figures by rank on a shrink, and counts the wire bytes.
func TestMoEReport(t *testing.T) {
	reg := prometheus.NewRegistry()
	o, err := New(reg, Options{Group: "g", Rank: 0})
	if err != nil {
		t.Fatal(err)
	}
	var r control.MoEReport
	if v := o.MoEReport(&r); v != 0 || r.Tokens != nil || r.Local != nil {
		t.Fatalf("fresh observer: version %d, %+v", v, r)
	}
	o.ObserveDispatch(3*time.Millisecond, []int{4, 0, 2}, 1, 1.5)
	o.ObserveRows([]int{1, 5, 0}, "fp8", 600, 312)
	o.ObserveSharedPeer(1, 200, 100)
	o.ObserveCombine(20 * time.Microsecond)
	o.ObserveDispatch(time.Millisecond, []int{1, 1, 1, 1}, 0, 1)
	o.ObserveRows([]int{2, 0, 2}, "fp8", 400, 208)
	o.ObserveLoad([]float64{1, 2}, 1.25)
	o.ObserveReplace(3, 1000, time.Millisecond)
	v1 := o.MoEReport(&r)
	ms := control.MoEBucket(3 * time.Millisecond)
	if v1 == 0 || r.Dispatches != 2 || r.Combines != 1 || !slices.Equal(r.Tokens, []uint64{5, 1, 3, 1}) ||
		!slices.Equal(r.RankRows, []uint64{3, 5, 2}) || r.Dropped != 1 || !slices.Equal(r.Local, []uint64{0, 200, 0}) ||
		len(r.DispatchTime) != control.MoEBuckets || r.DispatchTotal != 4*time.Millisecond || r.CombineTotal != 20*time.Microsecond || r.DispatchTime[ms] != 1 || r.CombineTime[control.MoEBucket(20*time.Microsecond)] != 1 ||
		len(r.Wire) != 1 || r.Wire[0] != (control.WireBytes{Format: "fp8", DType: 1000, Wire: 520}) ||
		r.Replacements != 1 || r.ReplaceBytes != 1000 || r.RankImbalance != 1.25 {
		t.Errorf("report %+v", r)
	}
	// Unchanged figures keep the version; a shrink renumbers the ranks.
	if v := o.MoEReport(&r); v != v1 {
		t.Errorf("version %d, then %d with nothing new", v1, v)
	}
	o.Shrunk([]int{2}, 3, 2)
	if v := o.MoEReport(&r); v == v1 || r.RankRows != nil || r.Local != nil || r.Dispatches != 2 {
		t.Errorf("after a shrink: version %d (was %d), %+v", v, v1, r)
	}
	want := `
# HELP a2a_moe_wire_bytes_total Bytes of the rows this rank dispatched to other ranks, in their wire format.
# TYPE a2a_moe_wire_bytes_total counter
a2a_moe_wire_bytes_total{format="fp8",group="g",rank="0"} 520
# HELP a2a_moe_wire_saved_bytes_total Bytes the wire format saved on the rows this rank dispatched to other ranks, against their element type.
# TYPE a2a_moe_wire_saved_bytes_total counter
a2a_moe_wire_saved_bytes_total{format="fp8",group="g",rank="0"} 480
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "a2a_moe_wire_bytes_total", "a2a_moe_wire_saved_bytes_total"); err != nil {
		t.Error(err)
	}
}
