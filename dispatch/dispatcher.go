package dispatch

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

// CountsMode says how a rank learns how many rows it will receive for each of
// its local experts. See the package documentation for the trade-off.
type CountsMode uint8

const (
	// CountsInBand exchanges per-(rank, local expert) row counts with one
	// fixed-size AllToAll on the data plane. The default.
	CountsInBand CountsMode = iota
	// CountsNATS exchanges byte counts over the control plane and prefixes
	// every block with its per-expert row counts.
	CountsNATS
)

// String returns "inband" or "nats".
func (m CountsMode) String() string {
	switch m {
	case CountsInBand:
		return "inband"
	case CountsNATS:
		return "nats"
	}
	return fmt.Sprintf("CountsMode(%d)", uint8(m))
}

// ParseCountsMode parses "inband" (or "in-band") and "nats".
func ParseCountsMode(s string) (CountsMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "inband", "in-band":
		return CountsInBand, nil
	case "nats":
		return CountsNATS, nil
	}
	return 0, fmt.Errorf("%w: counts mode %q: want inband or nats", a2a.ErrInvalidArgument, s)
}

// ParseRowPath parses "auto" and "alltoallv".
func ParseRowPath(s string) (RowPath, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "auto":
		return RowsAuto, nil
	case "alltoallv":
		return RowsAllToAllV, nil
	}
	return 0, fmt.Errorf("%w: row path %q: want auto or alltoallv", a2a.ErrInvalidArgument, s)
}

// HeaderAlign is the alignment, in bytes, of the per-block row-count header of
// [CountsNATS] mode, so that the rows after it keep the alignment of the
// buffer for any element type.
const HeaderAlign = 16

// RowPath selects how rows travel between the ranks of the layer.
type RowPath uint8

const (
	// RowsAuto uses shared memory between ranks of one host that can map
	// each other's memory (memfd segments opened through /proc; not with
	// A2A_TRANSPORT=tcp): Dispatch packs their rows straight into the
	// receivers' buffers and Combine reads their expert outputs where the
	// experts wrote them. Rows between other ranks travel by the AllToAllV
	// and, in Combine, the reverse one. Dispatcher.SharedWith says which
	// pairs use which.
	RowsAuto RowPath = iota
	// RowsAllToAllV always runs the AllToAllV and the reverse AllToAllV.
	RowsAllToAllV
)

// String returns "auto" or "alltoallv".
func (p RowPath) String() string {
	switch p {
	case RowsAuto:
		return "auto"
	case RowsAllToAllV:
		return "alltoallv"
	}
	return fmt.Sprintf("RowPath(%d)", uint8(p))
}

// SharedTrafficObserver is an Observer that also wants the bytes rows moved
// through shared memory between ranks of one host, which no collective
// carries or reports. *metrics.Observer counts them as peer class "local".
type SharedTrafficObserver interface {
	// ObserveSharedTraffic reports one dispatch's or combine's bytes: rows
	// (or expert outputs) this rank gave its same-host peers and those it
	// got from them.
	ObserveSharedTraffic(sent, received int64)
}

// Observer receives one event per dispatch and per combine.
// *metrics.Observer implements it. Methods run on the goroutine that ran the
// step (the caller's or the dispatcher's worker): keep them fast.
type Observer interface {
	// ObserveDispatch reports a finished dispatch: its duration (packing,
	// counts, exchange), this rank's rows per global expert, the assignments
	// it dropped over capacity, and the max/mean of its rows per destination
	// rank.
	ObserveDispatch(d time.Duration, tokensPerExpert []int, dropped int, imbalance float64)
	// ObserveCombine reports the duration of a finished combine (reverse
	// exchange and weighted sum).
	ObserveCombine(d time.Duration)
}

