package metrics

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// dashboardPath is the Grafana dashboard shipped in deploy/.
var dashboardPath = filepath.Join("..", "deploy", "grafana", "a2a-dashboard.json")

// grafanaPanel is the part of a Grafana panel the test reads.
type grafanaPanel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a row's panels
}

type grafanaDashboard struct {
	UID           string         `json:"uid"`
	SchemaVersion int            `json:"schemaVersion"`
	Panels        []grafanaPanel `json:"panels"`
	Annotations   struct {
		List []struct {
			Name string `json:"name"`
			Expr string `json:"expr"`
		} `json:"list"`
	} `json:"annotations"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

// metricName matches a PromQL identifier that names one of our series: every
// identifier starting with the default namespace.
var metricName = regexp.MustCompile(`\ba2a_[a-zA-Z0-9_:]*`)

// exportedNames returns the series names fedRegistry exposes: counter and
// gauge family names, and a histogram family's _bucket, _sum and _count.
func exportedNames(t *testing.T, reg prometheus.Gatherer) map[string]bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[mf.GetName()+s] = true
			}
			continue
		}
		names[mf.GetName()] = true
	}
	return names
}

// TestDashboard keeps deploy/grafana/a2a-dashboard.json in step with the
// code: every series a panel or variable names is one this package exports,
// the panels the spec asks for are there, and all use the ${DS_PROMETHEUS}
// data source variable.
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardPath, err)
	}
	if d.SchemaVersion < 36 || d.UID == "" {
		t.Errorf("schemaVersion %d, uid %q: want >= 36 and a fixed uid", d.SchemaVersion, d.UID)
	}
	exported := exportedNames(t, fedRegistry(t))

	var panels []grafanaPanel
	var walk func(ps []grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			panels = append(panels, p)
		}
	}
	walk(d.Panels)

	used := map[string]bool{}
	ids := map[int]bool{}
	check := func(where, expr string) {
		names := metricName.FindAllString(expr, -1)
		if len(names) == 0 {
			t.Errorf("%s: expression names no a2a series: %s", where, expr)
		}
		for _, n := range names {
			used[n] = true
			if !exported[n] {
				t.Errorf("%s: %s is not exported by package metrics (expr %s)", where, n, expr)
			}
		}
	}
	for _, p := range panels {
		where := "panel " + p.Title
		if ids[p.ID] {
			t.Errorf("%s: duplicate id %d", where, p.ID)
		}
		ids[p.ID] = true
		if p.Datasource == nil || p.Datasource.UID != "${DS_PROMETHEUS}" {
			t.Errorf("%s: datasource %+v, want uid ${DS_PROMETHEUS}", where, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no targets", where)
		}
		for _, tg := range p.Targets {
			check(where, tg.Expr)
		}
	}
	for _, a := range d.Annotations.List {
		check("annotation "+a.Name, a.Expr)
	}
	hasDS := false
	for _, v := range d.Templating.List {
		switch v.Type {
		case "datasource":
			hasDS = hasDS || v.Name == "DS_PROMETHEUS"
		case "query":
			check("variable "+v.Name, v.Definition)
		}
	}
	if !hasDS {
		t.Error("no datasource variable DS_PROMETHEUS")
	}

	// The panels the spec lists, each found by the series it must chart.
	required := map[string]string{
		"collective latency":       "a2a_collective_duration_seconds_bucket",
		"bandwidth sent":           "a2a_sent_bytes_total",
		"bandwidth received":       "a2a_received_bytes_total",
		"load imbalance":           "a2a_moe_load_imbalance_ratio",
		"estimated rank imbalance": "a2a_moe_rank_imbalance",
		"re-placement marks":       "a2a_moe_replacements_total",
		"expert load heatmap":      "a2a_moe_dispatched_tokens_total",
		"dropped tokens":           "a2a_moe_dropped_tokens_total",
		"errors by kind":           "a2a_errors_total",
		"slowest peer":             "a2a_peer_wait_seconds_total",
		"counts-exchange latency":  "a2a_counts_exchange_duration_seconds_bucket",
		"traffic matrix":           "a2a_peer_sent_bytes_total",
		// a2ad serve's control plane: every family RegisterControl exports.
		"control-plane groups":            "a2a_control_groups",
		"control-plane members":           "a2a_control_members",
		"control-plane lost ranks":        "a2a_control_lost_members",
		"control-plane left ranks":        "a2a_control_left_members",
		"control-plane forming groups":    "a2a_control_group_forming",
		"control-plane aborted groups":    "a2a_control_group_aborted",
		"control-plane pending exchanges": "a2a_control_pending_counts_exchanges",
		// Its MoE panel (the live view's), summed over the ranks' reports.
		"group expert load":         "a2a_control_moe_tokens_total",
		"group rank load":           "a2a_control_moe_rank_rows_total",
		"group measured imbalance":  "a2a_control_moe_load_imbalance",
		"group estimated imbalance": "a2a_control_moe_estimated_imbalance",
		"group dropped assignments": "a2a_control_moe_dropped_total",
		"group dispatch latency":    "a2a_control_moe_dispatch_duration_seconds_bucket",
		"group combine latency":     "a2a_control_moe_combine_duration_seconds_bucket",
		"group wire bytes saved":    "a2a_control_moe_wire_saved_bytes_total",
		"group re-placement marks":  "a2a_control_moe_replacements_total",
		"shared-memory traffic":     "a2a_control_traffic_local_bytes_total",
	}
	for what, name := range required {
		if !used[name] {
			t.Errorf("dashboard has no %s panel (no expression on %s)", what, name)
		}
	}
	// Heatmaps: expert load by expert, the traffic matrix by sender and peer.
	heatmap, matrix := false, false
	for _, p := range panels {
		for _, tg := range p.Targets {
			heatmap = heatmap || p.Type == "heatmap" && strings.Contains(tg.Expr, "a2a_moe_dispatched_tokens_total")
			matrix = matrix || p.Type == "heatmap" && strings.Contains(tg.Expr, "a2a_peer_sent_bytes_total") &&
				strings.Contains(tg.Expr, "by (rank, peer)")
		}
	}
	if !heatmap {
		t.Error("dashboard has no heatmap panel of a2a_moe_dispatched_tokens_total")
	}
	if !matrix {
		t.Error("dashboard has no traffic-matrix heatmap: a2a_peer_sent_bytes_total summed by (rank, peer)")
	}
	// The control families have no rank label: a rank filter would match nothing.
	for _, p := range panels {
		for _, tg := range p.Targets {
			if strings.Contains(tg.Expr, "a2a_control_") && strings.Contains(tg.Expr, "rank=~") {
				t.Errorf("panel %s filters a2ad's control families by rank: %s", p.Title, tg.Expr)
			}
		}
	}
	// The MoE steps have their p50 and p99, as the live view shows them.
	for _, fam := range []string{"a2a_moe_dispatch_duration_seconds_bucket", "a2a_moe_combine_duration_seconds_bucket",
		"a2a_control_moe_dispatch_duration_seconds_bucket", "a2a_control_moe_combine_duration_seconds_bucket"} {
		for _, q := range []string{"histogram_quantile(0.5,", "histogram_quantile(0.99,"} {
			found := false
			for _, p := range panels {
				for _, tg := range p.Targets {
					found = found || strings.Contains(tg.Expr, q) && strings.Contains(tg.Expr, fam)
				}
			}
			if !found {
				t.Errorf("dashboard has no %s of %s", q, fam)
			}
		}
	}
	// Quantiles use the histograms' buckets, per op for the collectives.
	for _, p := range panels {
		for _, tg := range p.Targets {
			if strings.Contains(tg.Expr, "histogram_quantile") && !strings.Contains(tg.Expr, "_bucket") {
				t.Errorf("panel %s: histogram_quantile without _bucket: %s", p.Title, tg.Expr)
			}
		}
	}
	if testing.Verbose() {
		names := make([]string, 0, len(used))
		for n := range used {
			names = append(names, n)
		}
		sort.Strings(names)
		t.Logf("dashboard uses %d series names: %s", len(names), strings.Join(names, " "))
	}
}

// TestDashboardCatchesDrift proves the name check above bites: a renamed
// family is reported.
func TestDashboardCatchesDrift(t *testing.T) {
	exported := exportedNames(t, fedRegistry(t))
	for _, tt := range []struct {
		expr string
		ok   bool
	}{
		{`rate(a2a_sent_bytes_total[5m])`, true},
		{`histogram_quantile(0.5, sum by (le) (rate(a2a_collective_duration_seconds_bucket[5m])))`, true},
		{`rate(a2a_bytes_sent_total[5m])`, false},
		{`a2a_collective_duration_seconds`, false}, // a histogram has no bare series
		{`rate(a2a_moe_dispatched_tokens_total_bucket[5m])`, false},
	} {
		allOK := true
		for _, n := range metricName.FindAllString(tt.expr, -1) {
			allOK = allOK && exported[n]
		}
		if allOK != tt.ok {
			t.Errorf("%s: exported=%v, want %v", tt.expr, allOK, tt.ok)
		}
	}
}
