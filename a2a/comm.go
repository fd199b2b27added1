// Package a2a is the Go client of the a2a all-to-all service: a communicator
// (Comm) that joins a group of ranks over a NATS control plane and runs
// collectives, foremost the variable-size AllToAllV of MoE dispatch and
// combine, over a data plane chosen per pair of ranks: shared memory between
// ranks of one host, RDMA verbs between hosts that both have an active port,
// TCP otherwise (packages transport/shm, transport/verbs and transport/tcp,
// in that order in DefaultProviders).
//
// Every collective is planned as a schedule (package algo) and executed by one
// engine. Any failure — a bad argument, ranks calling different collectives, a
// lost peer, a timeout — aborts the communicator on every rank: each blocked call
// returns a typed error within a bounded time, and the Comm must then be closed
// (a new Join forms a new membership epoch). An abort concerns the failed call
// and those after it: calls before it complete normally on every rank.
package a2a

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/a2a/internal/engine"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// Comm is one rank's communicator, safe for concurrent use.
//
// Collectives (AllToAllV, AllReduce, Barrier, ExchangeCounts, ...): every
// rank of the group calls the same ones in the same order, one at a time. A
// collective called while another runs on the same Comm (from another
// goroutine) is rejected with ErrInvalidArgument and aborts the
// communicator from that call on, since the ranks could not agree on the
// order of the two; the running one completes. Callers that issue
// collectives from several goroutines must order them themselves. The
// nonblocking collectives (IAllToAllV, ...) and persistent ones are the
// exception: started ones run in the order started, and a blocking
// collective called after them waits for them.
//
// Point-to-point calls (Send, Recv, Isend, Irecv, SendRecv, Group) may come
// from any number of goroutines at once and progress together (see Send).
//
// Failures: an abort carries the op sequence number of the call that failed
// (collectives count 2, 4, 6, ...; a point-to-point call is numbered one
// after the last collective begun before it). Calls numbered before it
// complete normally on every rank when their data moves; calls at or after
// it fail with ErrAborted wrapping the cause. An argument error is caught
// before any byte moves and still aborts, scoped that way: the peers that
// entered the same call would otherwise wait for a rank that never sends.
// A rank that leaves (Close) or is lost fails every wait that needs it with
// ErrPeerLost naming it, within the heartbeat timeout (1.5 s) at most.
type Comm struct {
	cfg Config
	log *slog.Logger
	// observer is Config.Observer once Join returns: the join's own
	// collectives (agreeing on the link table) are not reported.
	observer    Observer
	rank, size  int
	formerRanks []int // set by Shrink: each rank's number before it

	nc     *nats.Conn
	member *control.Member
	tr     transport.Transport
	byPeer []transport.Transport // the part of tr that reaches each rank
	eng    *engine.Engine
	// queue lets point-to-point calls and collectives share the engine
	// (requests.go); it numbers the operations.
	queue *progressQueue

	life    lifecycle
	topo    topology
	ll      llPolicy
	plan    planState
	scratch scratch
	rep     *reporter // traffic reports for a2ad's live view (tally.go); nil when off
	// share is the data plane's sharing with Split's and Dup's
	// communicators (split.go).
	share *sharing
}

// lifecycle is what admits a call, and what stops it: Close, this rank's
// abort, the collective running.
type lifecycle struct {
	// calls is held shared by every call while it runs, and exclusively by
	// Close, which so waits for the running calls to give up.
	calls sync.RWMutex
	// collBusy: a collective runs; it owns the Comm's planning state and
	// scratch.
	collBusy atomic.Bool
	okSeq    atomic.Uint64 // op sequence of the last collective completed
	// abort is this rank's own abort and its scope (the member holds the
	// peers' and the departures); nil while healthy.
	abort   atomic.Pointer[localAbort]
	closed  atomic.Bool
	closing chan struct{} // closed by Close: stops watchControl and control-plane waits
	watchWG sync.WaitGroup
}

