package dispatch

import (
	"context"
	"encoding/binary"
	"hash/fnv"
	"math"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/routing"
)

// ExpertMover gives Replace access to the experts' parameters, which the
// caller owns: Replace moves them, as opaque bytes, from a rank that holds
// an expert to the ranks that host it next.
type ExpertMover interface {
	// Export returns the parameters of expert, which this rank hosts. The
	// bytes are read during the Replace call only.
	Export(expert int) ([]byte, error)
	// Import installs the parameters of expert, which this rank hosts once
	// Replace succeeds. It must not disturb the experts this rank hosts
	// now: if Replace then fails, they are what the next steps run.
	Import(expert int, params []byte) error
}

// Rebalance makes Dispatch re-place the experts by itself (see
// [Dispatcher.Replace]): every Every dispatches it computes
// routing.Balance from [Dispatcher.Load] and, when the current placement's
// estimated max/mean rank load exceeds Threshold and the balanced one is
// better, moves the experts with Mover. The zero value is off.
type Rebalance struct {
	// Every is the number of dispatches between checks (0: never). A check
	// due while a step is in flight (dispatched, not yet combined and
	// waited for) waits for the next Dispatch without one.
	Every int
	// Threshold is the max/mean rank load (routing.Imbalance of the
	// estimated rank loads) above which the experts are re-placed; 0
	// re-places whenever Balance does better.
	Threshold float64
	// Redundant is the number of slots beyond one per expert: Balance gets
	// Experts+Redundant slots, which must be a multiple of the ranks.
	Redundant int
	// Mover moves the parameters; required when Every > 0. It is not
	// compared across ranks.
	Mover ExpertMover
}

// ReplaceStats describes the last successful re-placement of a dispatcher
// ([Dispatcher.LastReplace]).
type ReplaceStats struct {
	// ChangedSlots is the number of physical slots whose expert changed,
	// over the group.
	ChangedSlots int
	// Copies is the number of expert parameter sets sent between ranks,
	// over the group: changed slots whose rank did not already hold the
	// expert.
	Copies int
	// SentBytes and ReceivedBytes are this rank's parameter bytes;
	// GroupBytes is every rank's sent bytes summed.
	SentBytes, ReceivedBytes, GroupBytes int64
	// Duration runs from the call to the switch, exports and imports
	// included.
	Duration time.Duration
}

// ReplaceObserver is an Observer that also wants every successful
// re-placement: the slots that changed over the group, the parameter bytes
// this rank sent (summed over the ranks: the bytes moved) and how long it
// took. *metrics.Observer implements it.
type ReplaceObserver interface {
	// ObserveReplace runs on the goroutine that called Replace (or Dispatch).
	ObserveReplace(changedSlots int, sentBytes int64, d time.Duration)
}

// replicaState is the dispatcher's re-placement state, used from the
// caller's goroutine (gen also under mu: recycle reads it).
type replicaState struct {
	gen          uint64 // bumped by every switch: handles of older ones are not reused
	open         int    // steps prepared and not settled (see opened)
	since        int    // dispatches since the last automatic check
	ranksPerHost int
	load         loadState
	last         ReplaceStats
	replacements int
	doubt        *doubt         // the last Replace's placement, if this rank is in doubt of it
	voteSent     func(sent int) // tests: runs before each vote sent, and after the last
}

// doubt is a Replace this rank voted for whose vote exchange failed: a peer
// may have heard every vote and switched. Settle resolves it.
type doubt struct {
	pl    *routing.Placement
	stats ReplaceStats
}

// setRoute makes rt the layer's route.
func (d *Dispatcher) setRoute(rt *route) {
	d.rt, d.pl = rt, rt.pl
	d.nLocal, d.maxLocal, d.hdr = rt.nLocal, rt.maxLocal, rt.hdr
	d.hdrSelf = rt.hdr[d.rank]
}

