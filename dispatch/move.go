package dispatch

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/routing"
)

// move is one copy of an expert's parameters: from a rank that holds the
// expert under the current placement to the rank of a slot that gets it.
type move struct{ expert, from, to int }

// planMoves lists the copies that take placement from to placement to, in
// the order of to's slots, and counts the changed slots (compared rank by
// rank, local slot by local slot, so that a change of slots per rank
// counts the slots added or emptied). A slot whose rank already holds its
// expert needs no copy. Every rank computes the same list.
func planMoves(from, to *routing.Placement, host func(int) int) (moves []move, changed int) {
	oldT, newT := from.SlotTable(), to.SlotTable()
	oldSpr, newSpr := len(oldT)/from.Ranks, len(newT)/to.Ranks
	w := max(oldSpr, newSpr)
	for s := range from.Ranks * w {
		r, l := s/w, s%w
		was, is := routing.EmptySlot, routing.EmptySlot
		if l < oldSpr {
			was = oldT[r*oldSpr+l]
		}
		if l < newSpr {
			is = newT[r*newSpr+l]
		}
		if was == is {
			continue
		}
		changed++
		if is != routing.EmptySlot && !holds(from, oldSpr, r, is) {
			moves = append(moves, move{expert: is, from: source(from, oldSpr, is, r, host), to: r})
		}
	}
	return moves, changed
}

// holds reports whether rank r hosts a replica of e under pl, spr slots
// per rank.
func holds(pl *routing.Placement, spr, r, e int) bool {
	for _, s := range pl.Replicas(e) {
		if s/spr == r {
			return true
		}
	}
	return false
}

// source picks the rank that sends e's parameters to rank to: one of e's
// holders on to's host if there are any, else any holder, spread by the
// destination so that an expert copied to several ranks is read from all
// its holders.
func source(pl *routing.Placement, spr, e, to int, host func(int) int) int {
	var near, all []int
	for _, s := range pl.Replicas(e) {
		all = append(all, s/spr)
		if host(s/spr) == host(to) {
			near = append(near, s/spr)
		}
	}
	if len(near) > 0 {
		all = near
	}
	return all[to%len(all)]
}

// Replace re-places the experts: it moves every changed slot's expert
// parameters (m.Export on a rank that holds the expert, m.Import on the
// rank that gets it) over the Comm's data plane, then switches the layer to
// pl. It is a collective, called between steps (no step dispatched and not
// yet combined and waited for, or released), with the same pl on every
// rank. Slots whose expert does not change, and slots whose rank already
// holds their expert, move nothing. [Dispatcher.LastReplace] reports the
// bytes moved and the time.
//
// Three exchanges: a fingerprint of pl with each rank's byte counts (a rank
// whose pl differs fails every rank with a2a.ErrMismatch, one that cannot
// take part, for a bad argument or a failed Export, with its error here and
// a2a.ErrAborted elsewhere); the parameters, one AllToAllV; and a vote on
// the imports. A rank switches only when it heard every rank vote yes: a
// failed Import, or a rank lost before its vote, leaves every rank on the
// old placement with a typed error (the failing rank's own, a2a.ErrAborted
// or the Comm's a2a.ErrPeerLost). A rank lost while it sends its votes
// (one message per peer) may leave the peers it told switched and the
// others not: after Comm.Shrink the survivors call [Dispatcher.Settle],
// which puts them all on one placement before they read Placement().
// Parameters imported by a Replace that then failed are left with the
// mover (Settle may still switch to them). Experts a rank no longer hosts
// after a successful Replace are not removed: the caller may drop those
// not in Placement().
func (d *Dispatcher) Replace(ctx context.Context, pl *routing.Placement, m ExpertMover) error {
	if ctx == nil {
		return invalidf("nil context")
	} else if d.ll != nil {
		return invalidf("replace: the decode mode's buffers are laid out for one placement")
	}
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return fmt.Errorf("%w: dispatch: dispatcher closed", a2a.ErrClosed)
	}
	if d.hier != nil {
		return invalidf("replace: not with the relay path (Config.Hierarchy); create the layer with HierarchyOff to re-place its experts")
	}
	if d.replicas.open > 0 || d.inflight.Load() > 0 {
		// Not even the first exchange: it would race the worker's
		// collectives on the Comm.
		return invalidf("replace: a step is in flight; replace between steps (after combine and Wait, or Release)")
	}
	start := time.Now()
	x := &replacement{d: d, to: pl, m: m}
	prepErr := x.prepare()
	if err := x.agree(ctx, prepErr); err != nil {
		return err // a doubt stays for Settle: the Comm that failed the vote fails this too
	}
	// Every rank got this far, so every rank's last vote completed: none
	// is in doubt of it any more.
	d.replicas.doubt = nil
	if err := d.comm.AllToAllV(ctx, x.send, x.sendCounts, x.recv, x.recvCounts); err != nil {
		return fmt.Errorf("dispatch: replace: moving the parameters: %w", err)
	}
	if err := x.vote(ctx, x.imports()); err != nil {
		return err
	}
	x.stats.Duration = time.Since(start)
	d.switched(pl, x.stats)
	if o, ok := d.cfg.Observer.(ReplaceObserver); ok {
		o.ObserveReplace(x.stats.ChangedSlots, x.stats.SentBytes, x.stats.Duration)
	}
	d.log.Debug("dispatch: experts re-placed", "rank", d.rank, "changed_slots", x.stats.ChangedSlots,
		"copies", x.stats.Copies, "bytes", x.stats.GroupBytes, "duration", x.stats.Duration)
	return nil
}