// Config describes one MoE layer. Every rank of the group must use the same
// values (New checks).
type Config struct {
	// Experts is the number of experts E of the layer.
	Experts int
	// K is the number of experts per token (top-k), 1 <= K <= Experts.
	K int
	// Hidden is the number of elements in a token row.
	Hidden int
	// DType is the element type of token rows and expert outputs:
	// reduce.Float32, reduce.BFloat16 or reduce.Float16 (0 means Float32).
	// Dispatch moves rows as bytes; Combine computes in float32 and rounds
	// once to DType.
	DType reduce.DType
	// CapacityFactor limits each expert to ceil(T*K/Experts*CapacityFactor)
	// of a rank's T tokens per step (see routing.Capacity); <= 0: no limit.
	CapacityFactor float64
	// Placement says which rank hosts each expert; nil places them
	// contiguously (routing.Contiguous). Its Ranks must equal the Comm's size.
	Placement *routing.Placement
	// Counts selects how receive counts are learned (default CountsInBand).
	Counts CountsMode
	// Rows selects how rows travel (default RowsAuto: through shared memory
	// between ranks of one host).
	Rows RowPath
	// Wire selects the format of the dispatched rows on the wire (default
	// WireSame: Config.DType). WireFP8 sends E4M3 bytes and a float32 scale
	// per 128 elements, for float32 and bfloat16 rows with CountsInBand;
	// the experts still get rows in DType unless KeepFP8 is set.
	Wire WireFormat
	// KeepFP8, with WireFP8, leaves the received rows in FP8: Handle.Recv
	// holds their E4M3 bytes (Hidden per row) and Handle.Scales their
	// scales, for experts that compute in FP8. Expert outputs and Combine
	// stay in DType.
	KeepFP8 bool
	// MaxTokens > 0 turns on the decode mode (decode.go): at most MaxTokens
	// tokens per rank per step, received into fixed worst-case buffers with
	// the counts in the same round as the rows; see DispatchSend.
	MaxTokens int
	// Hierarchy says whether a token crosses to a remote host once,
	// through a relay rank there that forwards it to its experts on that
	// host, or once per expert (see HierarchyMode; default
	// HierarchyAuto: where the cost model prices it lower).
	Hierarchy HierarchyMode
	// Rebalance, when its Every is set, re-places the experts from the
	// load estimate inside Dispatch (see Dispatcher.Replace). Off by default.
	Rebalance Rebalance
	// Observer, if set, is told about every dispatch and combine (and
	// re-placements and the load estimate, if it implements
	// ReplaceObserver or LoadObserver).
	Observer Observer
	// Logger receives debug messages (nil: slog.Default()).
	Logger *slog.Logger
}

// Dispatcher runs the dispatch and combine of one MoE layer on one rank. Its
// methods, and those of the handles it returns, are meant to be called from
// one goroutine (the layer's step loop); the exchanges of the asynchronous
// forms run on the dispatcher's own worker goroutine.
type Dispatcher struct {
	comm     *a2a.Comm
	cfg      Config
	log      *slog.Logger
	pl       *routing.Placement
	capacity routing.Capacity
	rank     int
	size     int
	rowBytes int
	wireRow  int   // bytes of a row on the dispatch wire (wire.go)
	fp8      bool  // Wire is WireFP8
	nLocal   int   // filled slots (local experts, replicas included) here
	maxLocal int   // most filled slots any rank has
	hdr      []int // CountsNATS: header bytes of the block for rank j (0 in-band)
	hdrSelf  int   // header bytes of the blocks this rank receives
	rt       *route
	replicas replicaState // replace.go, load.go
	ll       *decodeMode  // Config.MaxTokens > 0 (decode.go)
	hier     *hierarchy   // the relay path (hier.go), nil when off
	// An inner dispatcher of the relay path whose rows all go through
	// shared memory skips its combine's reverse AllToAllV (hier.go).
	relayed bool

	// Shared memory (shared.go), chosen at New by every rank alike:
	// sharedWith[j] says that rows to and from rank j travel through it;
	// shared and exchange say whether any pair of the group uses shared
	// memory and whether any uses the AllToAllV (so every rank runs the
	// same collectives).
	sharedWith       []bool
	shared, exchange bool
	hostPeers        bool          // sharedWith holds a true: this rank's buffers must be shareable
	views            views         // peers' segments mapped here; used by exec only
	segGen           atomic.Uint64 // numbers this rank's segments
	pid              int           // this process's, which peers open its segments by (read once: a system call)

	jobs       chan *Handle
	inflight   atomic.Int32 // jobs queued or running on the worker
	workerDone chan struct{}

	mu     sync.Mutex // guards closed and free
	closed bool
	free   []*Handle
}

