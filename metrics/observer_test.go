package metrics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/a2a-moe/a2a/a2a"
)

// newObserver returns an Observer of group "g", rank 2 on a fresh registry.
func newObserver(t testing.TB) (*Observer, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	o, err := New(reg, Options{Group: "g", Rank: 2})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return o, reg
}

// series gathers reg into "name{label=value,...}" -> value, with the constant
// labels group and rank left out (checked by TestConstLabels) and histograms
// flattened to name_count and name_sum.
func series(t testing.TB, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	return rankSeries(t, reg, "")
}

// rankSeries is series restricted to the series of one rank ("": all).
func rankSeries(t testing.TB, reg prometheus.Gatherer, rank string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
	metrics:
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "rank":
					if rank != "" && lp.GetValue() != rank {
						continue metrics
					}
				case "group":
				default:
					ls = append(ls, lp.GetName()+"="+lp.GetValue())
				}
			}
			sort.Strings(ls)
			key := func(suffix string) string {
				if len(ls) == 0 {
					return mf.GetName() + suffix
				}
				return mf.GetName() + suffix + "{" + strings.Join(ls, ",") + "}"
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[key("")] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[key("")] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[key("_count")] = float64(m.GetHistogram().GetSampleCount())
				out[key("_sum")] = m.GetHistogram().GetSampleSum()
			default:
				t.Fatalf("unexpected type %v of %s", mf.GetType(), mf.GetName())
			}
		}
	}
	return out
}

func wrapKind(kind error, cause error) error {
	return &a2a.Error{Kind: kind, Rank: 1, Detail: "test", Err: cause}
}

