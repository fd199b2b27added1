package control

import (
	"errors"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// waitTraffic polls svc until ok accepts group's traffic view.
func waitTraffic(t *testing.T, svc *Service, group string, ok func(TrafficView) bool) TrafficView {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, have := svc.Traffic(group)
		if have && ok(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("traffic view of %s never matched; last: %+v (%v)", group, v, have)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestReportTraffic(t *testing.T) {
	e := newEnv(t)
	svc := e.service()
	mems := e.mustJoin(configs("rep", []int{0, 1, 2}, nil))
	r0 := &Report{Seq: 1, Period: time.Second, Elapsed: time.Second, Since: 0,
		Sent: []uint64{0, 1000, 3000}, Wait: []time.Duration{0, 0, 250 * time.Millisecond}, Last: []uint64{0, 0, 7},
		Ops: []OpCount{{"alltoallv", "fullmesh", 10}, {"barrier", "ll", 12}}, Errors: 1}
	if err := mems[0].Report(r0); err != nil {
		t.Fatal(err)
	}
	if err := mems[2].Report(&Report{Seq: 1, Period: time.Second, Elapsed: 2 * time.Second, Since: time.Second,
		Sent: []uint64{500, 0, 0}, Wait: make([]time.Duration, 3), Last: make([]uint64, 3),
		Ops: []OpCount{{"alltoallv", "fullmesh", 11}}}); err != nil {
		t.Fatal(err)
	}
	v := waitTraffic(t, svc, "rep", func(v TrafficView) bool {
		return !v.Ranks[0].Reported.IsZero() && !v.Ranks[2].Reported.IsZero()
	})
	if v.Size != 3 || v.Epoch != mems[0].Epoch() || len(v.Ranks) != 3 {
		t.Fatalf("view %+v", v)
	}
	if !v.Ranks[1].Reported.IsZero() || v.Ranks[1].Sent[0] != 0 {
		t.Errorf("rank 1 never reported, yet %+v", v.Ranks[1])
	}
	rk := v.Ranks[0]
	if rk.Sent[2] != 3000 || rk.SentRate[2] != 3000 || rk.Wait[2] != 250*time.Millisecond || rk.WaitShare[2] != 0.25 ||
		rk.Last[2] != 7 || rk.Errors != 1 {
		t.Errorf("rank 0: %+v", rk)
	}
	// Rank 2's first report covers the second after Since.
	if got := v.Ranks[2].SentRate[0]; got != 500 {
		t.Errorf("rank 2's rate to rank 0 %v, want 500 B/s", got)
	}
	want := []OpTotal{{"alltoallv", "fullmesh", 11, 21}, {"barrier", "ll", 12, 12}}
	if len(v.Ops) != 2 || v.Ops[0] != want[1] || v.Ops[1] != want[0] {
		t.Errorf("ops %+v, want %+v most frequent first", v.Ops, want)
	}

	// The next report: 4000 more bytes over the two seconds after Since
	// (the rank was idle in between); then the report that it went idle.
	r1 := *r0
	r1.Seq, r1.Elapsed, r1.Since = 2, 5*time.Second, 3*time.Second
	r1.Sent = []uint64{0, 1000, 7000}
	if err := mems[0].Report(&r1); err != nil {
		t.Fatal(err)
	}
	waitTraffic(t, svc, "rep", func(v TrafficView) bool { return v.Ranks[0].Sent[2] == 7000 && v.Ranks[0].SentRate[2] == 2000 })
	r2 := r1
	r2.Seq, r2.Elapsed, r2.Since = 3, 6*time.Second, 5*time.Second
	if err := mems[0].Report(&r2); err != nil {
		t.Fatal(err)
	}
	v = waitTraffic(t, svc, "rep", func(v TrafficView) bool { return v.Ranks[0].SentRate[2] == 0 })
	if v.Ranks[0].Sent[2] != 7000 || v.Ranks[0].WaitShare[2] != 0 {
		t.Errorf("idle rank 0: %+v", v.Ranks[0])
	}
	// A duplicate changes nothing.
	if err := mems[0].Report(&r1); err != nil {
		t.Fatal(err)
	}
	if err := mems[0].Report(&Report{Seq: 4, Period: time.Second, Elapsed: 7 * time.Second, Since: 6 * time.Second,
		Sent: []uint64{0, 1000, 7100}, Wait: r0.Wait, Last: r0.Last}); err != nil {
		t.Fatal(err)
	}
	waitTraffic(t, svc, "rep", func(v TrafficView) bool { return v.Ranks[0].SentRate[2] == 100 })

	// Bad reports are refused before they leave.
	if err := mems[0].Report(&Report{Seq: 9, Sent: []uint64{1}, Wait: r0.Wait, Last: r0.Last}); !errors.Is(err, fault.ErrInvalidArgument) {
		t.Errorf("short report: %v", err)
	}
	if _, ok := svc.Traffic("nosuchgroup"); ok {
		t.Error("traffic of an unknown group")
	}

	// Once the group is gone, so is its traffic.
	for _, m := range mems {
		_ = m.Leave()
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, ok := svc.Traffic("rep"); ok; _, ok = svc.Traffic("rep") {
		if time.Now().After(deadline) {
			t.Fatal("traffic of a group every rank left")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReportNeedsDaemonService: a group hosting its own coordinator does not
// collect reports (only a2ad's live view shows them), and a report never
// blocks its rank.
func TestReportNeedsDaemonService(t *testing.T) {
	e := newEnv(t)
	mems := e.mustJoin(configs("selfhost", []int{0, 1}, nil))
	if mems[0].svc == nil && mems[1].svc == nil {
		t.Fatal("no member hosts the coordinator")
	}
	svc := mems[0].svc
	if svc == nil {
		svc = mems[1].svc
	}
	if err := mems[1].Report(&Report{Seq: 1, Elapsed: time.Second, Sent: []uint64{5, 0},
		Wait: make([]time.Duration, 2), Last: make([]uint64, 2)}); err != nil {
		t.Fatal(err)
	}
	if err := mems[1].nc.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if _, ok := svc.Traffic("selfhost"); ok {
		t.Error("an in-process coordinator kept a report")
	}
}
