package a2a

import (
	"context"
	"encoding/binary"
	"slices"
	"sort"
	"sync"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/a2a/internal/engine"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// Undefined is the color of a rank that takes part in Split without
// joining any of the new communicators (MPI_UNDEFINED): it gets (nil, nil).
const Undefined = -1

// sharing is what a communicator shares with the one that joined (the
// root) and its other descendants: the data plane's demultiplexer, and for
// a communicator made by Split or Dup its view of the data plane, its abort
// scope on the control plane and its ranks' numbers in the root.
type sharing struct {
	demux *transport.Demux
	view  *transport.View // nil for the root
	scope *control.Scope  // nil for the root
	root  []int           // rank -> the root's rank; nil for the root
	// mu orders this Comm's Split and Dup calls with Close: a child is
	// made under it, and Close of a child under it too.
	mu sync.Mutex
}

// isChild reports whether c was made by Split or Dup: it shares the data
// plane of the communicator that joined, whose control plane knows the
// joined group only.
func (c *Comm) isChild() bool { return c.share != nil && c.share.scope != nil }

// rootRank is rank's number in the root communicator.
func (s *sharing) rootRank(rank int) int {
	if s.root == nil {
		return rank
	}
	return s.root[rank]
}

// Split partitions the communicator as MPI_Comm_split does: every rank
// calls it (a collective), and the ranks that pass the same color form a
// new communicator, ranked by key, then by their rank here. A rank that
// passes Undefined gets (nil, nil). Colors are Undefined or at least 0; a
// rank that passes another fails every rank's Split with
// ErrInvalidArgument, and the Comm stays usable.
//
// The new communicators share this one's data plane: no new connections,
// segments or queue pairs. Their frames carry a communicator id of their
// own (transport.Demux), so collectives of this Comm and of its children
// may run at once from different goroutines. Each has its own op numbers
// and abort scope: a failure inside a child aborts that child only, while
// losing a process (or a peer that leaves the group) fails every
// communicator that contains it with ErrPeerLost. Ranks in a child's
// errors are those of the communicator that joined. A child runs its small
// messages through frames, not LL slots, and refuses ExchangeCounts (use
// in-band counts). Close a child before its parent; closing the parent
// fails the children's calls.
func (c *Comm) Split(ctx context.Context, color, key int) (*Comm, error) {
	if color < 0 && color != Undefined {
		color = -2 // every rank learns it and refuses the split
	}
	d := c.share.demux
	rec := make([]byte, 24)
	binary.LittleEndian.PutUint64(rec[0:], uint64(int64(color)))
	binary.LittleEndian.PutUint64(rec[8:], uint64(int64(key)))
	binary.LittleEndian.PutUint64(rec[16:], uint64(d.Next()))
	all := make([]byte, 24*c.size)
	c.share.mu.Lock()
	defer c.share.mu.Unlock()
	if err := c.AllGather(ctx, rec, all); err != nil {
		return nil, err
	}
	colors, keys := make([]int, c.size), make([]int, c.size)
	next := 0
	for r := range c.size {
		colors[r] = int(int64(binary.LittleEndian.Uint64(all[24*r:])))
		keys[r] = int(int64(binary.LittleEndian.Uint64(all[24*r+8:])))
		next = max(next, int(binary.LittleEndian.Uint64(all[24*r+16:])))
		if colors[r] < 0 && colors[r] != Undefined {
			return nil, fault.New(fault.ErrInvalidArgument, r, "Split: rank %d passed a color below 0 other than Undefined", r)
		}
	}
	distinct := slices.Compact(slices.Sorted(slices.Values(slices.DeleteFunc(slices.Clone(colors), func(x int) bool { return x == Undefined }))))
	if next+len(distinct) > 1<<16 {
		return nil, fault.New(fault.ErrResource, c.rank, "Split: the data plane's %d communicator ids are used up", 1<<16-1)
	}
	// Every rank skips the ids of all the new communicators, its own
	// opened first (Open refuses an id below the next unused one).
	defer d.Reserve(uint16(min(next+len(distinct), 1<<16-1)))
	if color == Undefined {
		return nil, nil
	}
	members := make([]int, 0, c.size)
	for r := range c.size {
		if colors[r] == color {
			members = append(members, r)
		}
	}
	sort.SliceStable(members, func(i, j int) bool { return keys[members[i]] < keys[members[j]] })
	id := uint16(next + slices.Index(distinct, color))
	return c.newChild(id, members)
}

// Dup returns a communicator of the same ranks in the same order, sharing
// this one's data plane, with its own op numbers and abort scope (Split
// with one color, keyed by rank). Every rank calls it.
func (c *Comm) Dup(ctx context.Context) (*Comm, error) { return c.Split(ctx, 0, c.rank) }

// newChild makes the communicator id of this Comm's ranks members (in the
// child's order) on this rank, with no message exchanged: every member
// computed the same id and members from Split's AllGather.
func (c *Comm) newChild(id uint16, members []int) (*Comm, error) {
	me := slices.Index(members, c.rank)
	root := make([]int, len(members))
	for i, r := range members {
		root[i] = c.share.rootRank(r)
	}
	view, err := c.share.demux.Open(id, root)
	if err != nil {
		return nil, err
	}
	scope, err := c.member.OpenScope(id, root)
	if err != nil {
		view.Close()
		return nil, err
	}
	cfg := c.cfg
	cfg.Rank, cfg.WorldSize = me, len(members)
	a, _ := parseAlgo(cfg.Algo)
	ar, _ := parseAllReduceAlgo(cfg.AlgoAllReduce)
	child := &Comm{cfg: cfg, log: c.log.With("comm", id), observer: c.observer, rank: me, size: len(members),
		member: c.member, tr: view, byPeer: make([]transport.Transport, len(members)),
		share: &sharing{demux: c.share.demux, view: view, scope: scope, root: root},
		plan:  planState{algo: a, allReduceAlgo: ar, classes: c.plan.classes, links: c.plan.links},
		life:  lifecycle{closing: make(chan struct{})}}
	for i, r := range members {
		child.byPeer[i] = c.byPeer[r]
	}
	nodes := c.member.Nodes()
	sub := make([]control.NodeInfo, len(root))
	for i, r := range root {
		sub[i] = nodes[r]
		sub[i].Rank = i
	}
	child.topo = newTopology(sub)
	child.eng = engine.New(engine.Options{
		Transport: view, Rank: me, Size: len(members), Streams: cfg.Streams, Epoch: c.member.Epoch(),
		Waiting: c.eng.Waiting(), Hosts: child.topo.hosts, Timeout: cfg.Timeout, Stopped: child.stopped,
	})
	child.readyEngine()
	child.ll = child.newLLPolicy()
	if child.plan.algo == algo.AlgoAuto {
		child.plan.algo = child.plan.chooser.Choose(child.choiceArgs(nil))
	}
	child.life.watchWG.Add(1)
	go child.watchControl()
	child.log.Debug("a2a: split", "rank", me, "size", len(members), "root ranks", root)
	return child, nil
}

// closeChild is a child's teardown: its peers' calls this rank did not
// finish fail with ErrPeerLost, and its view of the data plane closes.
// The data plane and the control plane stay the root's.
func (c *Comm) closeChild() error {
	c.share.scope.LeaveAt(c.life.okSeq.Load() + 2)
	err := c.share.view.Close()
	c.eng.Close() // after the view: none of its sends is in flight
	return err
}

// errChildCounts refuses ExchangeCounts on a child: the control plane's
// counts exchange knows the group that joined only.
func errChildCounts(rank int) error {
	return fault.New(fault.ErrInvalidArgument, rank, "ExchangeCounts: not available on a communicator made by Split or Dup (the control plane knows the group that joined only); exchange the counts in band, with an AllToAll of them")
}