func TestErrorKind(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{nil, ""},
		{a2a.ErrInvalidArgument, KindInvalidArgument},
		{fmt.Errorf("plan: %w", a2a.ErrInvalidArgument), KindInvalidArgument},
		{wrapKind(a2a.ErrMismatch, nil), KindMismatch},
		{wrapKind(a2a.ErrPeerLost, errors.New("EOF")), KindPeerLost},
		{wrapKind(a2a.ErrTimeout, context.DeadlineExceeded), KindTimeout},
		{wrapKind(a2a.ErrClosed, nil), KindClosed},
		{wrapKind(a2a.ErrAborted, nil), KindAborted},
		{wrapKind(a2a.ErrAborted, context.Canceled), KindAborted},
		// An abort names its root cause.
		{wrapKind(a2a.ErrAborted, wrapKind(a2a.ErrPeerLost, nil)), KindPeerLost},
		{wrapKind(a2a.ErrAborted, wrapKind(a2a.ErrTimeout, nil)), KindTimeout},
		{wrapKind(a2a.ErrAborted, wrapKind(a2a.ErrMismatch, nil)), KindMismatch},
		{context.DeadlineExceeded, KindTimeout},
		{context.Canceled, KindAborted},
		{errors.New("disk on fire"), KindOther},
	}
	for _, tt := range tests {
		if got := ErrorKind(tt.err); got != tt.want {
			t.Errorf("ErrorKind(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

// event is one call into the Observer.
type event func(o *Observer)

func opDone(ev a2a.OpEvent) event { return func(o *Observer) { o.OpDone(ev) } }

func TestEvents(t *testing.T) {
	ok := func(op, algo string, d time.Duration, sent, recv int64, last int, wait time.Duration) event {
		return opDone(a2a.OpEvent{Op: op, Algo: algo, Rank: 2, Size: 4, BytesSent: sent, BytesReceived: recv, Duration: d, LastPeer: last, LastWait: wait})
	}
	failed := func(op, algo string, err error) event {
		return opDone(a2a.OpEvent{Op: op, Algo: algo, Rank: 2, Size: 4, BytesSent: 100, BytesReceived: 100, Duration: time.Second, Err: err, LastPeer: 1, LastWait: time.Second})
	}
	const (
		dur  = "a2a_collective_duration_seconds"
		sel  = "a2a_algorithm_selections_total"
		errs = "a2a_errors_total"
	)
	tests := []struct {
		name   string
		events []event
		want   map[string]float64
	}{
		{
			name: "fresh observer exports known label values at zero",
			want: map[string]float64{
				"a2a_sent_bytes_total{peer_class=self}":        0,
				"a2a_sent_bytes_total{peer_class=local}":       0,
				"a2a_sent_bytes_total{peer_class=remote}":      0,
				"a2a_received_bytes_total{peer_class=remote}":  0,
				"a2a_counts_exchange_errors_total{kind=other}": 0,
				"a2a_counts_exchange_duration_seconds_count":   0,
				"a2a_membership_size":                          0,
				"a2a_rejected_connections_total":               0,
				"a2a_moe_dropped_tokens_total":                 0,
			},
		},
		{
			name: "successful collectives",
			events: []event{
				ok("alltoallv", "pairwise", 2*time.Millisecond, 300, 500, 3, time.Millisecond),
				ok("alltoallv", "pairwise", 4*time.Millisecond, 100, 100, 3, 3*time.Millisecond),
				ok("alltoallv", "fullmesh", time.Millisecond, 10, 20, 0, 500*time.Microsecond),
				ok("alltoall", "pairwise", time.Millisecond, 1, 2, -1, 0),
			},
			want: map[string]float64{
				dur + "_count{algo=pairwise,op=alltoallv}":    2,
				dur + "_sum{algo=pairwise,op=alltoallv}":      0.006,
				dur + "_count{algo=fullmesh,op=alltoallv}":    1,
				dur + "_count{algo=pairwise,op=alltoall}":     1,
				sel + "{algo=pairwise,op=alltoallv}":          2,
				sel + "{algo=fullmesh,op=alltoallv}":          1,
				sel + "{algo=pairwise,op=alltoall}":           1,
				errs + "{kind=timeout,op=alltoallv}":          0,
				errs + "{kind=other,op=alltoall}":             0,
				"a2a_sent_bytes_total{peer_class=remote}":     411,
				"a2a_received_bytes_total{peer_class=remote}": 622,
				"a2a_sent_bytes_total{peer_class=self}":       0,
				"a2a_membership_size":                         4,
				"a2a_peer_wait_seconds_total{peer=3}":         0.004,
				"a2a_peer_last_arrivals_total{peer=3}":        2,
				"a2a_peer_wait_seconds_total{peer=0}":         0.0005,
				"a2a_peer_last_arrivals_total{peer=0}":        1,
				// Peers below the highest seen are exported at zero.
				"a2a_peer_last_arrivals_total{peer=1}": 0,
			},
		},
		{
			name: "bytes split by peer class",
			events: []event{
				opDone(a2a.OpEvent{Op: "allgather", Algo: "ring", Size: 4, BytesSent: 300, BytesSentLocal: 100, BytesReceived: 50, BytesReceivedLocal: 50, LastPeer: -1}),
				// Inconsistent figures never count negative bytes.
				opDone(a2a.OpEvent{Op: "allgather", Algo: "ring", Size: 4, BytesSent: 10, BytesSentLocal: 25, BytesReceived: 5, BytesReceivedLocal: -3, LastPeer: -1}),
			},
			want: map[string]float64{
				"a2a_sent_bytes_total{peer_class=local}":      110,
				"a2a_sent_bytes_total{peer_class=remote}":     200,
				"a2a_received_bytes_total{peer_class=local}":  50,
				"a2a_received_bytes_total{peer_class=remote}": 5,
			},
		},
		{
			name: "failed collectives count errors by kind and nothing else",
			events: []event{
				failed("alltoallv", "pairwise", wrapKind(a2a.ErrPeerLost, nil)),
				failed("alltoallv", "pairwise", wrapKind(a2a.ErrAborted, wrapKind(a2a.ErrPeerLost, nil))),
				failed("alltoallv", "fullmesh", wrapKind(a2a.ErrTimeout, nil)),
				failed("alltoall", "pairwise", a2a.ErrInvalidArgument),
				failed("alltoall", "pairwise", errors.New("weird")),
			},
			want: map[string]float64{
				errs + "{kind=peer_lost,op=alltoallv}":        2,
				errs + "{kind=timeout,op=alltoallv}":          1,
				errs + "{kind=aborted,op=alltoallv}":          0,
				errs + "{kind=invalid_argument,op=alltoall}":  1,
				errs + "{kind=other,op=alltoall}":             1,
				sel + "{algo=pairwise,op=alltoallv}":          2,
				sel + "{algo=fullmesh,op=alltoallv}":          1,
				sel + "{algo=pairwise,op=alltoall}":           2,
				dur + "_count{algo=pairwise,op=alltoallv}":    0,
				"a2a_sent_bytes_total{peer_class=remote}":     0,
				"a2a_received_bytes_total{peer_class=remote}": 0,
			},
		},
		{
			name: "counts exchanges",
			events: []event{
				func(o *Observer) { o.CountsExchanged(250*time.Microsecond, nil) },
				func(o *Observer) { o.CountsExchanged(750*time.Microsecond, nil) },
				func(o *Observer) { o.CountsExchanged(time.Second, wrapKind(a2a.ErrMismatch, nil)) },
				func(o *Observer) { o.CountsExchanged(time.Second, wrapKind(a2a.ErrClosed, nil)) },
			},
			want: map[string]float64{
				"a2a_counts_exchange_duration_seconds_count":              2,
				"a2a_counts_exchange_duration_seconds_sum":                0.001,
				"a2a_counts_exchange_errors_total{kind=mismatch}":         1,
				"a2a_counts_exchange_errors_total{kind=closed}":           1,
				"a2a_counts_exchange_errors_total{kind=invalid_argument}": 0,
			},
		},
		{
			name: "membership and rejected connections",
			events: []event{
				func(o *Observer) { o.SetMembership(8) },
				func(o *Observer) { o.WatchTransport(func() uint64 { return 7 }) },
			},
			want: map[string]float64{
				"a2a_membership_size":            8,
				"a2a_rejected_connections_total": 7,
			},
		},
		{
			name: "moe dispatch and combine",
			events: []event{
				func(o *Observer) { o.ObserveDispatch(time.Millisecond, []int{5, 0, 7}, 2, 1.5) },
				func(o *Observer) { o.ObserveDispatch(3*time.Millisecond, []int{1, 2, 3, 4}, 0, 1.25) },
				func(o *Observer) { o.ObserveDispatch(-time.Millisecond, []int{-1}, -3, math.NaN()) },
				func(o *Observer) { o.ObserveCombine(2 * time.Millisecond) },
				func(o *Observer) { o.ObserveSharedTraffic(4096, 1024) },
				func(o *Observer) { o.ObserveSharedTraffic(100, -5) },
			},
			want: map[string]float64{
				"a2a_sent_bytes_total{peer_class=local}":     4196,
				"a2a_received_bytes_total{peer_class=local}": 1024,
				"a2a_sent_bytes_total{peer_class=remote}":    0,
				"a2a_moe_dispatched_tokens_total{expert=0}":  6,
				"a2a_moe_dispatched_tokens_total{expert=1}":  2,
				"a2a_moe_dispatched_tokens_total{expert=2}":  10,
				"a2a_moe_dispatched_tokens_total{expert=3}":  4,
				"a2a_moe_dropped_tokens_total":               2,
				"a2a_moe_load_imbalance_ratio":               1.25,
				"a2a_moe_dispatch_duration_seconds_count":    3,
				"a2a_moe_dispatch_duration_seconds_sum":      0.004,
				"a2a_moe_combine_duration_seconds_count":     1,
				"a2a_moe_combine_duration_seconds_sum":       0.002,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, reg := newObserver(t)
			for _, ev := range tt.events {
				ev(o)
			}
			got := series(t, reg)
			for k, want := range tt.want {
				v, ok := got[k]
				if !ok {
					t.Errorf("series %s missing", k)
					continue
				}
				if math.Abs(v-want) > 1e-12 {
					t.Errorf("%s = %g, want %g", k, v, want)
				}
			}
		})
	}
}

// TestExposition compares whole families with their text exposition,
// constant labels included.
func TestExposition(t *testing.T) {
	o, reg := newObserver(t)
	o.OpDone(a2a.OpEvent{Op: "alltoallv", Algo: "pairwise", Size: 4, Duration: time.Millisecond, BytesSent: 64, BytesReceived: 32, LastPeer: 1, LastWait: 250 * time.Millisecond})
	o.OpDone(a2a.OpEvent{Op: "alltoallv", Algo: "pairwise", Size: 4, Err: a2a.ErrClosed, LastPeer: -1})
	const want = `
# HELP a2a_peer_wait_seconds_total Time from a collective's start until the last peer's data arrived, summed by that peer.
# TYPE a2a_peer_wait_seconds_total counter
a2a_peer_wait_seconds_total{group="g",peer="0",rank="2"} 0
a2a_peer_wait_seconds_total{group="g",peer="1",rank="2"} 0.25
# HELP a2a_sent_bytes_total Payload bytes sent by completed collectives, by peer class (self, local, remote).
# TYPE a2a_sent_bytes_total counter
a2a_sent_bytes_total{group="g",peer_class="local",rank="2"} 0
a2a_sent_bytes_total{group="g",peer_class="remote",rank="2"} 64
a2a_sent_bytes_total{group="g",peer_class="self",rank="2"} 0
# HELP a2a_errors_total Failed collectives, by operation and error kind.
# TYPE a2a_errors_total counter
a2a_errors_total{group="g",kind="aborted",op="alltoallv",rank="2"} 0
a2a_errors_total{group="g",kind="closed",op="alltoallv",rank="2"} 1
a2a_errors_total{group="g",kind="invalid_argument",op="alltoallv",rank="2"} 0
a2a_errors_total{group="g",kind="mismatch",op="alltoallv",rank="2"} 0
a2a_errors_total{group="g",kind="other",op="alltoallv",rank="2"} 0
a2a_errors_total{group="g",kind="peer_lost",op="alltoallv",rank="2"} 0
a2a_errors_total{group="g",kind="timeout",op="alltoallv",rank="2"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "a2a_peer_wait_seconds_total", "a2a_sent_bytes_total", "a2a_errors_total"); err != nil {
		t.Error(err)
	}
	// The duration histogram's buckets: 1us doubling to ~16.8s.
	h := o.duration.WithLabelValues("alltoallv", "pairwise").(prometheus.Histogram)
	m := &dto.Metric{}
	if err := h.Write(m); err != nil {
		t.Fatal(err)
	}
	b := m.GetHistogram().GetBucket()
	if len(b) != 25 || b[0].GetUpperBound() != 1e-6 || b[24].GetUpperBound() < 10 || b[24].GetUpperBound() > 20 {
		t.Errorf("buckets: %d from %g to %g, want 25 from 1e-06 past 10", len(b), b[0].GetUpperBound(), b[len(b)-1].GetUpperBound())
	}
	// 1ms falls in the bucket le=0.001024 (1us * 2^10) and not in le=0.000512.
	if b[9].GetCumulativeCount() != 0 || b[10].GetCumulativeCount() != 1 {
		t.Errorf("1ms: cumulative counts %d at le=%g and %d at le=%g, want 0 and 1", b[9].GetCumulativeCount(), b[9].GetUpperBound(), b[10].GetCumulativeCount(), b[10].GetUpperBound())
	}
}

func TestConstLabels(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want map[string]string // "" value: label absent
		fam  string
	}{
		{"group and rank", Options{Group: "job7", Rank: 3}, map[string]string{"group": "job7", "rank": "3"}, "a2a_membership_size"},
		{"defaults", Options{Rank: 0}, map[string]string{"group": "a2a", "rank": "0"}, "a2a_membership_size"},
		{"rank unknown", Options{Group: "g", Rank: -1}, map[string]string{"group": "g", "rank": ""}, "a2a_membership_size"},
		{"namespace", Options{Group: "g", Rank: 1, Namespace: "moe"}, map[string]string{"group": "g", "rank": "1"}, "moe_membership_size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			o, err := New(reg, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			o.OpDone(a2a.OpEvent{Op: "alltoallv", Algo: "pairwise", Size: 2, LastPeer: 1})
			o.ObserveDispatch(time.Millisecond, []int{1}, 1, 1)
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, mf := range mfs {
				found = found || mf.GetName() == tt.fam
				for _, m := range mf.GetMetric() {
					got := map[string]string{}
					for _, lp := range m.GetLabel() {
						got[lp.GetName()] = lp.GetValue()
					}
					for k, v := range tt.want {
						if got[k] != v {
							t.Errorf("%s: label %s=%q, want %q", mf.GetName(), k, got[k], v)
						}
					}
				}
			}
			if !found {
				t.Errorf("family %s not exported", tt.fam)
			}
		})
	}
}

func TestNewRegistration(t *testing.T) {
	if _, err := New(nil, Options{}); !errors.Is(err, a2a.ErrInvalidArgument) {
		t.Errorf("New(nil) = %v, want ErrInvalidArgument", err)
	}
	reg := prometheus.NewRegistry()
	o, err := New(reg, Options{Group: "g", Rank: 0})
	if err != nil {
		t.Fatal(err)
	}
	o.SetMembership(3)
	// The same group and rank again collides and leaves the registry as it was.
	_, err = New(reg, Options{Group: "g", Rank: 0})
	var are prometheus.AlreadyRegisteredError
	if !errors.Is(err, a2a.ErrInvalidArgument) || !errors.As(err, &are) {
		t.Errorf("second New = %v, want ErrInvalidArgument wrapping AlreadyRegisteredError", err)
	}
	// Another rank of the same process shares the registry.
	o1, err := New(reg, Options{Group: "g", Rank: 1})
	if err != nil {
		t.Fatalf("rank 1 on the same registry: %v", err)
	}
	o1.SetMembership(5)
	if got := testutil.ToFloat64(o.membership); got != 3 {
		t.Errorf("rank 0 membership = %g, want 3", got)
	}
	n, err := testutil.GatherAndCount(reg, "a2a_membership_size")
	if err != nil || n != 2 {
		t.Errorf("membership series = %d (%v), want 2", n, err)
	}
}

func TestWatchTransport(t *testing.T) {
	o, _ := newObserver(t)
	var mu sync.Mutex
	rejected := uint64(0)
	o.WatchTransport(func() uint64 { mu.Lock(); defer mu.Unlock(); return rejected })
	steps := []struct {
		set  uint64
		want float64
	}{{0, 0}, {2, 2}, {9, 9}}
	for _, s := range steps {
		mu.Lock()
		rejected = s.set
		mu.Unlock()
		if got := testutil.ToFloat64(rejectedCollector(t, o)); got != s.want {
			t.Errorf("rejected after setting %d = %g, want %g", s.set, got, s.want)
		}
	}
	o.WatchTransport(nil)
	if got := testutil.ToFloat64(rejectedCollector(t, o)); got != 0 {
		t.Errorf("rejected after unwatching = %g, want 0", got)
	}
}

// rejectedCollector exposes the rejected counter on its own for ToFloat64.
func rejectedCollector(t *testing.T, o *Observer) prometheus.Collector {
	t.Helper()
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x_total", Help: "x"}, o.rejectedValue)
}

// TestConcurrent feeds one Observer from several goroutines, as several
// communicators of one rank would; run it with -race.
func TestConcurrent(t *testing.T) {
	o, reg := newObserver(t)
	const goroutines, each = 8, 500
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				o.OpDone(a2a.OpEvent{Op: "alltoallv", Algo: []string{"pairwise", "fullmesh"}[i%2], Size: 8, Duration: time.Microsecond, BytesSent: 1, LastPeer: (g + i) % 8, LastWait: time.Microsecond})
				o.ObserveDispatch(time.Microsecond, []int{1, 1, 1, 1, 1, 1, 1, 1}[:1+(g+i)%8], 0, 1)
			}
		}()
	}
	wg.Wait()
	got := series(t, reg)
	if v := got["a2a_sent_bytes_total{peer_class=remote}"]; v != goroutines*each {
		t.Errorf("sent bytes = %g, want %d", v, goroutines*each)
	}
	sum := 0.0
	for p := range 8 {
		sum += got[fmt.Sprintf("a2a_peer_last_arrivals_total{peer=%d}", p)]
	}
	if sum != goroutines*each {
		t.Errorf("last arrivals sum = %g, want %d", sum, goroutines*each)
	}
	if v := got["a2a_moe_dispatched_tokens_total{expert=0}"]; v != goroutines*each {
		t.Errorf("expert 0 tokens = %g, want %d", v, goroutines*each)
	}
}

// TestOpDoneAllocs pins the hot path at zero allocations once an (op, algo)
// and the peer have been seen.
func TestOpDoneAllocs(t *testing.T) {
	o, _ := newObserver(t)
	okEv := a2a.OpEvent{Op: "alltoallv", Algo: "fullmesh", Size: 16, Duration: time.Millisecond, BytesSent: 1 << 20, BytesReceived: 1 << 20, LastPeer: 7, LastWait: time.Millisecond}
	errEv := okEv
	errEv.Err = wrapKind(a2a.ErrAborted, wrapKind(a2a.ErrPeerLost, nil))
	tokens := make([]int, 64)
	for i := range tokens {
		tokens[i] = i
	}
	o.OpDone(okEv)
	o.OpDone(errEv)
	o.ObserveDispatch(time.Millisecond, tokens, 1, 1.1)
	tests := []struct {
		name string
		f    func()
	}{
		{"OpDone ok", func() { o.OpDone(okEv) }},
		{"OpDone error", func() { o.OpDone(errEv) }},
		{"CountsExchanged", func() { o.CountsExchanged(time.Millisecond, nil) }},
		{"ObserveDispatch", func() { o.ObserveDispatch(time.Millisecond, tokens, 1, 1.1) }},
		{"ObserveCombine", func() { o.ObserveCombine(time.Millisecond) }},
	}
	for _, tt := range tests {
		if a := testing.AllocsPerRun(200, tt.f); a != 0 {
			t.Errorf("%s: %g allocs per call, want 0", tt.name, a)
		}
	}
}

func BenchmarkOpDone(b *testing.B) {
	o, _ := newObserver(b)
	ev := a2a.OpEvent{Op: "alltoallv", Algo: "fullmesh", Size: 16, Duration: time.Millisecond, BytesSent: 1 << 20, BytesReceived: 1 << 20, LastPeer: 7, LastWait: time.Millisecond}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		ev.LastPeer = i & 15
		o.OpDone(ev)
	}
}

func BenchmarkObserveDispatch(b *testing.B) {
	o, _ := newObserver(b)
	tokens := make([]int, 64)
	for i := range tokens {
		tokens[i] = 100 + i
	}
	b.ReportAllocs()
	for b.Loop() {
		o.ObserveDispatch(time.Millisecond, tokens, 3, 1.2)
	}
}

// TestShrunk: a shrink counts once, its lost ranks add up, and the
// membership gauge follows the new size.
func TestShrunk(t *testing.T) {
	reg := prometheus.NewRegistry()
	o, err := New(reg, Options{Group: "g", Rank: 1})
	if err != nil {
		t.Fatal(err)
	}
	o.SetMembership(8)
	o.Shrunk([]int{3}, 8, 7)
	o.Shrunk([]int{0, 5}, 7, 5)
	for _, c := range []struct {
		name string
		got  prometheus.Collector
		want float64
	}{{"shrinks", o.shrinks, 2}, {"lost ranks", o.lostRanks, 3}, {"membership", o.membership, 5}} {
		if got := testutil.ToFloat64(c.got); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
}