// New creates the dispatcher of one MoE layer on c. It is a collective: every
// rank calls it, and the ranks compare their configurations with one small
// AllToAll, failing with ErrMismatch (an *a2a.Error naming the rank, the
// field and both values) if they differ. A bad configuration fails
// with ErrInvalidArgument before anything is exchanged. Close the dispatcher
// before the Comm.
func New(ctx context.Context, c *a2a.Comm, cfg Config) (*Dispatcher, error) {
	if c == nil {
		return nil, invalidf("nil Comm")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rank, size := c.Rank(), c.Size()
	pl, err := cfg.placement(size)
	if err != nil {
		return nil, err
	}
	d := &Dispatcher{
		comm: c, cfg: cfg, log: cfg.Logger, pl: pl,
		capacity: routing.Capacity{Factor: cfg.CapacityFactor},
		rank:     rank, size: size,
		rowBytes: cfg.Hidden * cfg.DType.Size(),
		wireRow:  cfg.wireRowBytes(), fp8: cfg.Wire == WireFP8,
	}
	if err := d.checkRebalance(); err != nil {
		return nil, err
	}
	d.setRoute(newRoute(pl, rank, c.Host, cfg.Counts))
	if d.hier, err = d.newHierarchy(); err != nil {
		return nil, err
	}
	if err := d.agree(ctx); err != nil {
		return nil, err
	}
	if err := d.probeShared(ctx); err != nil {
		return nil, err
	}
	if err := d.initDecodeIf(ctx); err != nil {
		return nil, err
	}
	if err := d.newInner(ctx); err != nil {
		return nil, err
	}
	d.views.byPeer = make([][]peerView, size)
	d.jobs = make(chan *Handle, 16)
	d.workerDone = make(chan struct{})
	go d.work()
	d.log.Debug("dispatch: layer ready", "rank", rank, "ranks", size, "experts", cfg.Experts, "k", cfg.K,
		"hidden", cfg.Hidden, "dtype", cfg.DType, "wire", cfg.Wire, "local_experts", d.nLocal, "counts", cfg.Counts, "shared_memory", d.shared,
		"hierarchy", d.hier != nil)
	return d, nil
}

// withDefaults returns cfg with its zero DType and Logger filled in.
func (cfg Config) withDefaults() Config {
	if cfg.DType == 0 {
		cfg.DType = reduce.Float32
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// validate reports the first field of cfg (defaults filled in) out of range.
// The placement is checked by placement, against the Comm's size.
func (cfg Config) validate() error {
	switch {
	case cfg.Experts < 1:
		return invalidf("experts %d, want >= 1", cfg.Experts)
	case cfg.K < 1 || cfg.K > cfg.Experts:
		return invalidf("top-k %d, want 1 <= k <= experts (%d)", cfg.K, cfg.Experts)
	case cfg.Hidden < 1:
		return invalidf("hidden size %d, want >= 1", cfg.Hidden)
	case cfg.DType != reduce.Float32 && cfg.DType != reduce.BFloat16 && cfg.DType != reduce.Float16:
		return invalidf("dtype %v, want float32, bfloat16 or float16", cfg.DType)
	case cfg.Counts != CountsInBand && cfg.Counts != CountsNATS:
		return invalidf("counts mode %v", cfg.Counts)
	case cfg.Rows != RowsAuto && cfg.Rows != RowsAllToAllV:
		return invalidf("row path %v", cfg.Rows)
	case cfg.Hierarchy > HierarchyOff:
		return invalidf("hierarchy %v", cfg.Hierarchy)
	case math.IsNaN(cfg.CapacityFactor) || math.IsInf(cfg.CapacityFactor, 0):
		return invalidf("capacity factor %v, want finite (<= 0: unlimited)", cfg.CapacityFactor)
	case cfg.Hidden > math.MaxInt32/cfg.DType.Size():
		return invalidf("hidden size %d: rows over 2 GiB", cfg.Hidden)
	}
	if err := cfg.validateWire(); err != nil {
		return err
	}
	return cfg.validateDecode()
}

// placement returns the layer's placement over ranks ranks: cfg.Placement,
// checked, or the contiguous one if it is nil.
func (cfg Config) placement(ranks int) (*routing.Placement, error) {
	if cfg.Placement == nil {
		pl, err := routing.Contiguous(cfg.Experts, ranks)
		if err != nil {
			return nil, wrapInvalid(err, "placement")
		}
		return pl, nil
	}
	pl := cfg.Placement
	if err := pl.Validate(); err != nil {
		return nil, wrapInvalid(err, "placement")
	}
	if pl.Experts != cfg.Experts || pl.Ranks != ranks {
		return nil, invalidf("placement of %d experts over %d ranks, want %d experts over the Comm's %d ranks",
			pl.Experts, pl.Ranks, cfg.Experts, ranks)
	}
	return pl, nil
}

// Close stops the worker after the operations already queued have run. It
// does not close the Comm. Close is idempotent; the dispatcher refuses work
// afterwards with ErrClosed.
func (d *Dispatcher) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	close(d.jobs)
	d.mu.Unlock()
	<-d.workerDone
	if d.hier != nil {
		d.hier.inner.Close()
	}
	d.views.close()
	if d.ll != nil {
		d.ll.close()
	}
	d.mu.Lock()
	for _, h := range d.free {
		h.freeSegments()
	}
	d.mu.Unlock()
	return nil
}

// SharedMemory reports whether rows between some ranks of the layer travel
// through shared memory (Dispatch packs into the receivers' buffers, Combine
// reads the outputs in place) instead of by AllToAllV (see RowsAuto). All
// ranks report the same.
func (d *Dispatcher) SharedMemory() bool { return d.shared }

// UsesAllToAllV reports whether rows between some ranks of the layer travel
// by AllToAllV (pairs on different hosts, or not sharing memory). All ranks
// report the same.
func (d *Dispatcher) UsesAllToAllV() bool { return d.exchange }

// SharedWith reports whether rows to and from rank peer travel through
// shared memory.
func (d *Dispatcher) SharedWith(peer int) bool { return d.sharedWith[peer] }

// Config returns the layer configuration, with defaults filled in.
func (d *Dispatcher) Config() Config { return d.cfg }

// Placement returns the expert placement in use.
func (d *Dispatcher) Placement() *routing.Placement { return d.pl }

// RowBytes is the size of one token row: Hidden times the element size.
func (d *Dispatcher) RowBytes() int { return d.rowBytes }

// LocalExperts lists the global ids of the experts in this rank's local slots
// (local index l is position l): ascending, for the placements routing
// builds, and one entry per replica this rank holds. Treat it as read-only.
func (d *Dispatcher) LocalExperts() []int { return d.rt.locals }

// Dispatch sends every kept (token, expert) assignment of decision to the rank
// hosting the expert, and returns once this rank has received the rows for its
// own experts. tokens holds decision.Tokens rows of RowBytes bytes. The
// decision is copied (capacity is enforced on the copy), so the caller may
// reuse it and tokens as soon as Dispatch returns. On success, the caller
// owns the returned handle until it calls Release; on failure there is no
// handle.
func (d *Dispatcher) Dispatch(ctx context.Context, tokens []byte, decision *routing.Decision) (*Handle, error) {
	if d.ll != nil {
		return d.dispatchDecode(ctx, tokens, decision, true)
	} else if err := d.autoReplace(ctx); err != nil {
		return nil, err
	}
	h, err := d.prepare(ctx, tokens, decision)
	if err != nil {
		return nil, err
	}
	if err := d.submit(h, true); err != nil {
		h.Release()
		return nil, err
	}
	return h, nil
}

// DispatchAsync is Dispatch that returns as soon as the step is planned: the
// packing and the exchanges run on the dispatcher's worker. Call Wait on the
// handle before reading it; tokens must stay unchanged until then (decision
// may be reused at once). Argument errors are returned here, exchange errors
// by Wait.
func (d *Dispatcher) DispatchAsync(ctx context.Context, tokens []byte, decision *routing.Decision) (*Handle, error) {
	if d.ll != nil {
		return d.dispatchDecode(ctx, tokens, decision, false)
	} else if err := d.autoReplace(ctx); err != nil {
		return nil, err
	}
	h, err := d.prepare(ctx, tokens, decision)
	if err != nil {
		return nil, err
	}
	if err := d.submit(h, false); err != nil {
		h.Release()
		return nil, err
	}
	return h, nil
}

// Combine sends the expert outputs back to the ranks their tokens came from
// and writes into out, in the original token order, the gate-weighted sum of
// each token's expert outputs. expertOutputs has the layout and length of
// h.Recv() (h.Output() or h.Recv() itself, computed in place; with
// KeepFP8, whose Recv holds FP8 rows, those of h.Output()); out holds the
// dispatched number of token rows (h.Tokens() * RowBytes bytes) and may be
// the dispatched tokens buffer. The handle stays valid (its statistics
// readable) until Release.
func (d *Dispatcher) Combine(ctx context.Context, h *Handle, expertOutputs, out []byte) error {
	if d.ll != nil {
		return d.combineDecode(ctx, h, expertOutputs, out, true)
	} else if err := d.prepareCombine(ctx, h, expertOutputs, out); err != nil {
		return err
	}
	err := d.submit(h, true)
	h.settleIfDone()
	return err
}

// CombineAsync is Combine that returns once the arguments are checked: the
// reverse exchange and the weighted sum run on the dispatcher's worker, and
// h.Wait returns when out is ready. expertOutputs must stay unchanged until
// then.
func (d *Dispatcher) CombineAsync(ctx context.Context, h *Handle, expertOutputs, out []byte) error {
	if d.ll != nil {
		return d.combineDecode(ctx, h, expertOutputs, out, false)
	} else if err := d.prepareCombine(ctx, h, expertOutputs, out); err != nil {
		return err
	}
	return d.submit(h, false)
}

// submit runs h's operation: inline when sync and nothing is queued (the
// worker is idle, so the order of collectives is kept), otherwise on the
// worker, waiting for it when sync.
func (d *Dispatcher) submit(h *Handle, sync bool) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		if h.state == stateCombining {
			h.state = stateDispatched
		}
		return fmt.Errorf("%w: dispatch: dispatcher closed", a2a.ErrClosed)
	}
	if sync && d.inflight.Load() == 0 {
		d.mu.Unlock()
		return h.exec()
	}
	d.inflight.Add(1)
	h.pending = true
	d.jobs <- h // under mu: Close cannot close the channel meanwhile
	d.mu.Unlock()
	if sync {
		return h.Wait()
	}
	return nil
}

