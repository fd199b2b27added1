package metrics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/a2a-moe/a2a/a2a"
)

// Options name the series an Observer exports.
type Options struct {
	// Group is the job's group name, the constant label group (default "a2a",
	// as in a2a.Config).
	Group string
	// Rank is this process's rank, the constant label rank. A negative rank
	// (assigned at join) leaves the label out: the scrape target's instance
	// label then tells the ranks apart.
	Rank int
	// Namespace prefixes every metric name (default "a2a"). The dashboard in
	// deploy/grafana assumes the default.
	Namespace string
}

// Peer classes of the bytes counters' peer_class label: local is other ranks
// of this host (a2a.OpEvent's BytesSentLocal and BytesReceivedLocal, and the
// rows the MoE dispatcher moves through shared memory, ObserveSharedTraffic),
// remote the ranks of other hosts. A rank's own block is not counted, so self
// stays at zero.
const (
	PeerClassSelf   = "self"
	PeerClassLocal  = "local"
	PeerClassRemote = "remote"
)

// Error kinds of the kind label, one per a2a error sentinel plus KindOther.
const (
	KindInvalidArgument = "invalid_argument"
	KindMismatch        = "mismatch"
	KindPeerLost        = "peer_lost"
	KindAborted         = "aborted"
	KindTimeout         = "timeout"
	KindClosed          = "closed"
	KindOther           = "other"
)

// kinds lists the kind label values in the order errorKindIndex numbers them.
var kinds = [...]string{KindInvalidArgument, KindMismatch, KindPeerLost, KindTimeout, KindClosed, KindAborted, KindOther}

// maxCachedIndex bounds the per-peer and per-expert caches, so a bogus index
// costs an allocation rather than a huge slice.
const maxCachedIndex = 1 << 16

// ErrorKind returns the kind label for err ("" for nil). The root cause wins:
// an abort caused by a lost peer, a timeout or a mismatch on another rank
// matches that kind as well as ErrAborted, and is counted under it, so
// "aborted" only counts aborts with no other known cause (Abort, cancellation).
func ErrorKind(err error) string {
	if err == nil {
		return ""
	}
	return kinds[errorKindIndex(err)]
}

