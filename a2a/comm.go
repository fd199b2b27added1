// Package a2a is the Go client of the a2a all-to-all service: a communicator
// (Comm) that joins a group of ranks over a NATS control plane and runs
// collectives, foremost the variable-size AllToAllV of MoE dispatch and
// combine, over a data-plane transport (TCP; shared memory and RDMA verbs in
// later packages).
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
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/a2a/internal/engine"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/internal/cpus"
)

// Comm is one rank's communicator, safe for concurrent use.
//
// Collectives (AllToAllV, AllReduce, Barrier, ExchangeCounts, ...): every
// rank of the group calls the same ones in the same order, one at a time. A
// collective called while another runs on the same Comm (from another
// goroutine) is rejected with ErrInvalidArgument and aborts the
// communicator from that call on, since the ranks could not agree on the
// order of the two; the running one completes. Callers that issue
// collectives from several goroutines must order them themselves.
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
	observer Observer
	algo     algo.Algo
	// allReduceAlgo is forced by A2A_ALGO_ALLREDUCE, or auto.
	allReduceAlgo algo.Algo
	nc            *nats.Conn
	member        *control.Member
	tr            transport.Transport
	byPeer        []transport.Transport // the part of tr that reaches each rank
	eng           *engine.Engine
	rank          int
	size          int
	formerRanks   []int // set by Shrink: each rank's number before it

	// life is held shared by every call while it runs, and exclusively by
	// Close, which so waits for the running calls to give up.
	life sync.RWMutex
	// queue lets point-to-point calls and collectives share the engine
	// (requests.go); its lock also guards seq, sendSeq and recvSeq.
	queue *progressQueue
	// collBusy: a collective runs; it owns everything below up to sendSeq.
	collBusy atomic.Bool
	seq      uint64        // op sequence of the last collective begun (even)
	okSeq    atomic.Uint64 // op sequence of the last collective completed
	statMu   sync.Mutex    // guards the reporter's tally
	// lastAlgo is the algo.Algo of the last collective: atomic, and
	// written only when it changes, so a steady loop of calls costs a load.
	lastAlgo atomic.Uint32
	llCut    []int  // LL cutoff by peer, nil without LL
	llQuiet  []bool // peers whose larger blocks need no LL announcement
	// llBarrier: every peer has an LL slot, so Barrier is one LL round
	// instead of log2(p) dissemination rounds.
	llBarrier bool
	// llAllReduce: an AllReduce of at most this many bytes is one LL round
	// (where Barrier is); -1 when none is.
	llAllReduce int
	links       algo.Links    // the link table all ranks agreed on at join
	chooser     algo.Chooser  // the automatic AllToAllV choice
	sched       algo.Schedule // the plan of a call planCache does not keep
	plans       planCache
	bufs        engine.Buffers
	// scratch for AllToAll counts and the in-band counts exchange
	equalSend, equalRecv []int
	countsOut, countsIn  []byte
	matSend, matRecv     []int // AllToAllVMatrix's row and column
	// in-band matrix gathering for staged without a caller-supplied matrix
	matrix          []int
	rowsOut, rowsIn []byte
	rowCounts       []int
	// AllToAllVSpans' scratch (spans.go), made at its first call.
	spans *spanState
	// evenHosts: every host runs as many ranks as the others, which staged
	// needs; unevenOnce logs the fallback once.
	evenHosts  bool
	unevenOnce sync.Once

	sendSeq, recvSeq []uint64      // point-to-point sequence numbers by peer
	ringCheck        algo.Schedule // rooted collectives' agreement round
	allReducePlan    allReducePlan // the last AllReduce's plan (planner.go)
	hosts            []int         // host ordinal of every rank (same on all ranks)
	numHosts         int
	// machine ordinal of every rank and the CPUs of each machine (see
	// machineCores): where ranks outnumber cores the cost model bounds
	// every algorithm by the machine's total work.
	machines, machineCores []int

	rep *reporter // traffic reports for a2ad's live view (report.go); nil when off
	// local is this rank's own abort and its scope (the member holds the
	// peers' and the departures); nil while healthy.
	local   atomic.Pointer[localAbort]
	closed  atomic.Bool
	closing chan struct{} // closed by Close: stops watchControl and control-plane waits
	watchWG sync.WaitGroup
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
	c := &Comm{cfg: cfg, log: cfg.Logger, algo: a, allReduceAlgo: ar, closing: make(chan struct{})}
	if err := c.join(ctx); err != nil {
		c.teardown()
		return nil, err
	}
	c.observer = cfg.Observer
	c.watchWG.Add(1)
	go c.watchControl()
	c.startReports()
	c.log.Debug("a2a: joined", "group", cfg.Group, "rank", c.rank, "size", c.size, "epoch", c.member.Epoch())
	return c, nil
}