// opened counts a prepared step as open until the caller has seen it
// combined (or failed) or released it. Replace runs only with none open, and
// the automatic one checks only then: both depend on what the caller did,
// never on how far the worker got, so every rank decides alike.
func (d *Dispatcher) opened(h *Handle) {
	h.open = true
	d.replicas.open++
	d.replicas.since++
}

// settled ends h's open step.
func (d *Dispatcher) settled(h *Handle) {
	if h.open {
		h.open = false
		d.replicas.open--
	}
}

// settleIfDone ends h's open step if its combine ran (or it failed).
func (h *Handle) settleIfDone() {
	if !h.pending && (h.state == stateCombined || h.state == stateFailed) {
		h.d.settled(h)
	}
}

// LastReplace returns the statistics of the last successful Replace (the
// zero value before one).
func (d *Dispatcher) LastReplace() ReplaceStats { return d.replicas.last }

// Replacements returns the number of successful re-placements, automatic
// ones included.
func (d *Dispatcher) Replacements() int { return d.replicas.replacements }

// checkRebalance validates cfg.Rebalance against the group and notes the
// ranks per host Balance gets.
func (d *Dispatcher) checkRebalance() error {
	rb, n := d.cfg.Rebalance, d.cfg.Experts+d.cfg.Rebalance.Redundant
	switch {
	case rb.Every < 0:
		return invalidf("rebalance every %d dispatches, want >= 0 (0: off)", rb.Every)
	case rb.Every == 0:
	case rb.Mover == nil:
		return invalidf("rebalance without a mover: the experts' parameters could not move")
	case math.IsNaN(rb.Threshold) || math.IsInf(rb.Threshold, 0):
		return invalidf("rebalance threshold %v, want finite", rb.Threshold)
	case rb.Redundant < 0 || n%d.size != 0 || n/d.size > d.cfg.Experts:
		return invalidf("rebalance with %d redundant slots: %d experts plus them must be a multiple of the %d ranks, at most %d per rank",
			rb.Redundant, d.cfg.Experts, d.size, d.cfg.Experts)
	}
	d.replicas.ranksPerHost = ranksPerHost(d.comm)
	return nil
}

// ranksPerHost is the ranks of one host when the hosts hold equal blocks of
// consecutive ranks (host ordinals number hosts in rank order), as Balance's
// hierarchical policy assumes; otherwise all ranks, which makes Balance
// place globally.
func ranksPerHost(c *a2a.Comm) int {
	n := 0
	for n < c.Size() && c.Host(n) == c.Host(0) {
		n++
	}
	for r := range c.Size() {
		if c.Size()%n != 0 || c.Host(r) != r/n {
			return c.Size()
		}
	}
	return n
}

// placementHash fingerprints pl's slot table and extra values.
func placementHash(pl *routing.Placement, extra ...uint64) uint64 {
	h := fnv.New64a()
	var b [8]byte
	put := func(v uint64) {
		binary.LittleEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	put(uint64(pl.Experts))
	put(uint64(pl.Ranks))
	for _, e := range pl.SlotTable() {
		put(uint64(e))
	}
	for _, v := range extra {
		put(v)
	}
	return h.Sum64()
}

// autoReplace runs the check of Config.Rebalance when it is due.
func (d *Dispatcher) autoReplace(ctx context.Context) error {
	rb, st := d.cfg.Rebalance, &d.replicas
	if rb.Every <= 0 || st.since < rb.Every || st.open > 0 {
		return nil
	}
	load := d.Load()
	if load == nil {
		return nil
	}
	st.since = 0
	now := d.rankImbalance(load)
	if now <= rb.Threshold {
		return nil
	}
	pl, err := routing.Balance(load, d.size, st.ranksPerHost, d.cfg.Experts+rb.Redundant)
	if err != nil {
		return wrapInvalid(err, "rebalance")
	}
	after, err := pl.RankLoad(load)
	if err != nil || routing.Imbalance(after) >= now {
		return nil // nothing better to move to
	}
	d.log.Debug("dispatch: re-placing the experts", "rank", d.rank, "imbalance", now, "balanced", routing.Imbalance(after))
	return d.Replace(ctx, pl, rb.Mover)
}