// planState is what choosing and planning an operation reads and keeps.
type planState struct {
	algo algo.Algo // the AllToAllV algorithm: forced, or chosen at join
	// allReduceAlgo is forced by A2A_ALGO_ALLREDUCE, or auto.
	allReduceAlgo algo.Algo
	// lastAlgo is the algo.Algo of the last collective: atomic, and
	// written only when it changes, so a steady loop of calls costs a load.
	lastAlgo  atomic.Uint32
	links     algo.Links    // the link table all ranks agreed on at join
	classes   linkClasses   // what the data planes the Comm may use offer
	chooser   algo.Chooser  // the automatic AllToAllV choice
	sched     algo.Schedule // the plan of a call the cache does not keep
	cache     planCache
	ringCheck algo.Schedule // rooted collectives' agreement round
	allReduce allReducePlan // the last AllReduce's plan (planner.go)
	// unevenOnce logs once that staged falls back on uneven hosts.
	unevenOnce sync.Once
	// llRounds counts the blocking calls that ran a cached LL round
	// (blockll.go); written by the collective running.
	llRounds uint64
}

// scratch is the buffers a collective reuses from call to call, so that a
// steady-state call allocates nothing.
type scratch struct {
	bufs engine.Buffers
	// AllToAll's counts and the in-band counts exchange
	equalSend, equalRecv []int
	countsOut, countsIn  []byte
	matSend, matRecv     []int // AllToAllVMatrix's row and column
	// in-band matrix gathering for staged without a caller-supplied matrix
	matrix          []int
	rowsOut, rowsIn []byte
	rowCounts       []int
	// AllToAllVSpans' scratch (spans.go), made at its first call.
	spans *spanState
}

func newScratch(size int) scratch {
	return scratch{equalSend: make([]int, size), equalRecv: make([]int, size),
		countsOut: make([]byte, 8*size), countsIn: make([]byte, 8*size),
		matSend: make([]int, size), matRecv: make([]int, size)}
}

// Join connects to the control plane, rendezvous with the other ranks of
// cfg.Group, and connects the data plane to every peer. It returns when the
// group is complete, or fails with ErrInvalidArgument (bad config, duplicate
// rank, world size disagreement), ErrTimeout (ctx deadline, or cfg.Timeout when
// ctx has none) or the error that stopped it.
func Join(ctx context.Context, cfg Config) (*Comm, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	a, _ := parseAlgo(cfg.Algo)
	ar, _ := parseAllReduceAlgo(cfg.AlgoAllReduce)
	c := &Comm{cfg: cfg, log: cfg.Logger, plan: planState{algo: a, allReduceAlgo: ar, classes: newLinkClasses(cfg.allProviders())}, life: lifecycle{closing: make(chan struct{})}}
	if err := c.join(ctx); err != nil {
		c.teardown()
		return nil, err
	}
	c.observer = cfg.Observer
	c.life.watchWG.Add(1)
	go c.watchControl()
	c.startReports()
	c.log.Debug("a2a: joined", "group", cfg.Group, "rank", c.rank, "size", c.size, "epoch", c.member.Epoch())
	return c, nil
}

