package main

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/control"
)

// staticSource is a control plane frozen at one view of one group.
type staticSource struct{ tv control.TrafficView }

func (s *staticSource) Groups() []control.GroupView {
	return []control.GroupView{{Group: s.tv.Group, Epoch: s.tv.Epoch, Size: s.tv.Size, Ranks: make([]control.RankView, s.tv.Size)}}
}

func (s *staticSource) Traffic(string) (control.TrafficView, bool) { return s.tv, true }

// TestMoETimeline: serve's samples sum the ranks' rates, mark each
// re-placement once, forget what is older than five minutes, start over on
// a new epoch without marking the re-placements of the old one, and give
// the step quantiles of the last minute.
func TestMoETimeline(t *testing.T) {
	steps := func(at, n int) []uint64 {
		h := make([]uint64, control.MoEBuckets)
		h[at] = uint64(n)
		return h
	}
	rank := func(repl uint64, rate []float64, dispatch []uint64) control.RankTraffic {
		return control.RankTraffic{MoE: &control.RankMoE{MoEReport: control.MoEReport{Tokens: []uint64{1, 2, 3}, Replacements: repl,
			DispatchTime: dispatch, CombineTime: steps(0, 1), RankImbalance: 1.5}, TokenRate: []float64{1, 2, 3}, RankRowRate: rate}}
	}
	src := &staticSource{tv: control.TrafficView{Group: "g", Epoch: 1, Size: 2, Ranks: []control.RankTraffic{
		rank(0, []float64{30, 10}, steps(10, 100)), rank(0, []float64{10, 10}, steps(10, 100))}}}
	tl := newMoETimeline(src)
	t0 := time.Unix(1000, 0)
	tl.sample(t0)
	// Re-placed twice by the next sample, once more by the one after.
	src.tv.Ranks[0].MoE.Replacements, src.tv.Ranks[1].MoE.Replacements = 2, 2
	src.tv.Ranks[0].MoE.DispatchTime = steps2(10, 100, 12, 100) // 100 slower steps since
	tl.sample(t0.Add(90 * time.Second))
	src.tv.Ranks[1].MoE.Replacements = 3
	tl.sample(t0.Add(100 * time.Second))
	now := t0.Add(101 * time.Second)
	m := tl.view(src.tv, now, time.Time{}, tl.cursor())
	if m == nil || len(m.Ages) != 3 || m.Ages[0] != 101 || m.Experts != 3 || m.TokenRate[0][2] != 6 ||
		m.Load[0][0] != 40 || m.Imbalance[0] != 40/30.0 || m.Estimate[0] != 1.5 {
		t.Fatalf("view %+v", m)
	}
	if len(m.ReplaceAges) != 2 || m.ReplaceAges[0] != 11 || m.ReplaceAges[1] != 1 || m.Replacements != 3 ||
		!slices.Equal(m.ReplaceCounts, []uint64{2, 1}) {
		t.Errorf("re-placements at %v, %v of them (%d), want 2 11 s ago and 1 1 s ago", m.ReplaceAges, m.ReplaceCounts, m.Replacements)
	}
	// The last minute: the sample at 90 s back to the one at 0 s is older
	// than a minute, so the base is t0's; 100 steps of bucket 12 since.
	if m.Dispatch.Steps != 100 || m.Dispatch.P50 <= control.MoEBucketBound(11).Seconds() || m.Dispatch.P50 > control.MoEBucketBound(12).Seconds() {
		t.Errorf("dispatch quantiles %+v, want 100 steps in (2048, 4096] µs", m.Dispatch)
	}
	if m.Tokens[2] != 6 || m.Dispatches != 0 {
		t.Errorf("totals %+v", m)
	}

	// Past five minutes the old samples go; a new epoch starts over and
	// does not mark the re-placements its ranks' counts carry.
	tl.sample(t0.Add(6 * time.Minute))
	if m := tl.view(src.tv, t0.Add(6*time.Minute), time.Time{}, tl.cursor()); len(m.Ages) != 3 || m.Ages[0] != 270 || len(m.ReplaceAges) != 2 {
		t.Errorf("after 6 min: ages %v, marks %v; want all but the first sample, both marks", m.Ages, m.ReplaceAges)
	}
	tl.sample(t0.Add(401 * time.Second))
	if m := tl.view(src.tv, t0.Add(401*time.Second), time.Time{}, tl.cursor()); len(m.Ages) != 2 || len(m.ReplaceAges) != 0 {
		t.Errorf("after 401 s: ages %v, marks %v; want the last two samples, no mark", m.Ages, m.ReplaceAges)
	}
	src.tv.Epoch = 2
	src.tv.Ranks[0].MoE.Replacements = 4
	tl.sample(t0.Add(7 * time.Minute))
	if m := tl.view(src.tv, t0.Add(7*time.Minute), time.Time{}, tl.cursor()); len(m.Ages) != 1 || len(m.ReplaceAges) != 0 {
		t.Errorf("new epoch: %d samples, marks %v; want one sample, no mark", len(m.Ages), m.ReplaceAges)
	}
}

