package a2a

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a/control"
)

// daemonService runs an a2ad-style control service (the one that keeps
// traffic reports) on the NATS server at url, started before any rank joins
// so the ranks use it rather than hosting their own.
func daemonService(t *testing.T, url string) *control.Service {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := control.NewService(nc, []byte("s3cret"), discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close(); nc.Close() })
	return svc
}

// TestTrafficReports: the ranks report what they sent each peer, which peer
// they waited on, and their operations by algorithm, and the service's view
// shows it; a slow rank is the one the others wait on.
func TestTrafficReports(t *testing.T) {
	url := startNATS(t)
	svc := daemonService(t, url)
	const n, slow = 3, 2
	comms := group(t, url, n, func(c *Config) { c.Report, c.Algo = 20*time.Millisecond, "fullmesh" })
	const size, iters = 1000, 6
	// The others tell the slow rank when they enter each call, and it
	// sleeps from there. A sleep alone counted from the end of the last
	// call, which a rank the loaded machine delays may still be leaving:
	// under make test, rank 1 once arrived last 4 times, the slow rank 3.
	entered := make(chan struct{}, iters*(n-1))
	mustAll(t, onAll(comms, func(c *Comm) error {
		counts := []int{size, size, size}
		send, recv := make([]byte, n*size), make([]byte, n*size)
		for range iters {
			if c.Rank() == slow {
				for range n - 1 {
					<-entered
				}
				time.Sleep(20 * time.Millisecond)
			} else {
				entered <- struct{}{}
			}
			if err := c.AllToAllV(context.Background(), send, counts, recv, counts); err != nil {
				return err
			}
		}
		return c.Barrier(context.Background())
	}))
	name := comms[0].Config().Group
	var v control.TrafficView
	deadline := time.Now().Add(10 * time.Second)
	for {
		var ok bool
		v, ok = svc.Traffic(name)
		if ok && reportsDone(v, iters) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the view never showed every rank's %d AllToAllV: %+v", iters, v)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i, rk := range v.Ranks {
		for j := range n {
			// Every exchange carries at least size bytes to each peer.
			if j != i && rk.Sent[j] < iters*size {
				t.Errorf("rank %d sent rank %d %d bytes, want >= %d", i, j, rk.Sent[j], iters*size)
			}
		}
		if rk.Sent[i] != 0 || rk.Errors != 0 {
			t.Errorf("rank %d: sent itself %d bytes, %d errors", i, rk.Sent[i], rk.Errors)
		}
		if i == slow {
			continue
		}
		// The slow rank arrives last in most exchanges, and is waited on.
		for j := range n {
			if j != slow && rk.Last[j] > rk.Last[slow] {
				t.Errorf("rank %d: rank %d arrived last %d times, the slow rank %d only %d", i, j, rk.Last[j], slow, rk.Last[slow])
			}
		}
		if rk.Wait[slow] <= 0 {
			t.Errorf("rank %d never waited on the slow rank: %v", i, rk.Wait)
		}
	}
	want := map[[2]string]uint64{{"alltoallv", "fullmesh"}: iters}
	for _, o := range v.Ops {
		if w, ok := want[[2]string{o.Op, o.Algo}]; ok && (o.Calls != w || o.Total != n*w) {
			t.Errorf("%+v, want %d calls on every rank", o, w)
		}
		delete(want, [2]string{o.Op, o.Algo})
	}
	if len(want) != 0 {
		t.Errorf("ops %+v lack %v", v.Ops, want)
	}
	// Close stops the reporter.
	for _, c := range comms {
		c.Close()
		select {
		case <-c.rep.done:
		default:
			t.Errorf("rank %d: reporter still running after Close", c.Rank())
		}
	}
}

// reportsDone reports whether every rank's report shows iters AllToAllV.
func reportsDone(v control.TrafficView, iters uint64) bool {
	for _, rk := range v.Ranks {
		if rk.Reported.IsZero() {
			return false
		}
	}
	for _, o := range v.Ops {
		if o.Op == "alltoallv" {
			return o.Total == uint64(len(v.Ranks))*iters
		}
	}
	return false
}

// moeFigures is an Observer whose MoE figures a test sets: a layer above
// the Comm in miniature.
type moeFigures struct {
	mu  sync.Mutex
	ver uint64
	m   control.MoEReport
}

func (*moeFigures) OpDone(OpEvent)                       {}
func (*moeFigures) CountsExchanged(time.Duration, error) {}
func (o *moeFigures) MoEReport(dst *control.MoEReport) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	*dst = o.m
	return o.ver
}

