package dispatch

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/routing"
)

// switched makes pl, which a Replace moved the parameters for, the layer's
// placement.
func (d *Dispatcher) switched(pl *routing.Placement, st ReplaceStats) {
	d.switchTo(pl)
	d.replicas.last = st
	d.replicas.replacements++
}

// settleBytes is each rank's message in Settle: the fingerprint of its
// placement and of the one it is in doubt of (0: none).
const settleBytes = 16

// Settle puts the survivors of a rank lost during Replace on one placement.
// It is a collective on c, the Comm that Comm.Shrink returned (the
// survivors, renumbered), called by every survivor on its old dispatcher,
// closed or not, before it reads Placement() to build the new one.
//
// A Replace commits when any rank heard every vote yes: that rank has
// switched, and every other rank voted yes, so its imports are done. The
// survivors left on the old placement are then in doubt of the new one
// (see Replace), and Settle switches them to it; if no survivor switched,
// all stay where they are. Either way Placement() is then the same on
// every survivor, so Placement().Shrink agrees and the new dispatcher
// starts. With no Replace interrupted it changes nothing. It fails with
// a2a.ErrMismatch when the survivors' placements cannot be reconciled (they
// did not run the same Replace calls), and with c's error when the
// exchange fails.
func (d *Dispatcher) Settle(ctx context.Context, c *a2a.Comm) error {
	if ctx == nil || c == nil {
		return invalidf("settle: nil context or Comm")
	}
	le := binary.LittleEndian
	mine := placementHash(d.pl)
	var doubted uint64
	if dt := d.replicas.doubt; dt != nil {
		doubted = placementHash(dt.pl)
	}
	send, recv := make([]byte, settleBytes), make([]byte, settleBytes*c.Size())
	le.PutUint64(send, mine)
	le.PutUint64(send[8:], doubted)
	if err := c.AllGather(ctx, send, recv); err != nil {
		return fmt.Errorf("dispatch: settle: %w", err)
	}
	// The placements in force: the old one and, if a rank switched, the
	// new one, which every rank still on the old one is in doubt of.
	follow := false
	for i := range c.Size() {
		h, dh := le.Uint64(recv[settleBytes*i:]), le.Uint64(recv[settleBytes*i+8:])
		switch {
		case h == mine:
		case doubted != 0 && h == doubted:
			follow = true // it switched: this rank follows
		case dh != 0 && dh == mine:
			// It is in doubt of this rank's placement: it follows.
		default:
			return fmt.Errorf("%w: dispatch: settle: survivor %d's placement is neither this rank's nor one either is in doubt of: "+
				"the survivors did not run the same re-placements", a2a.ErrMismatch, i)
		}
	}
	if dt := d.replicas.doubt; follow {
		d.log.Debug("dispatch: settle: a survivor switched; following it", "rank", d.rank)
		d.switched(dt.pl, dt.stats)
	}
	d.replicas.doubt = nil
	return nil
}
