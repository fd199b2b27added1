package a2a

import (
	"context"
	"time"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/a2a/transport"
)

func (c *Comm) checkRoot(root int) error {
	if root < 0 || root >= c.size {
		return fault.New(fault.ErrInvalidArgument, c.rank, "root %d outside [0,%d)", root, c.size)
	}
	return nil
}

func (c *Comm) checkReduction(k *coll, n int) error {
	if !k.dt.Valid() {
		return fault.New(fault.ErrInvalidArgument, c.rank, "%s: invalid dtype %d", k.name, k.dt)
	}
	if !k.op.Valid() {
		return fault.New(fault.ErrInvalidArgument, c.rank, "%s: invalid op %d", k.name, k.op)
	}
	if n%k.dt.Size() != 0 {
		return fault.New(fault.ErrInvalidArgument, c.rank, "%s: %d bytes is not a whole number of %s elements", k.name, n, k.dt)
	}
	return nil
}

func lenErr(c *Comm, name, what string, got, want int) error {
	return fault.New(fault.ErrInvalidArgument, c.rank, "%s: len(%s)=%d, want %d", name, what, got, want)
}

// AllReduce reduces send elementwise across all ranks with op and leaves the
// result in recv on every rank (len(recv) == len(send); send and recv may be
// the same slice). Every rank gets bit-identical results.
func (c *Comm) AllReduce(ctx context.Context, send, recv []byte, dt DType, op Op) error {
	k := &coll{name: "allreduce", title: "AllReduce", kind: transport.OpAllReduce, send: send, recv: recv, dt: dt, op: op, reduction: true, bytes: len(send)}
	return c.collective(ctx, k, func() error {
		if err := c.checkReduction(k, len(send)); err != nil {
			return err
		}
		if len(recv) != len(send) {
			return lenErr(c, k.name, "recv", len(recv), len(send))
		}
		return nil
	})
}

// ReduceScatter reduces send (Size blocks of len(recv) bytes) across ranks
// and leaves block r of the result in rank r's recv.
func (c *Comm) ReduceScatter(ctx context.Context, send, recv []byte, dt DType, op Op) error {
	k := &coll{name: "reducescatter", title: "ReduceScatter", kind: transport.OpReduceScatter, send: send, recv: recv, dt: dt, op: op, reduction: true, bytes: len(recv)}
	return c.collective(ctx, k, func() error {
		if err := c.checkReduction(k, len(recv)); err != nil {
			return err
		}
		if len(send) != len(recv)*c.size {
			return lenErr(c, k.name, "send", len(send), len(recv)*c.size)
		}
		return nil
	})
}

// AllGather concatenates every rank's send (equal lengths) into recv in rank
// order on every rank (len(recv) == Size*len(send)).
func (c *Comm) AllGather(ctx context.Context, send, recv []byte) error {
	k := &coll{name: "allgather", title: "AllGather", kind: transport.OpAllGather, send: send, recv: recv, dt: Uint8, bytes: len(send)}
	return c.collective(ctx, k, func() error {
		if len(recv) != len(send)*c.size {
			return lenErr(c, k.name, "recv", len(recv), len(send)*c.size)
		}
		return nil
	})
}

// AllGatherV concatenates every rank's send into recv, rank i's block being
// recvCounts[i] bytes at the prefix-sum offset (recvCounts[Rank] == len(send)).
func (c *Comm) AllGatherV(ctx context.Context, send, recv []byte, recvCounts []int) error {
	k := &coll{name: "allgatherv", title: "AllGatherV", kind: transport.OpAllGather, send: send, recv: recv, counts: recvCounts, dt: Uint8}
	return c.collective(ctx, k, func() error {
		if err := c.checkCounts("recv", recvCounts, len(recv)); err != nil {
			return err
		}
		if recvCounts[c.rank] != len(send) {
			return fault.New(fault.ErrInvalidArgument, c.rank, "allgatherv: recvCounts[%d]=%d but len(send)=%d", c.rank, recvCounts[c.rank], len(send))
		}
		return nil
	})
}

