package a2a

import (
	"context"
	"errors"
	"slices"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// ShrinkObserver is an Observer that also hears of shrinks (package
// metrics counts them). Shrink tells the new communicator's observer.
type ShrinkObserver interface {
	// Shrunk is called on every survivor once the shrunk communicator has
	// formed: lost are the ranks of the old one that are gone, in the old
	// numbering; oldSize and newSize the sizes before and after.
	Shrunk(lost []int, oldSize, newSize int)
}

// Shrink returns a communicator of the ranks of c that survived the loss
// that aborted c, renumbered in their old order, without restarting any
// process (as ncclCommShrink or MPI ULFM's MPI_Comm_shrink do). Every
// survivor calls it after an operation failed with ErrPeerLost; it closes c
// and joins the same group again with the survivors: a new membership epoch,
// on the same control plane and data-plane configuration.
//
// The lost ranks are the ones c's abort names as lost (errors.Is(err,
// ErrPeerLost), every survivor hears the same cause) and the ones that left.
// Shrink fails with ErrInvalidArgument when c is healthy or lost no rank,
// and with ErrPeerLost when the group declared this rank itself lost. When
// survivors disagree on who is lost (two losses at once, each seen by some
// ranks first), their world sizes differ and the join fails on every one of
// them with ErrInvalidArgument rather than forming a wrong group; nobody
// waits longer than ctx allows (or Config.Timeout when ctx has no deadline).
//
// FormerRanks tells the new communicator's ranks' numbers in c.
func (c *Comm) Shrink(ctx context.Context) (*Comm, error) {
	if c.isChild() {
		return nil, fault.New(fault.ErrInvalidArgument, c.rank, "Shrink: a communicator made by Split or Dup does not shrink; shrink the one that joined, and split it again")
	}
	cause := c.Err()
	if cause == nil {
		return nil, fault.New(fault.ErrInvalidArgument, c.rank, "Shrink: the communicator is healthy")
	}
	lost := lostRanks(cause, c.size)
	if len(lost) == 0 {
		return nil, fault.Wrap(fault.ErrInvalidArgument, c.rank, cause, "Shrink: no rank was lost (the group aborted for another reason: join anew)")
	}
	if slices.Contains(lost, c.rank) {
		return nil, fault.Wrap(fault.ErrPeerLost, c.rank, cause, "Shrink: the group declared this rank lost")
	}
	survivors := make([]int, 0, c.size-len(lost))
	newRank := -1
	for r := range c.size {
		if slices.Contains(lost, r) {
			continue
		}
		if r == c.rank {
			newRank = len(survivors)
		}
		survivors = append(survivors, r)
	}
	cfg := c.cfg
	cfg.Rank, cfg.WorldSize = newRank, len(survivors)
	oldSize := c.size
	// Close first: the data plane may listen on a fixed port, and leaving
	// ends this rank's part in the old formation, so the coordinator
	// re-forms the group at once instead of after a peer timeout.
	_ = c.Close()
	nc, err := Join(ctx, cfg)
	if err != nil {
		return nil, err
	}
	nc.formerRanks = survivors
	if so, ok := cfg.Observer.(ShrinkObserver); ok {
		so.Shrunk(lost, oldSize, nc.size)
	}
	nc.log.Info("a2a: shrunk", "group", cfg.Group, "lost", lost, "rank", nc.rank, "size", nc.size, "former_rank", survivors[nc.rank])
	return nc, nil
}

// FormerRanks returns, for a communicator made by Shrink, the rank each of
// its ranks had in the communicator it was shrunk from (index: new rank);
// nil for one made by Join.
func (c *Comm) FormerRanks() []int { return slices.Clone(c.formerRanks) }

// lostRanks returns the ranks (below size) that the error chain of an abort
// names as lost, sorted and without repeats.
func lostRanks(err error, size int) []int {
	var lost []int
	for err != nil {
		var fe *fault.Error
		if !errors.As(err, &fe) {
			break
		}
		if fe.Kind == fault.ErrPeerLost && fe.Rank >= 0 && fe.Rank < size && !slices.Contains(lost, fe.Rank) {
			lost = append(lost, fe.Rank)
		}
		err = fe.Err
	}
	slices.Sort(lost)
	return lost
}