// work runs queued operations in submission order.
func (d *Dispatcher) work() {
	defer close(d.workerDone)
	for h := range d.jobs {
		err := h.exec()
		// Counted down before the completion is visible, so that a caller
		// returning from Wait sees an idle worker and may run inline.
		d.inflight.Add(-1)
		h.done <- err
	}
}

// handle takes a handle from the free list, or makes one.
func (d *Dispatcher) handle() *Handle {
	d.mu.Lock()
	if n := len(d.free); n > 0 {
		h := d.free[n-1]
		d.free = d.free[:n-1]
		d.mu.Unlock()
		return h
	}
	d.mu.Unlock()
	P := d.size
	h := &Handle{
		d:          d,
		done:       make(chan error, 1),
		sendCounts: make([]int, P),
		sendDispl:  make([]int, P),
		recvCounts: make([]int, P),
		recvDispl:  make([]int, P),
		rowBase:    make([]int, P),
		rowsFrom:   make([]int, P*d.nLocal),
		expertRows: make([]int, d.nLocal),
		segs:       make([]Segment, P*d.nLocal),
		hdrOut:     make([]byte, 4*countsBlock(d.maxLocal)*P),
		hdrIn:      make([]byte, 4*countsBlock(d.maxLocal)*P),
		expertLoad: make([]int, d.cfg.Experts),
		gen:        d.replicas.gen,
		offs:       make([]int, d.cfg.K),
		ws:         make([]float32, d.cfg.K),
		rowSrc:     make([][]byte, P),
		rowDelta:   make([]int, P),
		a2aSend:    make([]int, P),
		a2aRecv:    make([]int, P),
		sendSpans:  make([][]a2a.Span, P),
		recvSpans:  make([][]a2a.Span, P),
	}
	if d.shared {
		h.descOut, h.descIn = make([]byte, descriptorBytes*P), make([]byte, descriptorBytes*P)
	}
	return h
}