// replacement is one Replace call's state.
type replacement struct {
	d     *Dispatcher
	to    *routing.Placement
	m     ExpertMover
	moves []move
	hash  uint64

	send, recv             []byte
	sendCounts, recvCounts []int
	stats                  ReplaceStats
}

// prepare checks the arguments, plans the copies and exports this rank's
// into the send buffer: per destination, in plan order, each expert's
// parameters behind their 8-byte length.
func (x *replacement) prepare() error {
	d := x.d
	P := d.size
	x.sendCounts, x.recvCounts = make([]int, P), make([]int, P)
	if x.to == nil {
		return invalidf("replace: nil placement")
	}
	if err := x.to.Validate(); err != nil {
		return wrapInvalid(err, "replace: placement")
	}
	// Known from here on, so that the peers of a rank that fails a check
	// below still see which placement it was asked for.
	x.hash = placementHash(x.to)
	if x.m == nil {
		return invalidf("replace: nil expert mover")
	}
	if x.to.Experts != d.cfg.Experts || x.to.Ranks != P {
		// Another layer's or group's: invalid here, and a mismatch.
		return fmt.Errorf("%w: %w: dispatch: replace: placement of %d experts over %d ranks, want %d experts over the Comm's %d ranks",
			a2a.ErrInvalidArgument, a2a.ErrMismatch, x.to.Experts, x.to.Ranks, d.cfg.Experts, P)
	}
	x.moves, x.stats.ChangedSlots = planMoves(d.pl, x.to, d.comm.Host)
	x.stats.Copies = len(x.moves)
	exported := map[int][]byte{}
	blocks := make([][]byte, P)
	for _, mv := range x.moves {
		if mv.from != d.rank {
			continue
		}
		params, ok := exported[mv.expert]
		if !ok {
			var err error
			if params, err = x.m.Export(mv.expert); err != nil {
				return fmt.Errorf("%w: dispatch: replace: exporting expert %d: %w", a2a.ErrAborted, mv.expert, err)
			}
			exported[mv.expert] = params
		}
		blocks[mv.to] = binary.LittleEndian.AppendUint64(blocks[mv.to], uint64(len(params)))
		blocks[mv.to] = append(blocks[mv.to], params...)
	}
	for j, b := range blocks {
		x.sendCounts[j] = len(b)
		x.send = append(x.send, b...)
		x.stats.SentBytes += int64(len(b))
	}
	return nil
}

// replaceHeader is the size of the first exchange's message to each peer:
// the placement's fingerprint, whether the sender can go on, the bytes it
// sends this peer and the bytes it sends in all.
const replaceHeader = 32

// agree runs the first exchange and fails, on every rank alike, if some
// rank could not prepare (prepErr on this one) or proposed another
// placement. It sizes the receive buffer.
func (x *replacement) agree(ctx context.Context, prepErr error) error {
	d := x.d
	P, le := d.size, binary.LittleEndian
	send, recv := make([]byte, replaceHeader*P), make([]byte, replaceHeader*P)
	for j := range P {
		b := send[replaceHeader*j:]
		le.PutUint64(b, x.hash)
		if prepErr != nil {
			le.PutUint64(b[8:], 1)
		} else {
			le.PutUint64(b[16:], uint64(x.sendCounts[j]))
			le.PutUint64(b[24:], uint64(x.stats.SentBytes))
		}
	}
	if err := d.comm.AllToAll(ctx, send, recv); err != nil {
		return fmt.Errorf("dispatch: replace: comparing placements: %w", err)
	}
	if prepErr != nil {
		return prepErr
	}
	total := 0
	for i := range P {
		b := recv[replaceHeader*i:]
		switch {
		case le.Uint64(b) != x.hash:
			return fmt.Errorf("%w: dispatch: replace: rank %d proposes a different placement than rank %d; the placement is unchanged",
				a2a.ErrMismatch, i, d.rank)
		case le.Uint64(b[8:]) != 0:
			return fmt.Errorf("%w: dispatch: replace: rank %d could not take part (see its error); the placement is unchanged", a2a.ErrAborted, i)
		}
		x.recvCounts[i] = int(le.Uint64(b[16:]))
		x.stats.GroupBytes += int64(le.Uint64(b[24:]))
		total += x.recvCounts[i]
	}
	x.recv = make([]byte, total)
	x.stats.ReceivedBytes = int64(total)
	return nil
}

