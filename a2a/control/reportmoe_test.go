package control

import (
	"errors"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// TestReportMoE: a report's MoE figures reach the service's view, with the
// rates of the interval between two reports, and misfit ones are refused.
func TestReportMoE(t *testing.T) {
	e := newEnv(t)
	svc := e.service()
	mems := e.mustJoin(configs("moerep", []int{0, 1}, nil))
	hist := func(at, n int) []uint64 {
		h := make([]uint64, MoEBuckets)
		h[at] = uint64(n)
		return h
	}
	m1 := &MoEReport{Dispatches: 2, Combines: 2, Tokens: []uint64{10, 30, 0}, RankRows: []uint64{10, 30}, Dropped: 1,
		DispatchTime: hist(10, 2), CombineTime: hist(9, 2), DispatchTotal: 2 * time.Millisecond, CombineTotal: time.Millisecond, Local: []uint64{0, 4000},
		Wire: []WireBytes{{Format: "fp8", DType: 1000, Wire: 300}}, Replacements: 1, ReplaceBytes: 512, RankImbalance: 1.5}
	r := &Report{Seq: 1, Period: time.Second, Elapsed: time.Second, Sent: []uint64{0, 100}, Wait: make([]time.Duration, 2),
		Last: make([]uint64, 2), MoE: m1}
	if err := mems[1].Report(r); err != nil {
		t.Fatal(err)
	}
	v := waitTraffic(t, svc, "moerep", func(v TrafficView) bool { return v.Ranks[1].MoE != nil })
	got := v.Ranks[1].MoE
	if got.Dispatches != 2 || got.Tokens[1] != 30 || got.RankRows[1] != 30 || got.Dropped != 1 || got.DispatchTime[10] != 2 ||
		got.CombineTime[9] != 2 || got.DispatchTotal != 2*time.Millisecond || got.CombineTotal != time.Millisecond || len(got.Wire) != 1 || got.Wire[0] != m1.Wire[0] || got.Replacements != 1 ||
		got.ReplaceBytes != 512 || got.RankImbalance != 1.5 || v.Ranks[1].Local[1] != 4000 {
		t.Errorf("first MoE report: %+v, local %v", got, v.Ranks[1].Local)
	}
	if v.Ranks[0].MoE != nil || v.Ranks[0].Local[1] != 0 {
		t.Errorf("rank 0 reported no MoE figures, yet %+v", v.Ranks[0])
	}

	// Two seconds later: 20 more rows to expert 0, 4 more drops, 2000 more
	// local bytes.
	m2 := *m1
	m2.Tokens, m2.RankRows, m2.Dropped, m2.Local = []uint64{30, 30, 0}, []uint64{30, 30}, 5, []uint64{0, 6000}
	r2 := *r
	r2.Seq, r2.Elapsed, r2.Since, r2.MoE = 2, 3*time.Second, time.Second, &m2
	if err := mems[1].Report(&r2); err != nil {
		t.Fatal(err)
	}
	v = waitTraffic(t, svc, "moerep", func(v TrafficView) bool { return v.Ranks[1].MoE.Dropped == 5 })
	got = v.Ranks[1].MoE
	if got.TokenRate[0] != 10 || got.TokenRate[1] != 0 || got.RankRowRate[0] != 10 || got.DroppedRate != 2 ||
		v.Ranks[1].LocalRate[1] != 1000 {
		t.Errorf("rates %v %v %v, local %v", got.TokenRate, got.RankRowRate, got.DroppedRate, v.Ranks[1].LocalRate)
	}

	bad := []MoEReport{
		{RankRows: []uint64{1}},
		{Local: []uint64{1, 2, 3}},
		{DispatchTime: []uint64{1}},
		{Tokens: make([]uint64, MaxReportExperts+1)},
		{Wire: []WireBytes{{Format: "a-wire-format-name-far-too-long-to-keep"}}},
	}
	for i := range bad {
		r3 := *r
		r3.Seq, r3.MoE = 9, &bad[i]
		if err := mems[1].Report(&r3); !errors.Is(err, fault.ErrInvalidArgument) {
			t.Errorf("MoE report %+v: %v, want ErrInvalidArgument", bad[i], err)
		}
	}
}

func TestMoEBucket(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int
	}{{0, 0}, {time.Microsecond, 0}, {time.Microsecond + 1, 1}, {time.Millisecond, 10}, {time.Hour, MoEBuckets - 1}} {
		if got := MoEBucket(c.d); got != c.want {
			t.Errorf("MoEBucket(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}