func (d *Dispatcher) recycle(h *Handle) {
	h.releaseHier()
	h.ctx, h.tokens, h.expertOut, h.out = nil, nil, nil, nil
	h.state = stateIdle
	d.settled(h)
	d.mu.Lock()
	stale := h.gen != d.replicas.gen // sized for a placement replaced since
	if (d.closed || stale) && !h.pending {
		h.freeSegments() // released after Close: nobody will hand it out again
	}
	if !stale {
		d.free = append(d.free, h)
	}
	d.mu.Unlock()
}

// prepare validates a dispatch, copies the decision, enforces capacity and
// plans the permutation, on the caller's goroutine.
func (d *Dispatcher) prepare(ctx context.Context, tokens []byte, dec *routing.Decision) (*Handle, error) {
	T, err := d.checkStep(ctx, tokens, dec)
	if err != nil {
		return nil, err
	}
	h := d.handle()
	if err := d.planStep(h, T, dec); err != nil {
		d.recycle(h)
		return nil, err
	}
	h.ctx, h.tokens = ctx, tokens
	h.state = stateDispatching
	d.opened(h)
	return h, nil
}

// checkStep validates a dispatch's arguments and returns its number of
// tokens.
func (d *Dispatcher) checkStep(ctx context.Context, tokens []byte, dec *routing.Decision) (int, error) {
	if ctx == nil {
		return 0, invalidf("nil context")
	}
	if dec == nil {
		return 0, invalidf("nil routing decision")
	}
	rb := d.rowBytes
	if len(tokens)%rb != 0 {
		return 0, invalidf("token buffer of %d bytes is not a multiple of the row size %d (hidden %d x %d-byte %v)",
			len(tokens), rb, d.cfg.Hidden, d.cfg.DType.Size(), d.cfg.DType)
	}
	T := len(tokens) / rb
	if dec.K != d.cfg.K {
		return 0, invalidf("decision has k=%d slots per token, the layer's top-k is %d", dec.K, d.cfg.K)
	}
	if dec.Tokens != T {
		return 0, invalidf("decision routes %d tokens, the token buffer holds %d rows", dec.Tokens, T)
	}
	if T > math.MaxInt32/d.cfg.K {
		return 0, invalidf("%d tokens x k %d is more than %d assignments", T, d.cfg.K, math.MaxInt32)
	}
	n := T * d.cfg.K
	if len(dec.Expert) != n || len(dec.Weight) != n {
		return 0, invalidf("decision has %d expert ids and %d weights, want %d each (%d tokens x k %d)",
			len(dec.Expert), len(dec.Weight), n, T, d.cfg.K)
	}
	if err := checkAssignments(dec, d.cfg.Experts); err != nil {
		return 0, err
	}
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return 0, fmt.Errorf("%w: dispatch: dispatcher closed", a2a.ErrClosed)
	}
	return T, nil
}

