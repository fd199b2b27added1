package a2a

import (
	"context"
	"time"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/internal/engine"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// Persistent is a collective planned once and run many times (MPI-4's
// persistent collectives): AllToAllVInit or AllReduceInit plan it, each use
// is a Start and a Wait, and Close ends it. Its counts and buffers are
// fixed at Init; the send buffer's contents may change between uses. A
// Start numbers the collective and queues it, as a nonblocking collective
// is started (see IAllToAllV), and allocates nothing; the exchange runs on
// the first goroutine that needs it, usually Wait's, so a Start-Wait pair
// costs what the blocking call costs minus its planning. A Wait that finds
// its use the only collective started, with no point-to-point request in
// flight, runs it with less turn-taking than a queued run (a direct turn),
// in the same order with every other call; when such a use ends with
// nothing else on the Comm, the Persistent keeps the turn for its next use
// (a lease) until another call needs it. Every rank uses
// the same persistent collective at the same point of its call order. A
// Persistent is used by one goroutine at a time.
type Persistent struct {
	c    *Comm
	name string
	kind transport.OpKind
	aux  uint64 // the frames' signature (a collective's; 0 for AllToAllV)
	algo algo.Algo
	op   collOp
	// segs are the runs of one use: one, or a large AllReduce's segments;
	// each runs one of scheds over its part of the buffers.
	segs       []persistSeg
	scheds     [2]algo.Schedule
	send, recv []byte
	bufs       engine.Buffers
	// sendCounts and recvCounts are the AllToAllV's, for reports.
	sendCounts, recvCounts []int
	avg                    DType // an Avg AllReduce's element type, to divide at the end
	isAvg                  bool
	started, closed        bool
	// direct counts the uses that ran in a direct turn (persistent_direct.go),
	// leased those of them under a lease (lease.go): written by the one
	// goroutine that uses the Persistent.
	direct, leased uint64
	// leaseFence is the last ticket posted when p's lease was granted: the
	// fence of each use it numbers.
	leaseFence uint64
	// pend is the uses counted for the reports since the last flush to the
	// Comm's tally (tallyUse); nil when the Comm reports nothing.
	pend *pendingUses
	// ll is the one LL round of an all-LL AllToAllV or a one-round LL
	// AllReduce resolved over the buffers (engine.PlanLL), nil when Run runs
	// the schedule.
	ll *engine.LLPlan
}

// persistSeg is one run of a use: the schedule and the byte range of the
// buffers it covers.
type persistSeg struct {
	sched  *algo.Schedule
	lo, hi int
}

// AllToAllVInit plans AllToAllV(ctx, send, sendCounts, recv, recvCounts)
// once, for many Starts: the algorithm, the schedule and the split between
// LL slots and frames are fixed here. Counts and buffers must not change
// while the Persistent lives (the counts are copied); send's contents may.
// Staged and skew, which gather the traffic matrix at every call, plan as
// fullmesh here. Init talks to no rank: an argument error is returned and
// aborts nothing, and a rank whose Init failed must not Start.
func (c *Comm) AllToAllVInit(send []byte, sendCounts []int, recv []byte, recvCounts []int) (*Persistent, error) {
	if err := c.checkExchange(sendCounts, len(send), recvCounts, len(recv)); err != nil {
		return nil, err
	}
	p := c.newPersistent("alltoallv", transport.OpAllToAllV, send, recv)
	p.sendCounts, p.recvCounts = append([]int(nil), sendCounts...), append([]int(nil), recvCounts...)
	a := c.pickAllToAllV(transport.OpAllToAllV, nil)
	if a == algo.AlgoStaged || a == algo.AlgoSkew {
		a = algo.AlgoFullmesh
	}
	allLL, err := c.planFlatInto(&p.scheds[0], a, p.sendCounts, p.recvCounts, true)
	if err != nil {
		return nil, err
	}
	if p.algo = a; allLL {
		p.algo = algo.AlgoLL
	}
	p.segs = []persistSeg{{sched: &p.scheds[0]}} // the whole buffers
	if allLL {
		p.bufs[algo.BufSend], p.bufs[algo.BufRecv] = send, recv
		p.ll = c.eng.PlanLL(p.kind, 0, &p.scheds[0], &p.bufs)
	}
	return p, nil
}

// AllReduceInit plans AllReduce(ctx, send, recv, dt, op) once, for many
// Starts; see AllToAllVInit.
func (c *Comm) AllReduceInit(send, recv []byte, dt DType, op Op) (*Persistent, error) {
	k := &coll{name: "allreduce", kind: transport.OpAllReduce, send: send, recv: recv, dt: dt, op: op, reduction: true, bytes: len(send)}
	if err := c.checkReduction(k, len(send)); err != nil {
		return nil, err
	}
	if len(recv) != len(send) {
		return nil, lenErr(c, k.name, "recv", len(recv), len(send))
	}
	p := c.newPersistent(k.name, k.kind, send, recv)
	p.aux, p.avg, p.isAvg = k.signature(), dt, op == Avg
	if op == Avg {
		op = Sum // divided once at the end, as AllReduce does
	}
	args := algo.CollArgs{Rank: c.rank, World: c.size, Bytes: len(send), ElemSize: dt.Size(), DType: uint8(dt), Op: uint8(op),
		Streams: c.cfg.Streams, Hosts: c.topo.hosts, BlockSize: collBlock,
		InPlace: len(send) > 0 && len(recv) > 0 && &send[0] == &recv[0]}
	seg := len(send)
	if len(send) > allReduceSegment {
		k.segmented = true
		seg = allReduceSegment - allReduceSegment%dt.Size()
	}
	for lo := 0; lo < len(send) || lo == 0; lo += seg {
		hi := min(lo+seg, len(send))
		s := &p.scheds[0]
		if lo > 0 && hi-lo != seg {
			s = &p.scheds[1] // the short last segment
		}
		if lo == 0 || s == &p.scheds[1] {
			args.Bytes = hi - lo
			var err error
			if p.algo, err = c.planInto(s, k, &args); err != nil {
				return nil, fault.Wrap(fault.ErrInvalidArgument, c.rank, err, "planning %s", k.name)
			}
		}
		p.segs = append(p.segs, persistSeg{sched: s, lo: lo, hi: hi})
		if hi == len(send) {
			break
		}
	}
	if p.algo == algo.AlgoLL && len(p.segs) == 1 {
		p.bufs[algo.BufSend], p.bufs[algo.BufRecv] = send, recv
		p.ll = c.eng.PlanLL(p.kind, p.aux, &p.scheds[0], &p.bufs)
	}
	return p, nil
}

func (c *Comm) newPersistent(name string, kind transport.OpKind, send, recv []byte) *Persistent {
	p := &Persistent{c: c, name: name, kind: kind, send: send, recv: recv}
	p.op.run = p.run // made once: a method value allocates
	p.op.tctx.op = &p.op
	if c.rep != nil {
		p.pend = &pendingUses{t: newTally(c.size)}
	}
	return p
}

// Start starts one use: it numbers the collective and queues it, planning
// nothing and allocating nothing. ctx bounds the run. Start fails with
// ErrInvalidArgument when the previous use was not waited for, or after
// Close.
func (p *Persistent) Start(ctx context.Context) error {
	switch {
	case p.closed:
		return fault.New(fault.ErrInvalidArgument, p.c.rank, "persistent %s: Start after Close", p.name)
	case p.started:
		return fault.New(fault.ErrInvalidArgument, p.c.rank, "persistent %s: Start before the last use's Wait", p.name)
	}
	p.started = true
	if p.startLeased(ctx) {
		return nil
	}
	p.op.tctx.Context = ctx
	p.c.queue.startColl(&p.op)
	return nil
}

// Wait waits for the use Start started, running it (and the collectives
// started before it) on this goroutine unless another runs them, and
// returns its error. A use Wait runs is bounded by the context given to
// Start; if ctx ends while Wait waits for another goroutine, Wait returns
// ErrTimeout (or ErrAborted for a cancel) and the use stays started: Wait
// may be called again. Without a started use Wait returns nil.
func (p *Persistent) Wait(ctx context.Context) error {
	if !p.started {
		return nil
	}
	if !p.waitLeased() && !p.runDirect() {
		if err := p.c.runColls(ctx, &p.op); err != nil {
			return err
		}
	}
	p.started = false
	return p.op.err
}

// Close ends the Persistent. A started use must be waited for first:
// Close fails with ErrInvalidArgument otherwise. Close is idempotent.
func (p *Persistent) Close() error {
	if p.started {
		return fault.New(fault.ErrInvalidArgument, p.c.rank, "persistent %s: Close before the last use's Wait", p.name)
	}
	p.closed = true
	if q := p.c.queue; q.lease.word.Load() != leaseNone {
		q.mu.Lock()
		if q.lease.op.Load() == &p.op {
			q.revokeLocked()
		}
		q.mu.Unlock()
	}
	p.flushTally()
	p.segs, p.scheds, p.ll = nil, [2]algo.Schedule{}, nil
	return nil
}

// title names the persistent call in errors, as the blocking call's name.
func (p *Persistent) title() string {
	if p.kind == transport.OpAllReduce {
		return "AllReduce (persistent)"
	}
	return "AllToAllV (persistent)"
}

// run runs one use in its turn (ctx carries it): the blocking call's steps
// without the validation and the planning Init did.
func (p *Persistent) run(ctx context.Context) error {
	c := p.c
	start := c.clock()
	seq, err := c.begin(ctx, p.title(), start, true)
	if err != nil {
		c.observeRejected(p.name, start, err)
		return err
	}
	err = p.exchange(ctx, seq, start)
	c.end(seq, true, err)
	return err
}

// exchange runs the use numbered seq once begin (or a direct turn) holds
// the engine, and reports it; the caller ends it.
func (p *Persistent) exchange(ctx context.Context, seq uint64, start time.Time) error {
	c := p.c
	var err error
	if p.ll != nil {
		if err = c.eng.RunLL(ctx, p.ll); err == nil {
			c.eng.NextLLEpoch()
		}
		return p.ended(seq, start, err)
	}
	for _, s := range p.segs {
		p.bufs[algo.BufSend], p.bufs[algo.BufRecv] = p.send, p.recv
		if len(p.segs) > 1 {
			p.bufs[algo.BufSend], p.bufs[algo.BufRecv] = p.send[s.lo:s.hi], p.recv[s.lo:s.hi]
		}
		if err = c.eng.Run(ctx, p.kind, seq, p.aux, s.sched, &p.bufs); err != nil {
			break
		}
		if p.kind == transport.OpAllToAllV || p.algo == algo.AlgoLL {
			c.eng.NextLLEpoch() // as alltoallv and ranCollective do
		}
	}
	return p.ended(seq, start, err)
}

// ended finishes a use's exchange: Avg's division, the algorithm, the
// failure's scope and the reports.
func (p *Persistent) ended(seq uint64, start time.Time, err error) error {
	c := p.c
	if err == nil && p.isAvg {
		if err = reduce.Finish(p.avg, reduce.Avg, p.recv, c.size); err != nil {
			err = fault.Wrap(fault.ErrInvalidArgument, c.rank, err, "%s", p.name)
		}
	}
	c.setLastAlgo(p.algo)
	if err != nil {
		err = c.failAt(seq, err)
	}
	c.observe(p.name, p.algo, seq, p.sendCounts, p.recvCounts, start, err)
	p.tallyUse(err)
	return err
}