// join runs the joining steps in order: the control plane, this rank's data
// plane endpoints, the rendezvous, the data plane's connections, the engine,
// and the link table every rank agrees on.
func (c *Comm) join(ctx context.Context) error {
	if err := c.connectControl(); err != nil {
		return err
	}
	if c.cfg.Listen == "" {
		c.cfg.Listen = defaultListen(c.nc.ConnectedAddr())
	}
	id := c.cfg.identity()
	dp, err := listen(ctx, c.cfg, transport.Self{Group: c.cfg.Group, Rank: c.cfg.Rank, Size: c.cfg.WorldSize, Host: id.host,
		Streams: c.cfg.Streams, Secret: id.secret, Logger: c.log})
	if err != nil {
		return err
	}
	defer dp.close()
	if err := c.rendezvous(ctx, id, dp.addresses()); err != nil {
		return err
	}
	if err := c.connectData(ctx, dp); err != nil {
		return err
	}
	c.startEngine()
	if err := c.agreeLinks(ctx); err != nil {
		c.member.Abort(err) // the caller's teardown closes the transports
		return err
	}
	if c.plan.algo == algo.AlgoAuto {
		// Auto selection uses only what every rank holds identically (world
		// size, config, the agreed link table), so all ranks pick the same
		// algorithm; it is fixed for the communicator's life until a counts
		// matrix is available.
		c.plan.algo = c.plan.chooser.Choose(c.choiceArgs(nil))
	}
	return nil
}

// Rank is this rank's index in the group.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks in the group.
func (c *Comm) Size() int { return c.size }

// Epoch is the membership epoch the group agreed on at join.
func (c *Comm) Epoch() uint32 { return c.member.Epoch() }

// LastAlgo names the algorithm the last collective ran.
func (c *Comm) LastAlgo() string {
	return algo.Algo(c.plan.lastAlgo.Load()).String()
}

// setLastAlgo records the algorithm of the collective that just ran.
func (c *Comm) setLastAlgo(a algo.Algo) {
	if algo.Algo(c.plan.lastAlgo.Load()) != a {
		c.plan.lastAlgo.Store(uint32(a))
	}
}

// Host is the host ordinal of rank (0 for rank 0's host, then in order of
// first appearance by rank): two ranks share a host, and may share memory,
// exactly when their ordinals are equal. Every rank sees the same ordinals.
func (c *Comm) Host(rank int) int { return c.topo.hosts[rank] }

// TransportName names the data planes in use, joined by "+" in order of
// preference: "shm" on one host, "shm+tcp" when the ranks of this host talk
// through shared memory and the others through TCP.
func (c *Comm) TransportName() string { return c.tr.Name() }

// PeerTransport names the data plane that links this rank with rank ("" for
// this rank itself).
func (c *Comm) PeerTransport(rank int) string {
	if rank < 0 || rank >= c.size || c.byPeer[rank] == nil {
		return ""
	}
	return c.byPeer[rank].Name()
}

// Config returns the configuration the communicator runs with, defaults
// filled in.
func (c *Comm) Config() Config { return c.cfg }

// WaitPolicy returns how long an idle operation busy-polls and then yields
// its core before parking: Config.Spin and Config.Yield as resolved at join
// (see waitPolicy for the defaults).
func (c *Comm) WaitPolicy() (spin, yield time.Duration) {
	w := c.eng.Waiting()
	return w.Spin, w.Yield
}

// Stats returns the data-plane transport's counters (bytes per peer, rejected connections).
func (c *Comm) Stats() transport.Stats { return c.tr.Stats() }

// Close leaves the group and releases every resource. Operations running
// concurrently, and every call after it, fail with ErrClosed (an abort's
// cause stays in Err); the peers' waits that need this rank fail
// with ErrPeerLost naming it, while the collectives it completed complete on
// every rank. Close is idempotent.
func (c *Comm) Close() error {
	if !c.life.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(c.life.closing)
	if c.tr != nil {
		c.tr.Wake()
	}
	c.stopReports()
	if c.queue != nil {
		c.queue.revoke() // a lease holds the call lock: after closed, so none is granted again
	}
	c.life.calls.Lock() // wait for the running calls to give up
	defer c.life.calls.Unlock()
	if c.queue != nil {
		c.queue.failAll(errClosedComm(c.rank))
	}
	err := c.teardown()
	c.life.watchWG.Wait()
	return err
}