// Broadcast copies root's buf into buf on every rank (equal lengths).
func (c *Comm) Broadcast(ctx context.Context, buf []byte, root int) error {
	k := &coll{name: "broadcast", title: "Broadcast", rooted: true, kind: transport.OpBroadcast, recv: buf, root: root, dt: Uint8, bytes: len(buf)}
	return c.collective(ctx, k, func() error { return c.checkRoot(root) })
}

// Reduce reduces send across ranks into root's recv (len(recv) == len(send)
// at the root; other ranks' recv is not used and may be nil).
func (c *Comm) Reduce(ctx context.Context, send, recv []byte, dt DType, op Op, root int) error {
	k := &coll{name: "reduce", title: "Reduce", rooted: true, kind: transport.OpReduce, send: send, recv: recv, dt: dt, op: op, root: root, reduction: true, bytes: len(send)}
	return c.collective(ctx, k, func() error {
		if err := c.checkRoot(root); err != nil {
			return err
		}
		if err := c.checkReduction(k, len(send)); err != nil {
			return err
		}
		if c.rank == root && len(recv) != len(send) {
			return lenErr(c, k.name, "recv", len(recv), len(send))
		}
		if c.rank != root {
			k.recv = nil
		}
		return nil
	})
}

// Gather concatenates every rank's send (equal lengths) into root's recv in
// rank order (len(recv) == Size*len(send) at the root).
func (c *Comm) Gather(ctx context.Context, send, recv []byte, root int) error {
	k := &coll{name: "gather", title: "Gather", rooted: true, kind: transport.OpGather, send: send, recv: recv, root: root, dt: Uint8, bytes: len(send)}
	return c.collective(ctx, k, func() error {
		if err := c.checkRoot(root); err != nil {
			return err
		}
		if c.rank == root && len(recv) != len(send)*c.size {
			return lenErr(c, k.name, "recv", len(recv), len(send)*c.size)
		}
		if c.rank != root {
			k.recv = nil
		}
		return nil
	})
}

// GatherV concatenates every rank's send into root's recv, rank i's block
// being recvCounts[i] bytes at the prefix-sum offset. recvCounts is read at the
// root only.
func (c *Comm) GatherV(ctx context.Context, send, recv []byte, recvCounts []int, root int) error {
	k := &coll{name: "gatherv", title: "GatherV", rooted: true, kind: transport.OpGather, send: send, recv: recv, counts: recvCounts, root: root, dt: Uint8}
	return c.collective(ctx, k, func() error {
		if err := c.checkRoot(root); err != nil {
			return err
		}
		if c.rank != root {
			k.recv, k.counts = nil, c.vCounts(len(send))
			return nil
		}
		if err := c.checkCounts("recv", recvCounts, len(recv)); err != nil {
			return err
		}
		if recvCounts[root] != len(send) {
			return fault.New(fault.ErrInvalidArgument, c.rank, "gatherv: recvCounts[root]=%d but len(send)=%d", recvCounts[root], len(send))
		}
		return nil
	})
}

// Scatter sends block i of root's send (Size blocks of len(recv) bytes) to
// rank i's recv.
func (c *Comm) Scatter(ctx context.Context, send, recv []byte, root int) error {
	k := &coll{name: "scatter", title: "Scatter", rooted: true, kind: transport.OpScatter, send: send, recv: recv, root: root, dt: Uint8, bytes: len(recv)}
	return c.collective(ctx, k, func() error {
		if err := c.checkRoot(root); err != nil {
			return err
		}
		if c.rank == root && len(send) != len(recv)*c.size {
			return lenErr(c, k.name, "send", len(send), len(recv)*c.size)
		}
		if c.rank != root {
			k.send = nil
		}
		return nil
	})
}

