package control

import (
	"context"
	"testing"
	"time"
)

func TestBucket(t *testing.T) {
	now := time.Unix(0, 0)
	b := newBucket(10, now)
	n := 0
	for b.take(now) {
		n++
	}
	if n != 10 {
		t.Fatalf("a full bucket gave %d tokens, want 10 (one second's worth)", n)
	}
	if !b.take(now.Add(100*time.Millisecond)) || b.take(now.Add(100*time.Millisecond)) {
		t.Fatal("a tenth of a second later one token, no more")
	}
	n = 0
	for b.take(now.Add(time.Hour)) {
		n++
	}
	if n != 10 {
		t.Fatalf("after an hour %d tokens, want at most a second's worth (10)", n)
	}
}

// TestGroupServiceRate: a service for one group (a2ad serve runs one per
// tenant) drops a flood over its rate as RejectRate, before its MAC is
// checked, serves its group all the same, and does not serve another group.
func TestGroupServiceRate(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	svc, err := StartService(ctx, e.conn(), ServiceConfig{Group: "ten", MaxRate: 200})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	if _, err := StartService(ctx, e.conn(), ServiceConfig{Group: "a.b"}); err == nil {
		t.Fatal("a service for group \"a.b\", two subject tokens")
	}
	flood := e.conn()
	for range 2000 {
		if err := flood.Publish(svcSubject("ten", opCounts), []byte("junk")); err != nil {
			t.Fatal(err)
		}
	}
	if err := flood.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for r := svc.Rejects(); r[RejectRate] == 0 || r.Total() < 2000; r = svc.Rejects() {
		if time.Now().After(deadline) {
			t.Fatalf("rejects %v after a flood of 2000, want most of them rate", r)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r := svc.Rejects(); r[RejectRate] < 1500 || r[RejectAuth] > 400 {
		t.Errorf("rejects %v: the rate limit should drop most of the flood unread", r)
	}
	time.Sleep(time.Second) // the bucket fills again
	mems := e.mustJoin(configs("ten", []int{0, 1}, nil))
	if got := svc.Groups(); len(got) != 1 || got[0].Group != "ten" || got[0].Epoch != mems[0].Epoch() {
		t.Fatalf("groups %+v, want ten formed by this service", got)
	}
	other := e.mustJoin(configs("other", []int{0, 1}, nil)) // hosts its own coordinator
	if other[0].svc == nil && other[1].svc == nil {
		t.Error("group other was served by the service of group ten")
	}
}