func errorKindIndex(err error) int {
	switch {
	case errors.Is(err, a2a.ErrInvalidArgument):
		return 0
	case errors.Is(err, a2a.ErrMismatch):
		return 1
	case errors.Is(err, a2a.ErrPeerLost):
		return 2
	case errors.Is(err, a2a.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return 3
	case errors.Is(err, a2a.ErrClosed):
		return 4
	case errors.Is(err, a2a.ErrAborted), errors.Is(err, context.Canceled):
		return 5
	}
	return 6
}

// durationBuckets are exponential from 1us, doubling, up to 16.8s: 25 buckets
// covering 1us..10s with a factor-2 resolution for quantiles.
func durationBuckets() []float64 { return prometheus.ExponentialBuckets(1e-6, 2, 25) }

// opKey identifies the pre-resolved series of one (op, algo) pair.
type opKey struct{ op, algo string }

// opSeries are the children OpDone touches for one (op, algo), resolved once
// so the hot path does no label hashing nor allocation.
type opSeries struct {
	duration   prometheus.Observer
	selections prometheus.Counter
	errs       *[len(kinds)]prometheus.Counter // shared by every algo of one op
}

// peerSeries are the per-peer wait children.
type peerSeries struct {
	wait, last prometheus.Counter
}

// Observer implements a2a.Observer with Prometheus collectors and also takes
// the MoE dispatch events. It is safe for concurrent use; one Observer may
// serve several communicators of the same rank.
type Observer struct {
	duration   *prometheus.HistogramVec
	selections *prometheus.CounterVec
	errs       *prometheus.CounterVec
	sent       *prometheus.CounterVec
	received   *prometheus.CounterVec
	sentRemote prometheus.Counter
	recvRemote prometheus.Counter
	sentLocal  prometheus.Counter
	recvLocal  prometheus.Counter

	countsDuration prometheus.Histogram
	countsErrs     [len(kinds)]prometheus.Counter

	membership prometheus.Gauge
	shrinks    prometheus.Counter
	lostRanks  prometheus.Counter
	rejected   atomic.Pointer[func() uint64]

	peerWait  *prometheus.CounterVec
	peerLast  *prometheus.CounterVec
	peerBytes *peerBytes // by peer, read from the transport (peers.go)

	tokens           *prometheus.CounterVec
	dropped          prometheus.Counter
	dispatchDuration prometheus.Histogram
	combineDuration  prometheus.Histogram
	imbalance        prometheus.Gauge
	balance          *balanceSeries // balance.go
	wire             wireSeries     // moereport.go
	moe              moeTally       // for the Comm's reports (moereport.go)

	// Caches read lock-free on the hot path and replaced (copy on write)
	// under mu when a new op, peer or expert shows up.
	mu      sync.Mutex
	ops     atomic.Pointer[map[opKey]*opSeries]
	opErrs  map[string]*[len(kinds)]prometheus.Counter // guarded by mu
	peers   atomic.Pointer[[]peerSeries]
	experts atomic.Pointer[[]prometheus.Counter]
}

var (
	_ a2a.Observer       = (*Observer)(nil)
	_ a2a.ShrinkObserver = (*Observer)(nil)
	_ a2a.MoEReporter    = (*Observer)(nil)
)

// New creates an Observer and registers its collectors on reg (which must not
// be nil: the global default registry is never used implicitly). It fails,
// registering nothing, if reg already holds the same series, for example an
// Observer of the same group and rank.
func New(reg prometheus.Registerer, opts Options) (*Observer, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: metrics.New: nil Registerer", a2a.ErrInvalidArgument)
	}
	ns := opts.Namespace
	if ns == "" {
		ns = "a2a"
	}
	group := opts.Group
	if group == "" {
		group = "a2a"
	}
	labels := prometheus.Labels{"group": group}
	if opts.Rank >= 0 {
		labels["rank"] = strconv.Itoa(opts.Rank)
	}
	o := &Observer{opErrs: map[string]*[len(kinds)]prometheus.Counter{}}
	o.ops.Store(&map[opKey]*opSeries{})
	o.peers.Store(&[]peerSeries{})
	o.experts.Store(&[]prometheus.Counter{})

	o.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Name: "collective_duration_seconds",
		Help:    "Duration of completed collectives, by operation and algorithm.",
		Buckets: durationBuckets(),
	}, []string{"op", "algo"})
	o.selections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "algorithm_selections_total",
		Help: "Collectives run, successful or not, by operation and the algorithm selected.",
	}, []string{"op", "algo"})
	o.errs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "errors_total",
		Help: "Failed collectives, by operation and error kind.",
	}, []string{"op", "kind"})
	o.sent = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "sent_bytes_total",
		Help: "Payload bytes sent by completed collectives, by peer class (self, local, remote).",
	}, []string{"peer_class"})
	o.received = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "received_bytes_total",
		Help: "Payload bytes received by completed collectives, by peer class (self, local, remote).",
	}, []string{"peer_class"})
	o.countsDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: ns, Name: "counts_exchange_duration_seconds",
		Help:    "Duration of completed counts exchanges over the control plane.",
		Buckets: durationBuckets(),
	})
	countsErrs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "counts_exchange_errors_total",
		Help: "Failed counts exchanges, by error kind.",
	}, []string{"kind"})
	o.membership = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Name: "membership_size",
		Help: "Number of ranks in the group.",
	})
	o.shrinks = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Name: "shrinks_total",
		Help: "Times the communicator shrank to its survivors after losing ranks (Comm.Shrink).",
	})
	o.lostRanks = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Name: "shrink_lost_ranks_total",
		Help: "Ranks the shrinks left behind.",
	})
	rejected := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: ns, Name: "rejected_connections_total",
		Help: "Data-plane connections the transport refused (bad hello, wrong secret, strangers).",
	}, o.rejectedValue)
	o.peerWait = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "peer_wait_seconds_total",
		Help: "Time from a collective's start until the last peer's data arrived, summed by that peer.",
	}, []string{"peer"})
	o.peerLast = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "peer_last_arrivals_total",
		Help: "Completed collectives in which this peer's data arrived last.",
	}, []string{"peer"})
	o.peerBytes = newPeerBytes(ns)
	o.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: "moe", Name: "dispatched_tokens_total",
		Help: "Tokens dispatched to each expert.",
	}, []string{"expert"})
	o.dropped = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: "moe", Name: "dropped_tokens_total",
		Help: "Token assignments dropped because an expert was over capacity.",
	})
	o.dispatchDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: "moe", Name: "dispatch_duration_seconds",
		Help:    "Duration of MoE dispatch steps.",
		Buckets: durationBuckets(),
	})
	o.combineDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: "moe", Name: "combine_duration_seconds",
		Help:    "Duration of MoE combine steps.",
		Buckets: durationBuckets(),
	})
	o.imbalance = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: "moe", Name: "load_imbalance_ratio",
		Help: "Max over mean tokens per rank in the last dispatch (1 is balanced).",
	})

	o.balance = newBalanceSeries(ns)
	o.wire = newWireSeries(ns)

	wrapped := prometheus.WrapRegistererWith(labels, reg)
	collectors := []prometheus.Collector{
		o.duration, o.selections, o.errs, o.sent, o.received,
		o.countsDuration, countsErrs, o.membership, o.shrinks, o.lostRanks, rejected,
		o.peerWait, o.peerLast, o.peerBytes,
		o.tokens, o.dropped, o.dispatchDuration, o.combineDuration, o.imbalance,
	}
	collectors = append(collectors, o.balance.collectors()...)
	collectors = append(collectors, o.wire.bytes, o.wire.saved)
	for i, c := range collectors {
		if err := wrapped.Register(c); err != nil {
			for _, done := range collectors[:i] {
				wrapped.Unregister(done)
			}
			return nil, fmt.Errorf("%w: metrics.New: %w", a2a.ErrInvalidArgument, err)
		}
	}

	// Known label values start at zero, so rate() sees the first increment.
	for _, class := range []string{PeerClassSelf, PeerClassLocal, PeerClassRemote} {
		o.sent.WithLabelValues(class)
		o.received.WithLabelValues(class)
	}
	o.sentRemote = o.sent.WithLabelValues(PeerClassRemote)
	o.recvRemote = o.received.WithLabelValues(PeerClassRemote)
	o.sentLocal = o.sent.WithLabelValues(PeerClassLocal)
	o.recvLocal = o.received.WithLabelValues(PeerClassLocal)
	for i, k := range kinds {
		o.countsErrs[i] = countsErrs.WithLabelValues(k)
	}
	return o, nil
}