func TestQuantiles(t *testing.T) {
	q := quantiles(steps2(10, 100, 20, 1), nil)
	lo, hi := control.MoEBucketBound(9).Seconds(), control.MoEBucketBound(10).Seconds()
	if q.Steps != 101 || math.Abs(q.P50-(lo+(hi-lo)*50.5/100)) > 1e-12 || q.P99 <= lo || q.P99 > hi {
		t.Errorf("quantiles %+v", q)
	}
	if q := quantiles(steps2(10, 100, 20, 100), steps2(10, 100, 20, 0)); q.Steps != 100 || q.P50 <= control.MoEBucketBound(19).Seconds() {
		t.Errorf("quantiles of the difference %+v", q)
	}
	if q := quantiles(nil, nil); q != (uiQuantiles{}) {
		t.Errorf("no steps: %+v", q)
	}
}

func steps2(a, na, b, nb int) []uint64 {
	h := make([]uint64, control.MoEBuckets)
	h[a], h[b] = uint64(na), uint64(nb)
	return h
}

// TestUIHistorySince: /ui/api/groups?since= an earlier answer's moe_cursor
// sends only the MoE samples and re-placement marks taken after it, marked
// partial, so that a page polling every second fetches a second of a
// wide layer's history, not five minutes. A since that is not a time is a
// 400.
func TestUIHistorySince(t *testing.T) {
	const experts, ranks = 256, 8
	mk := func(repl uint64) []control.RankTraffic {
		rs := make([]control.RankTraffic, ranks)
		for r := range rs {
			rate := make([]float64, experts)
			for e := range rate {
				rate[e] = float64(r*experts+e) + 0.25
			}
			rs[r] = control.RankTraffic{MoE: &control.RankMoE{MoEReport: control.MoEReport{Tokens: make([]uint64, experts),
				Replacements: repl, DispatchTime: steps2(3, 1, 4, 1), CombineTime: steps2(3, 1, 4, 1)},
				TokenRate: rate, RankRowRate: make([]float64, ranks)}}
		}
		return rs
	}
	src := &staticSource{tv: control.TrafficView{Group: "g", Epoch: 1, Size: ranks, Ranks: mk(0)}}
	tl := newMoETimeline(src)
	srv := httptest.NewServer(uiHandler(src, tl))
	defer srv.Close()
	get := func(query string) (uiState, int) {
		t.Helper()
		res, err := http.Get(srv.URL + "/ui/api/groups" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		var st uiState
		if res.StatusCode == http.StatusOK {
			if err := json.Unmarshal(body, &st); err != nil {
				t.Fatalf("%s: %v", body, err)
			}
		}
		return st, len(body)
	}

	t0 := time.Now().Add(-10 * time.Minute)
	for i := range 300 { // five minutes, one a second
		tl.sample(t0.Add(time.Duration(i) * time.Second))
	}
	full, fullBytes := get("")
	m := full.Groups[0].MoE
	if m == nil || m.Partial || len(m.Ages) != 300 || len(m.TokenRate) != 300 || m.KeepS != moeKeep.Seconds() {
		t.Fatalf("full answer: partial %v, %d samples, keep %v; want 300, not partial", m.Partial, len(m.Ages), m.KeepS)
	}
	if want := t0.Add(299 * time.Second); !full.MoECursor.Equal(want) {
		t.Fatalf("cursor %v, want the last sample's time %v", full.MoECursor, want)
	}

	// Two more samples, the second with a re-placement.
	tl.sample(t0.Add(300 * time.Second))
	src.tv.Ranks = mk(1)
	tl.sample(t0.Add(301 * time.Second))
	next, nextBytes := get("?since=" + full.MoECursor.Format(time.RFC3339Nano))
	m = next.Groups[0].MoE
	if !m.Partial || len(m.Ages) != 2 || len(m.TokenRate) != 2 || len(m.ReplaceAges) != 1 || m.TokenRate[1][5] != 7210 { // summed over the ranks: 256*(0+...+7) + 8*5.25
		t.Fatalf("partial answer: partial %v, %d samples, marks %v; want the 2 new samples and 1 mark", m.Partial, len(m.Ages), m.ReplaceAges)
	}
	if nextBytes*20 > fullBytes {
		t.Errorf("partial answer %d bytes, full %d: want under a twentieth", nextBytes, fullBytes)
	}
	// Nothing new: no samples, same cursor; the totals are still there.
	same, _ := get("?since=" + next.MoECursor.Format(time.RFC3339Nano))
	if m := same.Groups[0].MoE; !m.Partial || len(m.Ages) != 0 || len(m.ReplaceAges) != 0 || m.Replacements != 1 ||
		!same.MoECursor.Equal(next.MoECursor) {
		t.Errorf("no new samples: %+v, cursor %v", m, same.MoECursor)
	}
	t.Logf("full answer %d bytes, partial %d", fullBytes, nextBytes)

	res, err := http.Get(srv.URL + "/ui/api/groups?since=yesterday")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Errorf("since=yesterday: status %d, want 400", res.StatusCode)
	}
}