func (c *Comm) join(ctx context.Context) error {
	cfg := c.cfg
	auth, err := cfg.NATSOptions()
	if err != nil {
		return err
	}
	nc, err := nats.Connect(cfg.NATSURL, append(auth, nats.Name(fmt.Sprintf("a2a %s rank %d pid %d", cfg.Group, cfg.Rank, os.Getpid())),
		nats.Timeout(5*time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))...)
	if err != nil {
		return connectError(cfg, err)
	}
	c.nc = nc
	secret := cfg.Secret
	if secret == "" {
		// Without a configured secret the hello still keeps out strangers
		// that do not know the group name; A2A_SECRET makes it a real key.
		secret = "a2a-group:" + cfg.Group
	}
	host := cfg.Host
	if host == "" {
		host = HostIdentity()
	}
	dp, err := listen(ctx, cfg, transport.Self{Group: cfg.Group, Rank: cfg.Rank, Size: cfg.WorldSize, Host: host,
		Streams: cfg.Streams, Secret: []byte(secret), Logger: c.log})
	if err != nil {
		return err
	}
	defer dp.close()
	m, err := control.Join(ctx, nc, control.JoinConfig{
		Group: cfg.Group, Rank: cfg.Rank, WorldSize: cfg.WorldSize,
		Info: control.NodeInfo{Rank: cfg.Rank, Host: host, PID: os.Getpid(), Transports: dp.addresses(), Streams: cfg.Streams,
			CPUs: cpus.Format(cpus.Allowed()), Machine: MachineIdentity()},
		HeartbeatInterval: cfg.HeartbeatInterval, PeerTimeout: cfg.PeerTimeout, Logger: c.log,
		Secret: []byte(secret),
	})
	if err != nil {
		return err
	}
	c.member = m
	c.rank, c.size = m.Rank(), m.Size()
	c.hosts, c.numHosts = hostOrdinals(m.Nodes())
	c.machines, c.machineCores = machineCores(m.Nodes())
	// A rank that fails to connect aborts the group, so its peers stop
	// waiting for it instead of running into their deadline.
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-m.Done():
			cancel()
		case <-cctx.Done():
		}
	}()
	choice, err := dp.choose(c.rank, m.Nodes())
	if err == nil {
		c.tr, c.byPeer, err = dp.connect(cctx, c.rank, m.Epoch(), m.Nodes(), choice)
	}
	cancel()
	if err != nil {
		if merr := m.Err(); merr != nil {
			err = merr
		}
		m.Abort(err)
		return err
	}
	w := waitPolicy(cfg.Spin, cfg.Yield, m.Nodes(), c.machines, c.machineCores, c.rank, cpus.Online())
	c.eng = engine.New(engine.Options{
		Transport: c.tr, Rank: c.rank, Size: c.size, Streams: cfg.Streams, Epoch: m.Epoch(),
		Waiting: w, Hosts: c.hosts, Timeout: cfg.Timeout, Stopped: c.stopped,
	})
	c.queue = newProgressQueue(c.eng, c.size)
	c.llCut, c.llQuiet = c.llCutoffs()
	c.llBarrier = c.llCut != nil && c.size <= llBarrierMaxRanks
	for r := range c.size {
		c.llBarrier = c.llBarrier && (r == c.rank || c.eng.SlotBytes(r) > 0)
	}
	c.llAllReduce = -1
	if c.llBarrier {
		c.llAllReduce = llAllReduceBytes
		for r, cut := range c.llCut {
			if r != c.rank {
				// A collective's LL message ends with its 8-byte signature.
				c.llAllReduce = min(c.llAllReduce, cut-8)
			}
		}
	}
	c.equalSend = make([]int, c.size)
	c.equalRecv = make([]int, c.size)
	c.countsOut = make([]byte, 8*c.size)
	c.countsIn = make([]byte, 8*c.size)
	c.matSend, c.matRecv = make([]int, c.size), make([]int, c.size)
	c.sendSeq, c.recvSeq = make([]uint64, c.size), make([]uint64, c.size)
	c.ringCheck.Reset(algo.AlgoRing)
	if c.size > 1 {
		c.ringCheck.Add(algo.Step{Kind: algo.StepSend, Peer: (c.rank + 1) % c.size, Last: true})
		c.ringCheck.Add(algo.Step{Kind: algo.StepRecv, Peer: (c.rank - 1 + c.size) % c.size, Last: true})
		c.ringCheck.EndRound()
	}
	if err := c.agreeLinks(ctx); err != nil {
		m.Abort(err) // the caller's teardown closes the transports
		return err
	}
	if c.algo == algo.AlgoAuto {
		// Auto selection uses only what every rank holds identically (world
		// size, config, the agreed link table), so all ranks pick the same
		// algorithm; it is fixed for the communicator's life until a counts
		// matrix is available.
		c.algo = c.chooser.Choose(c.choiceArgs(nil))
	}
	c.evenHosts = evenHosts(c.hosts, c.numHosts)
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
	return algo.Algo(c.lastAlgo.Load()).String()
}

