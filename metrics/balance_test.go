package metrics

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestObserveBalance: the load estimate sets one gauge per expert and the
// rank imbalance (NaN ignored), and re-placements count themselves and the
// bytes this rank sent.
func TestObserveBalance(t *testing.T) {
	reg := prometheus.NewRegistry()
	o, err := New(reg, Options{Group: "g", Rank: 1})
	if err != nil {
		t.Fatal(err)
	}
	o.ObserveLoad([]float64{10, 2.5}, 1.8)
	o.ObserveLoad([]float64{12, math.NaN(), 4}, math.NaN())
	o.ObserveReplace(5, 4096, time.Millisecond)
	o.ObserveReplace(0, 0, time.Millisecond)
	want := `
# HELP a2a_moe_expert_load Estimated rows per dispatch of each logical expert over the group (moving average, the same on every rank).
# TYPE a2a_moe_expert_load gauge
a2a_moe_expert_load{expert="0",group="g",rank="1"} 12
a2a_moe_expert_load{expert="1",group="g",rank="1"} 2.5
a2a_moe_expert_load{expert="2",group="g",rank="1"} 4
# HELP a2a_moe_rank_imbalance Max over mean rank load that the load estimate gives under the current placement, replicas included (1 is balanced).
# TYPE a2a_moe_rank_imbalance gauge
a2a_moe_rank_imbalance{group="g",rank="1"} 1.8
# HELP a2a_moe_replacements_total Re-placements of the experts (dispatch.Replace, manual or automatic).
# TYPE a2a_moe_replacements_total counter
a2a_moe_replacements_total{group="g",rank="1"} 2
# HELP a2a_moe_replace_bytes_total Expert parameter bytes this rank sent in re-placements (summed over the ranks: the bytes moved).
# TYPE a2a_moe_replace_bytes_total counter
a2a_moe_replace_bytes_total{group="g",rank="1"} 4096
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "a2a_moe_expert_load", "a2a_moe_rank_imbalance",
		"a2a_moe_replacements_total", "a2a_moe_replace_bytes_total"); err != nil {
		t.Error(err)
	}
}