// imports hands the received parameters to the mover, in plan order per
// source rank, and returns the first failure.
func (x *replacement) imports() error {
	d := x.d
	off := make([]int, d.size) // next byte of each source's block
	pos := 0
	for i, n := range x.recvCounts {
		off[i] = pos
		pos += n
	}
	for _, mv := range x.moves {
		if mv.to != d.rank {
			continue
		}
		end := off[mv.from] + 8
		if end > len(x.recv) {
			return fmt.Errorf("%w: dispatch: replace: rank %d sent too few bytes for expert %d", a2a.ErrMismatch, mv.from, mv.expert)
		}
		n := int(binary.LittleEndian.Uint64(x.recv[off[mv.from]:]))
		if n < 0 || end+n > len(x.recv) {
			return fmt.Errorf("%w: dispatch: replace: rank %d sent a bad length for expert %d", a2a.ErrMismatch, mv.from, mv.expert)
		}
		if err := x.m.Import(mv.expert, x.recv[end:end+n]); err != nil {
			return fmt.Errorf("%w: dispatch: replace: importing expert %d: %w", a2a.ErrAborted, mv.expert, err)
		}
		off[mv.from] = end + n
	}
	return nil
}

// voteTag is the point-to-point tag of Replace's vote.
const voteTag = 0x52504c56 // "RPLV"

// vote runs the last exchange: every rank tells every peer whether its
// imports succeeded, one message per peer, and all switch only if every
// one did. The messages go one after another (each send done before the
// next starts), so a rank lost while voting has told some peers and not
// the others: those that heard every vote switch, the others fail, and
// Settle reconciles them on the survivors' Comm. A rank that voted yes and
// heard no "no" before the exchange failed is in doubt: some peer may
// have switched. It keeps the proposed placement for Settle.
func (x *replacement) vote(ctx context.Context, importErr error) error {
	d := x.d
	P := d.size
	mine := []byte{0}
	if importErr != nil {
		mine[0] = 1
	}
	votes := make([]byte, P)
	recvs := make([]*a2a.Request, 0, P-1)
	for i := range P {
		if i != d.rank {
			recvs = append(recvs, d.comm.Irecv(ctx, votes[i:i+1], i, voteTag))
		}
	}
	var err error
	for k := 1; k <= P && err == nil; k++ {
		if hook := d.replicas.voteSent; hook != nil {
			hook(k - 1) // the tests lose the rank after k-1 of its votes
		}
		if k < P {
			err = d.comm.Send(ctx, mine, (d.rank+k)%P, voteTag)
		}
	}
	for _, r := range recvs {
		// Waited for even after a failure: the receive buffers are
		// ours until every request has ended.
		if _, rerr := r.Wait(ctx); rerr != nil && err == nil {
			err = rerr
		}
	}
	if importErr != nil {
		return importErr
	}
	for i, v := range votes {
		if v != 0 {
			return fmt.Errorf("%w: dispatch: replace: rank %d could not import its experts (see its error); the placement is unchanged", a2a.ErrAborted, i)
		}
	}
	if err != nil {
		d.replicas.doubt = &doubt{pl: x.to, stats: x.stats}
		return fmt.Errorf("dispatch: replace: agreeing to switch (in doubt until Settle): %w", err)
	}
	return nil
}

// switchTo makes pl the layer's placement. Handles sized for the old one
// are not reused: the free ones are dropped now, those the caller still
// holds when it releases them.
func (d *Dispatcher) switchTo(pl *routing.Placement) {
	rt := newRoute(pl, d.rank, d.comm.Host, d.cfg.Counts)
	d.mu.Lock()
	d.setRoute(rt)
	d.replicas.gen++
	stale := d.free
	d.free = nil
	d.mu.Unlock()
	for _, h := range stale {
		h.freeSegments()
	}
	d.replicas.load.prevValid = false // the rows of the last dispatch are of the old slots
}
