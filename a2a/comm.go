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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/control"
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
	eng           *engine
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
	bufs        opBuffers
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

// localAbort is an abort of this rank from op sequence from on.
type localAbort struct {
	err  error
	from uint64
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
	c.eng = newEngine(c.tr, c.rank, c.size, cfg.Streams, m.Epoch(), w, c.hosts, cfg.Timeout, c.stopped)
	c.queue = newProgressQueue(c.eng)
	c.llCut, c.llQuiet = c.llCutoffs()
	c.llBarrier = c.llCut != nil && c.size <= llBarrierMaxRanks
	for r := range c.size {
		c.llBarrier = c.llBarrier && (r == c.rank || c.eng.slotBytes(r) > 0)
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

// evenHosts reports whether every host runs the same number of ranks.
func evenHosts(hosts []int, numHosts int) bool {
	per := make([]int, numHosts)
	for _, h := range hosts {
		per[h]++
	}
	for _, n := range per {
		if n != per[0] {
			return false
		}
	}
	return true
}

// llBarrierMaxRanks bounds the one-round LL barrier: p-1 stores and loads
// per rank are cheaper than log2(p) rounds of wake-ups while p is small
// (`a2ad bench --op barrier --transport shm`: 2 ranks 0.6-0.8 us against
// 0.87 us for dissemination, 4 ranks on 2 cores 4.6 us against 5.2 us).
const llBarrierMaxRanks = 64

// llAllReduceBytes bounds the one-round LL AllReduce (also by the LL
// cutoff). Its p-1 stores of 2n bytes and local reduction grow with n where
// recursive doubling's log2(p) exchanges barely do; they meet near 256 B
// (one host, in us, LL against recursive doubling: 2 ranks 8 B 0.57/0.83,
// 256 B 0.93/0.92, 512 B 1.17/0.98; 4 ranks on 2 cores 8 B 4.02/5.59,
// 256 B 5.20/6.00, 512 B 6.31/6.13).
const llAllReduceBytes = 256

// llCutoffs is the LL cutoff of every peer (algo.AllToAllVArgs.LLCutoff)
// and which peers are quiet (LLQuiet), from settings and link classes both
// ends of a pair share: blocks of up to LLBytes, capped by the slot size
// where the pair has a slot; a peer without one gets its LL messages as
// frames. Under auto selection peers are quiet: small blocks all go in the
// first round (one frame each to a peer without a slot, instead of waiting
// for their turn in fullmesh's windows), while larger blocks go by frames
// alone. An announcement would cost a network crossing, or on one host a
// round in which every rank waits for every peer's store (4 ranks on shm,
// 64 KiB: 78-81 us against 64-68 us without). A disagreement about a
// length still fails at once on the side that sees it: in a frame header,
// in a Load that finds a frame, or in the slot the receiver of frames
// watches (transport.SlotWatcher, which shm and verbs implement); a slot
// peer whose transport cannot watch keeps announcing. With A2A_ALGO=ll
// every peer announces. Nil when no pair uses LL.
func (c *Comm) llCutoffs() ([]int, []bool) {
	forced := c.algo == algo.AlgoLL
	if c.size < 2 || (!forced && (c.cfg.Algo != "" || c.cfg.LLBytes < 0)) {
		return nil, nil
	}
	limit := c.cfg.LLBytes
	if limit < 0 {
		limit = DefaultLLBytes
	}
	cut, quiet := make([]int, c.size), make([]bool, c.size)
	for r := range cut {
		cut[r] = -1
		if r == c.rank {
			continue
		}
		if slot := c.eng.slotBytes(r); slot > 0 {
			cut[r], quiet[r] = min(limit, slot), !forced && c.eng.watchOf[r] != nil
		} else {
			cut[r], quiet[r] = limit, !forced
		}
	}
	return cut, quiet
}

// hostOrdinals numbers the hosts in order of first appearance by rank.
func hostOrdinals(nodes []control.NodeInfo) ([]int, int) {
	ids := map[string]int{}
	out := make([]int, len(nodes))
	for r, n := range nodes {
		ord, ok := ids[n.Host]
		if !ok {
			ord = len(ids)
			ids[n.Host] = ord
		}
		out[r] = ord
	}
	return out, len(ids)
}

// HostIdentity names the machine this process runs on, as ranks report it at
// join to find their same-host peers: hostname, kernel boot id and network
// namespace, so two containers or namespaces on one box are two hosts (they
// cannot share loopback addresses) while ranks of one host agree.
// Config.Host (A2A_HOST) overrides it, e.g. to fake several hosts in tests.
func HostIdentity() string {
	name, _ := os.Hostname()
	netns, _ := os.Readlink("/proc/self/ns/net")
	return fmt.Sprintf("%s/%.8s/%s", name, MachineIdentity(), strings.TrimSuffix(strings.TrimPrefix(netns, "net:["), "]"))
}

// Waiting defaults (Config.Spin, Config.Yield).
const (
	defaultSpin = 50 * time.Microsecond // busy-poll before yielding the core
	// defaultYield is how long a rank gives its core away with sched_yield
	// before parking; parking costs a 30-70 us wake-up on these VMs (2
	// ranks, 8 B AllToAll: 52-62 us parking at once against 0.55 us). A
	// longer yield when ranks outnumber cores was tried: 4 ranks on 2
	// cores ran 4.9-6.9 us with 50 ms against 4.9-8.4 us with 1 ms, within
	// the noise, while a yielding goroutine keeps its P from the
	// application's goroutines (GOMAXPROCS is 1 for a rank bound to a
	// core), so the yield stays short.
	defaultYield = time.Millisecond
)

// waiting is how a rank waits (see waitPolicy).
type waiting struct {
	spin, yield time.Duration
	// sharedProcess: other ranks are goroutines of this process.
	sharedProcess bool
	// crowded: the group's ranks on this host outnumber the CPUs they may
	// run on, so ranks share cores.
	crowded bool
}

// waitPolicy resolves Config.Spin and Config.Yield for rank of the group
// nodes, grouped by machineCores into machines and their cores, on a host
// with hostCPUs CPUs online. By default a rank busy-polls,
// then yields, then parks. When the machine is crowded, its ranks of the
// group (of every host on it: network namespaces and containers share the
// kernel's cores) outnumbering the CPUs they may run on together, a
// spinning rank would hold the core the rank it waits for needs, so it
// does not spin (Open MPI's yield_when_idle makes the same call). The CPUs
// counted are the union of the machine's ranks' affinities (NodeInfo.CPUs),
// not this rank's own: ranks bound to a core each have a core of their own
// and spin, while ranks a launcher confined to fewer cores than there are
// ranks do not. Ranks that
// are goroutines of one process (tests, in-process groups) share the
// process's Ps instead of cores: sharedProcess reports them, so the engine
// also yields to goroutines.
func waitPolicy(spin, yield time.Duration, nodes []control.NodeInfo, machines, cores []int, rank, hostCPUs int) waiting {
	local, shared := 0, false
	for r, m := range machines {
		if m == machines[rank] {
			local++
			shared = shared || (r != rank && nodes[r].PID == nodes[rank].PID)
		}
	}
	jobCPUs := hostCPUs
	if known := cores[machines[rank]]; known > 0 {
		jobCPUs = min(known, hostCPUs)
	}
	crowded := local > jobCPUs
	switch {
	case spin < 0:
		spin = 0
	case spin == 0 && crowded:
	case spin == 0:
		spin = defaultSpin
	}
	if yield == 0 {
		yield = defaultYield
	}
	return waiting{spin: spin, yield: yield, sharedProcess: shared, crowded: crowded}
}

// watchControl wakes a parked operation when the control plane reports an
// abort or a departed peer, so it looks at once.
func (c *Comm) watchControl() {
	defer c.watchWG.Done()
	for {
		select {
		case <-c.member.Changed():
			c.tr.Wake()
		case <-c.closing:
			return
		}
	}
}

// stopped returns why the running collective must stop, or nil.
func (c *Comm) stopped() error { return c.stoppedAt(c.seq) }

// stoppedAt returns why an operation numbered seq (see Comm) must stop: an
// abort of this rank or of a peer whose scope covers it, a peer that left
// before taking part in it, or Close; nil otherwise. It looks at the control
// plane itself rather than waiting for watchControl, so an operation started
// right after a remote abort fails instead of consuming frames an aborted
// peer left behind.
func (c *Comm) stoppedAt(seq uint64) error {
	if p := c.local.Load(); p != nil && seq >= p.from {
		return p.err
	}
	if c.member != nil {
		if err := c.member.FailedAt(seq); err != nil {
			return err
		}
	}
	if c.closed.Load() {
		return errClosedComm(c.rank)
	}
	return nil
}

func errClosedComm(rank int) error { return fault.New(fault.ErrClosed, rank, "Close called") }

// stoppedFor is stoppedAt for a point-to-point request, which also stops
// when its peer left.
func (c *Comm) stoppedFor(r *Request) error {
	if err := c.stoppedAt(r.order); err != nil {
		return err
	}
	if c.member != nil {
		return c.member.Departed(r.peer)
	}
	return nil
}

// fail aborts the running collective because of err (see failAt).
func (c *Comm) fail(err error) error { return c.failAt(c.seq, err) }

// failAt aborts the communicator from op sequence from on because of err
// (this rank's failure), tells the other ranks, and returns the error the
// caller should see: err, or the earlier abort that already covers from.
func (c *Comm) failAt(from uint64, err error) error {
	if prev := c.stoppedAt(from); prev != nil {
		return prev // already stopped: the first cause is the story
	}
	for {
		p := c.local.Load()
		if p != nil && p.from <= from {
			return p.err
		}
		if c.local.CompareAndSwap(p, &localAbort{err: err, from: from}) {
			break
		}
	}
	c.log.Log(context.Background(), fault.LogLevel(err), "a2a: aborting communicator", "rank", c.rank, "from", from, "err", err)
	if c.member != nil {
		c.member.AbortAt(from, err)
	}
	if c.tr != nil {
		c.tr.Wake()
	}
	return err
}

// Abort aborts the communicator because of err, as a failing collective does:
// every rank's pending and future calls fail with ErrAborted wrapping err's
// kind, while the collectives this rank completed complete on every rank.
// Libraries built on a Comm (package dispatch) use it to release the other
// ranks when they reject a call locally. It returns the error callers of
// this rank will see.
func (c *Comm) Abort(err error) error {
	if err == nil {
		err = fault.New(fault.ErrAborted, c.rank, "Abort called")
	}
	return c.failAt(c.okSeq.Load()+1, err)
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

// Err returns the reason the communicator was aborted (or a peer left, or
// it was closed), or nil.
func (c *Comm) Err() error { return c.stoppedAt(^uint64(0)) }

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
func (c *Comm) WaitPolicy() (spin, yield time.Duration) { return c.eng.spin, c.eng.yield }

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
		err = c.failAt(seq, ctxError(ctx.Err()))
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
	c.eng.startOp(start, deadline)
}

func parseAlgo(name string) (algo.Algo, error) {
	a, err := algo.ParseAlgo(name)
	if err != nil {
		return a, fault.Wrap(fault.ErrInvalidArgument, -1, err, "A2A_ALGO")
	}
	switch a {
	case algo.AlgoAuto, algo.AlgoPairwise, algo.AlgoFullmesh, algo.AlgoStaged, algo.AlgoSkew, algo.AlgoLL:
		return a, nil
	}
	return a, fault.New(fault.ErrInvalidArgument, -1, "algorithm %q is not available for AllToAllV (auto, pairwise, fullmesh, staged, skew, ll)", name)
}