// OpDone records a finished collective: its algorithm selection always; its
// error kind if it failed; otherwise its duration, its bytes and which peer
// arrived last. Failed collectives stay out of the latency histogram so that
// timeouts do not read as slow collectives.
func (o *Observer) OpDone(ev a2a.OpEvent) {
	s := o.opSeries(ev.Op, ev.Algo)
	s.selections.Inc()
	if ev.Size > 0 {
		o.membership.Set(float64(ev.Size))
	}
	if ev.Err != nil {
		s.errs[errorKindIndex(ev.Err)].Inc()
		return
	}
	s.duration.Observe(seconds(ev.Duration))
	addBytes(o.sentLocal, o.sentRemote, ev.BytesSent, ev.BytesSentLocal)
	addBytes(o.recvLocal, o.recvRemote, ev.BytesReceived, ev.BytesReceivedLocal)
	if ev.LastPeer >= 0 {
		p := o.peer(ev.LastPeer)
		p.last.Inc()
		p.wait.Add(seconds(ev.LastWait))
	}
}

// addBytes splits total bytes into the local part and the rest (remote);
// inconsistent figures count nothing negative.
func addBytes(local, remote prometheus.Counter, total, ofThemLocal int64) {
	ofThemLocal = min(max(ofThemLocal, 0), max(total, 0))
	if ofThemLocal > 0 {
		local.Add(float64(ofThemLocal))
	}
	if r := total - ofThemLocal; r > 0 {
		remote.Add(float64(r))
	}
}

// CountsExchanged records a counts exchange: its duration if it succeeded,
// its error kind if not.
func (o *Observer) CountsExchanged(d time.Duration, err error) {
	if err != nil {
		o.countsErrs[errorKindIndex(err)].Inc()
		return
	}
	o.countsDuration.Observe(seconds(d))
}

// SetMembership sets the group size gauge; OpDone also keeps it current from
// each event's Size.
func (o *Observer) SetMembership(size int) { o.membership.Set(float64(size)) }

// Shrunk counts a shrink of the communicator (a2a.ShrinkObserver) and sets
// the membership to its new size. The series keep the rank label the
// Observer was made with: the rank's number before any shrink.
func (o *Observer) Shrunk(lost []int, oldSize, newSize int) {
	o.shrinks.Inc()
	o.lostRanks.Add(float64(len(lost)))
	o.moe.shrunk()
	o.membership.Set(float64(newSize))
}

// WatchTransport makes the rejected-connections counter read rejected at each
// scrape, for example func() uint64 { return comm.Stats().Rejected }. A later
// call replaces the source (a new communicator's count restarting from zero
// reads as a counter reset, which rate() handles); until the first, and after
// WatchTransport(nil), the counter reads 0.
func (o *Observer) WatchTransport(rejected func() uint64) {
	if rejected == nil {
		o.rejected.Store(nil)
		return
	}
	o.rejected.Store(&rejected)
}