// planStep copies the decision of T tokens into h, enforces capacity and
// plans the permutation.
func (d *Dispatcher) planStep(h *Handle, T int, dec *routing.Decision) error {
	h.dec.Tokens, h.dec.K = T, d.cfg.K
	h.dec.Expert = append(h.dec.Expert[:0], dec.Expert...)
	h.dec.Weight = append(h.dec.Weight[:0], dec.Weight...)
	for i, e := range h.dec.Expert {
		if e == routing.Dropped {
			h.dec.Weight[i] = 0
		}
	}
	dropped, err := d.capacity.Apply(&h.dec, d.cfg.Experts, &h.capScratch)
	if err == nil {
		d.rt.assign(&h.dec, &h.slotDec, d.rank)
		err = h.plan.Build(&h.slotDec, d.rt.slots)
	}
	if err != nil {
		return wrapInvalid(err, "routing")
	}
	d.rt.expertRows(h.plan.ExpertRows, h.expertLoad)
	h.T, h.dropped = T, dropped
	return nil
}

// checkAssignments reports the first expert id out of range, expert named
// twice by one token (routing's rules), or non-finite weight.
func checkAssignments(dec *routing.Decision, experts int) error {
	if err := dec.CheckExperts(experts); err != nil {
		return wrapInvalid(err, "decision")
	}
	for i, w := range dec.Weight {
		if dec.Expert[i] != routing.Dropped && (w != w || math.IsInf(float64(w), 0)) {
			return invalidf("token %d slot %d: gate weight %v, want a finite number", i/dec.K, i%dec.K, w)
		}
	}
	return nil
}