// ScatterV sends root's send[displ(i):displ(i)+sendCounts[i]] to rank i's recv
// (displacements are prefix sums). sendCounts is read at the root only; every
// rank's len(recv) is what it receives.
func (c *Comm) ScatterV(ctx context.Context, send []byte, sendCounts []int, recv []byte, root int) error {
	k := &coll{name: "scatterv", title: "ScatterV", rooted: true, kind: transport.OpScatter, send: send, recv: recv, counts: sendCounts, root: root, dt: Uint8}
	return c.collective(ctx, k, func() error {
		if err := c.checkRoot(root); err != nil {
			return err
		}
		if c.rank != root {
			k.send, k.counts = nil, c.vCounts(len(recv))
			return nil
		}
		if err := c.checkCounts("send", sendCounts, len(send)); err != nil {
			return err
		}
		if sendCounts[root] != len(recv) {
			return fault.New(fault.ErrInvalidArgument, c.rank, "scatterv: sendCounts[root]=%d but len(recv)=%d", sendCounts[root], len(recv))
		}
		return nil
	})
}

// Barrier returns once every rank has entered it.
func (c *Comm) Barrier(ctx context.Context) error {
	k := &coll{name: "barrier", title: "Barrier", kind: transport.OpBarrier, dt: Uint8}
	return c.collective(ctx, k, func() error { return nil })
}

// vCounts gives a non-root rank of a V collective the counts vector its
// planner needs: only its own entry is known (n), the others are unused.
func (c *Comm) vCounts(n int) []int {
	clear(c.scratch.equalSend)
	c.scratch.equalSend[c.rank] = n
	return c.scratch.equalSend
}

// collective runs one collective: validation (a failure aborts the group so
// no rank waits for this one), planning, execution, Avg's division, report.
func (c *Comm) collective(ctx context.Context, k *coll, validate func() error) error {
	start := c.clock()
	seq, err := c.begin(ctx, k.title, start, true)
	if err != nil {
		c.observeRejected(k.name, start, err)
		return err
	}
	var a algo.Algo
	if err = validate(); err == nil {
		a, err = c.runCollective(ctx, k, seq)
		c.setLastAlgo(a)
	}
	if err != nil {
		err = c.failAt(seq, err) // not fail: later calls may be numbered already (icoll.go)
	}
	if o := c.observer; o != nil { // under the lock: the engine's figures are this call's
		ev := OpEvent{Op: k.name, Algo: a.String(), Rank: c.rank, Size: c.size, Seq: seq, Duration: time.Since(start), Err: err}
		ev.LastPeer, ev.LastWait = c.eng.LastArrival()
		ev.setTraffic(c.eng.Traffic())
		o.OpDone(ev)
	}
	c.tallyOp(k.name, a, err)
	c.end(seq, true, err)
	return err
}

func (c *Comm) runCollective(ctx context.Context, k *coll, seq uint64) (algo.Algo, error) {
	op := k.op
	if op == Avg {
		op = Sum // divided once at the end
	}
	args := algo.CollArgs{Rank: c.rank, World: c.size, Bytes: k.bytes, Counts: k.counts, ElemSize: k.dt.Size(),
		DType: uint8(k.dt), Op: uint8(op), Root: k.root, Streams: c.cfg.Streams, Hosts: c.topo.hosts, BlockSize: collBlock,
		InPlace: len(k.send) > 0 && len(k.recv) > 0 && &k.send[0] == &k.recv[0]}
	if k.name == "allreduce" && k.bytes > allReduceSegment {
		return c.segmentedAllReduce(ctx, k, &args, seq)
	}
	a, sched, err := c.planCollective(k, &args)
	if err != nil {
		return a, fault.Wrap(fault.ErrInvalidArgument, c.rank, err, "planning %s", k.name)
	}
	if k.rooted && c.size > 1 {
		// In a rooted collective a rank that believes it is the root may
		// never receive anything, so a disagreement on the root could go
		// unseen. One ring round of empty frames carrying the signature
		// compares every rank with its neighbour: if any two ranks differ,
		// some neighbours differ, and the receiver reports ErrMismatch.
		if err := c.eng.Run(ctx, k.kind, seq, k.signature(), &c.plan.ringCheck, &c.scratch.bufs); err != nil {
			return a, err
		}
	}
	if round := c.allReduceRound(k, a, sched); round != nil {
		err = c.runLLRound(ctx, round) // blockll.go
	} else {
		c.scratch.bufs[algo.BufSend], c.scratch.bufs[algo.BufRecv] = k.send, k.recv
		err = c.eng.Run(ctx, k.kind, seq, k.signature(), sched, &c.scratch.bufs)
		c.scratch.bufs[algo.BufSend], c.scratch.bufs[algo.BufRecv] = nil, nil
		c.ranCollective(a)
	}
	if err == nil && k.op == Avg && len(k.recv) > 0 {
		if err = reduce.Finish(k.dt, reduce.Avg, k.recv, c.size); err != nil {
			err = fault.Wrap(fault.ErrInvalidArgument, c.rank, err, "%s", k.name)
		}
	}
	return a, err
}