func (c *Comm) teardown() error {
	if c.isChild() {
		return c.closeChild()
	}
	var first error
	if c.member != nil {
		// Peers still in a collective this rank completed finish it; the
		// next one fails on them with ErrPeerLost naming this rank.
		if err := c.member.LeaveAt(c.life.okSeq.Load() + 2); err != nil && first == nil {
			first = err
		}
	}
	if c.tr != nil {
		if err := c.tr.Close(); err != nil && first == nil {
			first = err
		}
	}
	if c.eng != nil {
		c.eng.Close() // after the transport: no send holds its scratch
	}
	if c.nc != nil {
		c.nc.Close()
	}
	return first
}

// begin starts the collective title (its API name, for errors) that
// started at start (see clock): it refuses a
// collective while another runs, takes the engine (finishing the
// point-to-point calls posted before, when engine is set), refuses a closed
// or aborted communicator, and returns the op's sequence number. Every
// successful begin is paired with end.
func (c *Comm) begin(ctx context.Context, title string, start time.Time, engine bool) (seq uint64, err error) {
	if seq, ok, err := c.beginLeased(ctx, title, start); ok {
		return seq, err
	}
	ends := c.queue.lease.ends.Load()
	turn, err := c.takeTurn(ctx)
	if err != nil {
		return 0, err
	}
	if turn == nil && !c.life.collBusy.CompareAndSwap(false, true) {
		// A persistent collective's lease (lease.go) may hold it.
		if again, err := c.queue.endLeaseFor(ctx, ends); err != nil {
			return 0, err
		} else if again {
			return c.begin(ctx, title, start, engine)
		}
		c.queue.mu.Lock()
		next := c.queue.seq + 2
		c.queue.mu.Unlock()
		return 0, c.failAt(next, fault.New(fault.ErrInvalidArgument, c.rank,
			"a collective was called while another one runs on this Comm: collectives must be issued one at a time, in the same order on every rank"))
	}
	c.life.calls.RLock()
	takeSeq := func() { c.queue.seq += 2; seq = c.queue.seq }
	if turn != nil {
		takeSeq = func() { seq = turn.seq } // numbered when started
	}
	var last uint64
	if engine {
		last, err = c.queue.acquireForCollective(ctx, takeSeq)
	} else {
		c.queue.mu.Lock()
		takeSeq()
		c.queue.mu.Unlock()
	}
	if turn != nil {
		last = turn.fence
	}
	if err == nil {
		c.queue.cur = seq
	}
	if err == nil {
		err = c.stoppedAt(seq)
	}
	if err == nil && ctx.Err() != nil {
		err = c.failAt(seq, fault.FromContext(ctx.Err()))
	}
	if err == nil && engine {
		if err = c.queue.drain(ctx, last); err != nil {
			err = c.failAt(seq, err)
		}
	}
	if err != nil {
		c.end(seq, engine, err)
		return 0, err
	}
	c.startOp(ctx, title, seq, start)
	return seq, nil
}

// end ends a collective begin started.
func (c *Comm) end(seq uint64, engine bool, err error) {
	if err == nil {
		c.life.okSeq.Store(seq)
	}
	if c.endLeased(seq, err) || engine && err == nil && c.grantLease(seq) {
		return
	}
	if engine {
		c.queue.release()
	}
	c.life.calls.RUnlock()
	c.life.collBusy.Store(false)
	c.queue.wakeSleepers() // a started collective waits for collBusy (takeTurn)
}

// clock is an operation's start time for its report: the zero Time when no
// Observer gets reports. A clock read costs 20-45 ns here, a tenth of a small
// AllToAll; the deadline needs none until the operation waits (engine).
func (c *Comm) clock() time.Time {
	if c.observer == nil {
		return time.Time{}
	}
	return time.Now()
}

// startOp readies the engine for the operation title (its API name, for
// errors) numbered seq that started at start, with ctx's deadline if it has
// one.
func (c *Comm) startOp(ctx context.Context, title string, seq uint64, start time.Time) {
	deadline, _ := ctx.Deadline()
	c.eng.StartOp(title, seq, start, deadline)
}