// prepareCombine validates a combine on the caller's goroutine.
func (d *Dispatcher) prepareCombine(ctx context.Context, h *Handle, expertOutputs, out []byte) error {
	switch {
	case ctx == nil:
		return invalidf("nil context")
	case h == nil:
		return invalidf("nil handle")
	case h.d != d:
		return invalidf("handle belongs to another dispatcher")
	case h.pending:
		return invalidf("handle has an operation in flight: call Wait first")
	case h.state == stateIdle:
		return invalidf("handle was released")
	case h.state == stateCombined:
		return invalidf("handle already combined")
	case h.state != stateDispatched:
		return invalidf("handle's dispatch did not succeed")
	case len(expertOutputs) != len(h.recv):
		return invalidf("expert outputs hold %d bytes, want %d (the length of Output: %d rows of %d bytes, plus %d header bytes)",
			len(expertOutputs), len(h.recv), h.Rows(), d.rowBytes, len(h.recv)-h.Rows()*d.rowBytes)
	case len(out) != h.T*d.rowBytes:
		return invalidf("combine output holds %d bytes, want %d (%d tokens x %d)", len(out), h.T*d.rowBytes, h.T, d.rowBytes)
	}
	h.ctx, h.expertOut, h.out = ctx, expertOutputs, out
	h.state = stateCombining
	return nil
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: dispatch: "+format, append([]any{a2a.ErrInvalidArgument}, args...)...)
}

// wrapInvalid makes a routing error match both routing.ErrInvalid and
// a2a.ErrInvalidArgument.
func wrapInvalid(err error, what string) error {
	return fmt.Errorf("%w: dispatch: %s: %w", a2a.ErrInvalidArgument, what, err)
}

func boolBits(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func alignUp(n, a int) int { return (n + a - 1) / a * a }

func growInts(s []int, n int) []int {
	if cap(s) < n {
		return make([]int, n)
	}
	return s[:n]
}

func growFloats(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// grow returns b resliced to n bytes, or new memory (contents lost) if b
// is too small.
func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return largeBytes(n)
	}
	return b[:n]
}

// largeBytes allocates a buffer of the step (rows, outputs), advised to use
// huge pages when it spans some. The exchanges copy between ranks of a host
// with process_vm_readv, which pins every page it reads and walks every page
// it writes: on 4 KiB pages that is much of a MoE step's CPU time (see
// docs/PERFORMANCE.md, MoE step overhead). Heap memory rather than
// a2a.AllocBuffer, so that a handle dropped without Release is still
// collected; the advice stays with the address range, so heap memory reused
// after the buffer is freed keeps it too (harmless: it is only advice).
func largeBytes(n int) []byte {
	b := make([]byte, n)
	adviseHuge(b)
	return b
}