// ranCollective follows every run of a collective schedule of algorithm a.
// An LL one (Barrier, a small AllReduce) is all-to-all shaped, every pair
// exchanged a message, so it may advance the LL epoch like an AllToAllV;
// the next LL run must, or it would find this run's messages in the slots.
func (c *Comm) ranCollective(a algo.Algo) {
	if a == algo.AlgoLL {
		c.eng.NextLLEpoch()
	}
}

// allReduceSegment: a larger AllReduce runs as consecutive AllReduces of
// segments of this size (every rank cuts the same way). On these machines a
// single TCP message above ~1 MiB falls off a cache cliff (an AllToAllV with
// 2 MiB per peer takes ~3.5x the 1 MiB time, for Open MPI too), and segments
// keep every message and the buffers a round touches small.
const allReduceSegment = 512 << 10

// segmentedAllReduce runs k as consecutive AllReduces of allReduceSegment
// bytes; every frame still carries the whole call's signature.
func (c *Comm) segmentedAllReduce(ctx context.Context, k *coll, args *algo.CollArgs, seq uint64) (algo.Algo, error) {
	seg := allReduceSegment - allReduceSegment%k.dt.Size()
	k.segmented = true
	var a algo.Algo
	var sched *algo.Schedule
	for lo := 0; lo < k.bytes; lo += seg {
		hi := min(lo+seg, k.bytes)
		var err error
		// A plan addresses its segment through the buffers, so every
		// segment of one size runs the same plan: at most two plans.
		if sched == nil || args.Bytes != hi-lo {
			args.Bytes = hi - lo
			if a, sched, err = c.planCollective(k, args); err != nil {
				return a, fault.Wrap(fault.ErrInvalidArgument, c.rank, err, "planning %s", k.name)
			}
		}
		c.scratch.bufs[algo.BufSend], c.scratch.bufs[algo.BufRecv] = k.send[lo:hi], k.recv[lo:hi]
		err = c.eng.Run(ctx, k.kind, seq, k.signature(), sched, &c.scratch.bufs)
		c.scratch.bufs[algo.BufSend], c.scratch.bufs[algo.BufRecv] = nil, nil
		c.ranCollective(a)
		if err != nil {
			return a, err
		}
	}
	if k.op == Avg {
		if err := reduce.Finish(k.dt, reduce.Avg, k.recv, c.size); err != nil {
			return a, fault.Wrap(fault.ErrInvalidArgument, c.rank, err, "%s", k.name)
		}
	}
	return a, nil
}

// collBlock is the frame size of collectives: a frame received for a
// reduction is reduced as soon as it lands, so smaller frames keep the landed
// bytes in cache for the reduction and overlap it with the next frame's
// transfer (2 ranks, 2 MiB ring AllReduce: 1 MiB frames ~1450 us, 256 KiB
// frames ~1180 us; 64 KiB frames pay more per-frame overhead than they save).
const collBlock = 256 << 10