// setLastAlgo records the algorithm of the collective that just ran.
func (c *Comm) setLastAlgo(a algo.Algo) {
	if algo.Algo(c.lastAlgo.Load()) != a {
		c.lastAlgo.Store(uint32(a))
	}
}

// Host is the host ordinal of rank (0 for rank 0's host, then in order of
// first appearance by rank): two ranks share a host, and may share memory,
// exactly when their ordinals are equal. Every rank sees the same ordinals.
func (c *Comm) Host(rank int) int { return c.hosts[rank] }

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
// concurrently fail with ErrClosed; the peers' waits that need this rank fail
// with ErrPeerLost naming it, while the collectives it completed complete on
// every rank. Close is idempotent.
func (c *Comm) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(c.closing)
	if c.tr != nil {
		c.tr.Wake()
	}
	c.stopReports()
	c.life.Lock() // wait for the running calls to give up
	defer c.life.Unlock()
	if c.queue != nil {
		c.queue.failAll(errClosedComm(c.rank))
	}
	err := c.teardown()
	c.watchWG.Wait()
	return err
}

func (c *Comm) teardown() error {
	var first error
	if c.member != nil {
		// Peers still in a collective this rank completed finish it; the
		// next one fails on them with ErrPeerLost naming this rank.
		if err := c.member.LeaveAt(c.okSeq.Load() + 2); err != nil && first == nil {
			first = err
		}
	}
	if c.tr != nil {
		if err := c.tr.Close(); err != nil && first == nil {
			first = err
		}
	}
	if c.nc != nil {
		c.nc.Close()
	}
	return first
}

// begin starts a collective that started at start (see clock): it refuses a
// collective while another runs, takes the engine (finishing the
// point-to-point calls posted before, when engine is set), refuses a closed
// or aborted communicator, and returns the op's sequence number. Every
// successful begin is paired with end.
func (c *Comm) begin(ctx context.Context, start time.Time, engine bool) (seq uint64, err error) {
	if !c.collBusy.CompareAndSwap(false, true) {
		c.queue.mu.Lock()
		next := c.seq + 2
		c.queue.mu.Unlock()
		return 0, c.failAt(next, fault.New(fault.ErrInvalidArgument, c.rank,
			"a collective was called while another one runs on this Comm: collectives must be issued one at a time, in the same order on every rank"))
	}
	c.life.RLock()
	takeSeq := func() { c.seq += 2; seq = c.seq }
	var last uint64
	if engine {
		last, err = c.queue.acquireForCollective(ctx, takeSeq)
	} else {
		c.queue.mu.Lock()
		takeSeq()
		c.queue.mu.Unlock()
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
	c.startOp(ctx, start)
	return seq, nil
}

// end ends a collective begin started.
func (c *Comm) end(seq uint64, engine bool, err error) {
	if err == nil {
		c.okSeq.Store(seq)
	}
	if engine {
		c.queue.release()
	}
	c.life.RUnlock()
	c.collBusy.Store(false)
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

// startOp readies the engine for an operation (collective or point to
// point) that started at start, with ctx's deadline if it has one.
func (c *Comm) startOp(ctx context.Context, start time.Time) {
	deadline, _ := ctx.Deadline()
	c.eng.StartOp(start, deadline)
}