// TestTrafficReportsMoE: an Observer that keeps MoE figures has them
// carried by the Comm's reports, with the figures by rank dropped when they
// do not fit the group, and a change alone is enough for a new report.
func TestTrafficReportsMoE(t *testing.T) {
	url := startNATS(t)
	svc := daemonService(t, url)
	obs := []*moeFigures{
		{ver: 1, m: control.MoEReport{Dispatches: 1, Tokens: []uint64{3, 4}, RankRows: []uint64{3, 4}, Local: []uint64{0, 99}}},
		{ver: 1, m: control.MoEReport{Dispatches: 1, Tokens: make([]uint64, control.MaxReportExperts+1), RankRows: []uint64{1, 2, 3},
			Local: []uint64{7, 0}}},
	}
	comms := group(t, url, 2, func(c *Config) { c.Report, c.Observer = 20*time.Millisecond, obs[c.Rank] })
	rankOf := obs
	name := comms[0].Config().Group
	wait := func(ok func(v control.TrafficView) bool) control.TrafficView {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			v, have := svc.Traffic(name)
			if have && ok(v) {
				return v
			}
			if time.Now().After(deadline) {
				t.Fatalf("the view never showed the MoE figures: %+v", v)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	v := wait(func(v control.TrafficView) bool { return v.Ranks[0].MoE != nil && v.Ranks[1].MoE != nil })
	for r, rk := range v.Ranks {
		want := rankOf[r].m
		if fits := len(want.Tokens) <= control.MaxReportExperts; fits != (len(rk.MoE.Tokens) == len(want.Tokens)) ||
			(!fits && rk.MoE.Tokens != nil) || (fits && rk.MoE.Tokens[1] != want.Tokens[1]) {
			t.Errorf("rank %d: tokens %d, want %d or none past the limit", r, len(rk.MoE.Tokens), len(want.Tokens))
		}
		if fits := len(want.RankRows) == 2; fits != (len(rk.MoE.RankRows) == 2) || (fits && rk.Local[1] != 99) {
			t.Errorf("rank %d: rows by rank %v, local %v from %+v", r, rk.MoE.RankRows, rk.Local, want)
		}
	}
	// No operation runs: the new figures alone make a report.
	o := rankOf[0]
	o.mu.Lock()
	o.ver, o.m.Dispatches, o.m.Dropped = 2, 2, 5
	o.mu.Unlock()
	wait(func(v control.TrafficView) bool { return v.Ranks[0].MoE.Dropped == 5 && v.Ranks[0].MoE.Dispatches == 2 })
}

// TestTrafficReportsOff: a negative Config.Report runs no reporter.
func TestTrafficReportsOff(t *testing.T) {
	url := startNATS(t)
	svc := daemonService(t, url)
	comms := group(t, url, 2, func(c *Config) { c.Report = -1 })
	mustAll(t, onAll(comms, func(c *Comm) error { return c.Barrier(context.Background()) }))
	if comms[0].rep != nil || comms[1].rep != nil {
		t.Fatal("reporter running with Report < 0")
	}
	time.Sleep(50 * time.Millisecond)
	if v, ok := svc.Traffic(comms[0].Config().Group); ok {
		t.Errorf("reports arrived: %+v", v)
	}
}

// TestTallyCounts: the tally counts operations by name and algorithm,
// errors apart, and attributes waits to the last peer.
func TestTallyCounts(t *testing.T) {
	tl := newTally(3)
	tl.add("alltoallv", 2, 1, 5*time.Millisecond, nil)
	tl.add("alltoallv", 2, 1, time.Millisecond, nil)
	tl.add("barrier", 4, -1, 0, nil)
	tl.add("send", 9, 2, time.Second, context.Canceled)
	tl.add("nosuchop", 2, 0, time.Second, nil)
	if tl.ops[0][2] != 2 || tl.ops[12][4] != 1 || tl.ops[13][9] != 1 || tl.errors != 1 {
		t.Errorf("ops %v errors %d", tl.ops, tl.errors)
	}
	if tl.wait[1] != 6*time.Millisecond || tl.last[1] != 2 || tl.wait[2] != 0 || tl.wait[0] != time.Second {
		t.Errorf("wait %v last %v", tl.wait, tl.last)
	}
	for i, name := range reportOps {
		if reportOp(name) != i {
			t.Errorf("reportOp(%q) = %d, want %d", name, reportOp(name), i)
		}
	}
	var cp tally
	tl.copyTo(&cp)
	if !cp.equal(&tl) {
		t.Error("copy differs")
	}
	cp.last[0]++
	if cp.equal(&tl) {
		t.Error("a changed copy is equal")
	}
}