func (o *Observer) rejectedValue() float64 {
	if f := o.rejected.Load(); f != nil {
		return float64((*f)())
	}
	return 0
}

// ObserveDispatch records one MoE dispatch step: its duration, the tokens
// sent to each expert (indexed by global expert id), the token assignments
// dropped over capacity, and the load imbalance (max over mean tokens per
// rank). Negative counts are ignored, and so is a NaN imbalance.
func (o *Observer) ObserveDispatch(d time.Duration, tokensPerExpert []int, dropped int, imbalance float64) {
	o.dispatchDuration.Observe(seconds(d))
	o.moe.dispatch(d, tokensPerExpert, dropped)
	if len(tokensPerExpert) > 0 {
		experts := o.expertCounters(len(tokensPerExpert))
		for e, n := range tokensPerExpert {
			if n <= 0 {
				continue
			}
			if e < len(experts) {
				experts[e].Add(float64(n))
			} else {
				o.tokens.WithLabelValues(strconv.Itoa(e)).Add(float64(n))
			}
		}
	}
	if dropped > 0 {
		o.dropped.Add(float64(dropped))
	}
	if !math.IsNaN(imbalance) {
		o.imbalance.Set(imbalance)
	}
}

// ObserveCombine records the duration of one MoE combine step.
func (o *Observer) ObserveCombine(d time.Duration) {
	o.combineDuration.Observe(seconds(d))
	o.moe.combine(d)
}

// ObserveSharedTraffic counts bytes the MoE dispatcher moved through shared
// memory (rows written into same-host peers' buffers, expert outputs read
// from them) under peer_class="local". Negative counts are ignored.
func (o *Observer) ObserveSharedTraffic(sent, received int64) {
	if sent > 0 {
		o.sentLocal.Add(float64(sent))
	}
	if received > 0 {
		o.recvLocal.Add(float64(received))
	}
}

// seconds converts d to seconds, clamping the negative durations a
// non-monotonic clock could produce.
func seconds(d time.Duration) float64 {
	if d < 0 {
		return 0
	}
	return d.Seconds()
}

// opSeries returns the cached series of (op, algo), resolving them the first
// time the pair shows up.
func (o *Observer) opSeries(op, algo string) *opSeries {
	k := opKey{op, algo}
	if s, ok := (*o.ops.Load())[k]; ok {
		return s
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.ops.Load()
	if s, ok := old[k]; ok {
		return s
	}
	errs, ok := o.opErrs[op]
	if !ok {
		errs = new([len(kinds)]prometheus.Counter)
		for i, kind := range kinds {
			errs[i] = o.errs.WithLabelValues(op, kind)
		}
		o.opErrs[op] = errs
	}
	s := &opSeries{
		duration:   o.duration.WithLabelValues(op, algo),
		selections: o.selections.WithLabelValues(op, algo),
		errs:       errs,
	}
	m := make(map[opKey]*opSeries, len(old)+1)
	for key, v := range old {
		m[key] = v
	}
	m[k] = s
	o.ops.Store(&m)
	return s
}

// peer returns the cached wait series of peer.
func (o *Observer) peer(peer int) peerSeries {
	if ps := *o.peers.Load(); peer < len(ps) {
		return ps[peer]
	}
	if peer >= maxCachedIndex {
		label := strconv.Itoa(peer)
		return peerSeries{wait: o.peerWait.WithLabelValues(label), last: o.peerLast.WithLabelValues(label)}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.peers.Load()
	if peer < len(old) {
		return old[peer]
	}
	ps := make([]peerSeries, peer+1)
	copy(ps, old)
	for i := len(old); i < len(ps); i++ {
		label := strconv.Itoa(i)
		ps[i] = peerSeries{wait: o.peerWait.WithLabelValues(label), last: o.peerLast.WithLabelValues(label)}
	}
	o.peers.Store(&ps)
	return ps[peer]
}

// expertCounters returns the cached token counters of experts 0..n-1 (fewer
// past maxCachedIndex).
func (o *Observer) expertCounters(n int) []prometheus.Counter {
	n = min(n, maxCachedIndex)
	if es := *o.experts.Load(); n <= len(es) {
		return es
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.experts.Load()
	if n <= len(old) {
		return old
	}
	es := make([]prometheus.Counter, n)
	copy(es, old)
	for i := len(old); i < n; i++ {
		es[i] = o.tokens.WithLabelValues(strconv.Itoa(i))
	}
	o.experts.Store(&es)
	return es
}
