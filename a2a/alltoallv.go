package a2a

import (
	"context"
	"encoding/binary"
	"math"
	"time"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/internal/engine"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// AllToAllV sends send[displ(j) : displ(j)+sendCounts[j]] to rank j and
// receives rank i's block into recv[displ(i) : displ(i)+recvCounts[i]], where
// the displacements are prefix sums of the counts. Blocks may be empty. Every
// rank must call it with recvCounts[i] equal to rank i's sendCounts[this rank]
// (ExchangeCounts or AllToAllVInBand learn them); a disagreement fails with
// ErrMismatch on the receiver and aborts the group. To check those lengths,
// every algorithm has every pair of ranks on one host exchange a message,
// empty blocks included, so a rank's call returns only after each same-host
// rank has entered the call (package dispatch relies on that).
func (c *Comm) AllToAllV(ctx context.Context, send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	return c.exchange(ctx, "alltoallv", "AllToAllV", func(seq uint64) (algo.Algo, []int, []int, error) {
		a, err := c.alltoallv(ctx, transport.OpAllToAllV, seq, send, sendCounts, recv, recvCounts, nil)
		return a, sendCounts, recvCounts, err
	})
}

// exchange runs one AllToAllV-shaped call: it takes the operation lock, runs
// f, aborts the group if f failed, and reports to the Observer before
// releasing the lock, so the counts and wait figures it reads are this call's.
func (c *Comm) exchange(ctx context.Context, name, title string, f func(seq uint64) (algo.Algo, []int, []int, error)) error {
	start := c.clock()
	seq, err := c.begin(ctx, title, start, true)
	if err != nil {
		c.observeRejected(name, start, err)
		return err
	}
	a, sendCounts, recvCounts, err := f(seq)
	if err != nil {
		err = c.failAt(seq, err) // not fail: later calls may be numbered already (icoll.go)
	}
	c.observe(name, a, seq, sendCounts, recvCounts, start, err)
	c.tallyOp(name, a, err)
	c.end(seq, true, err)
	return err
}

// AllToAll sends equal blocks: block j of send (len(send)/Size bytes) goes to
// rank j, and rank i's block lands in block i of recv. len(send) must be a
// multiple of Size and len(recv) == len(send).
func (c *Comm) AllToAll(ctx context.Context, send, recv []byte) error {
	return c.exchange(ctx, "alltoall", "AllToAll", func(seq uint64) (algo.Algo, []int, []int, error) {
		if len(send)%c.size != 0 || len(recv) != len(send) {
			return algo.AlgoAuto, nil, nil, fault.New(fault.ErrInvalidArgument, c.rank, "AllToAll: len(send)=%d must be a multiple of %d ranks and equal len(recv)=%d", len(send), c.size, len(recv))
		}
		block := len(send) / c.size
		for i := range c.scratch.equalSend {
			c.scratch.equalSend[i], c.scratch.equalRecv[i] = block, block
		}
		a, err := c.alltoallv(ctx, transport.OpAllToAll, seq, send, c.scratch.equalSend, recv, c.scratch.equalRecv, nil)
		return a, c.scratch.equalSend, c.scratch.equalRecv, err
	})
}

// AllToAllVInBand is AllToAllV for callers that do not know what they will
// receive: the ranks first exchange their counts on the data plane (a small
// all-to-all, no control-plane round trip), then the data. recvCounts
// (len Size) is filled with what each rank sent; recv must hold their sum, or
// the call fails with ErrInvalidArgument before any payload moves.
func (c *Comm) AllToAllVInBand(ctx context.Context, send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	return c.exchange(ctx, "alltoallv", "AllToAllVInBand", func(seq uint64) (algo.Algo, []int, []int, error) {
		a, err := c.inBand(ctx, seq, send, sendCounts, recv, recvCounts)
		return a, sendCounts, recvCounts, err
	})
}

func (c *Comm) inBand(ctx context.Context, seq uint64, send []byte, sendCounts []int, recv []byte, recvCounts []int) (algo.Algo, error) {
	if err := c.checkCounts("send", sendCounts, len(send)); err != nil {
		return algo.AlgoAuto, err
	}
	if len(recvCounts) != c.size {
		return algo.AlgoAuto, fault.New(fault.ErrInvalidArgument, c.rank, "len(recvCounts)=%d, want %d", len(recvCounts), c.size)
	}
	for j, n := range sendCounts {
		binary.LittleEndian.PutUint64(c.scratch.countsOut[8*j:], uint64(n))
		c.scratch.equalSend[j], c.scratch.equalRecv[j] = 8, 8
	}
	if _, err := c.alltoallv(ctx, transport.OpCounts, seq, c.scratch.countsOut, c.scratch.equalSend, c.scratch.countsIn, c.scratch.equalRecv, nil); err != nil {
		return algo.AlgoAuto, err
	}
	total := 0
	for i := range recvCounts {
		recvCounts[i] = int(binary.LittleEndian.Uint64(c.scratch.countsIn[8*i:]))
		total += recvCounts[i]
	}
	if total > len(recv) {
		return algo.AlgoAuto, fault.New(fault.ErrInvalidArgument, c.rank, "AllToAllVInBand: peers send %d bytes, recv holds %d", total, len(recv))
	}
	return c.alltoallv(ctx, transport.OpAllToAllV, seq, send, sendCounts, recv, recvCounts, nil)
}

// ExchangeCounts sends sendCounts[j] (what this rank will send rank j) through
// the control plane and returns recvCounts[i], what rank i will send this rank.
func (c *Comm) ExchangeCounts(ctx context.Context, sendCounts []int) ([]int, error) {
	recv := make([]int, c.size)
	return recv, c.exchangeCounts(ctx, sendCounts, recv, nil)
}

// ExchangeCountsMatrix is ExchangeCounts that also fills matrix (len Size*Size,
// row-major: matrix[i*Size+j] = bytes rank i sends rank j) with the whole
// traffic matrix, which every rank then holds identically.
func (c *Comm) ExchangeCountsMatrix(ctx context.Context, sendCounts, recvCounts, matrix []int) error {
	if matrix == nil {
		matrix = []int{} // checked as a matrix of the wrong length, not as none
	}
	return c.exchangeCounts(ctx, sendCounts, recvCounts, matrix)
}

func (c *Comm) exchangeCounts(ctx context.Context, sendCounts, recvCounts, matrix []int) error {
	if c.isChild() {
		return errChildCounts(c.rank) // every rank of the child returns it: nothing waits
	}
	start := c.clock()
	seq, err := c.begin(ctx, "ExchangeCounts", start, false)
	if err != nil {
		if o := c.observer; o != nil {
			o.CountsExchanged(time.Since(start), err)
		}
		return err
	}
	err = c.checkCounts("send", sendCounts, -1)
	if err == nil && matrix != nil && len(matrix) != c.size*c.size {
		// Checked once numbered, so the abort covers this call and not a
		// collective another goroutine started (icoll.go).
		err = fault.New(fault.ErrInvalidArgument, c.rank, "len(matrix)=%d, want %d", len(matrix), c.size*c.size)
	}
	if err == nil {
		var cancel context.CancelFunc
		if _, has := ctx.Deadline(); !has {
			ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		} else {
			ctx, cancel = context.WithCancel(ctx)
		}
		// Close ends the wait at once (it waits for running calls).
		stop := context.AfterFunc(doneContext{c.life.closing}, cancel)
		err = c.member.ExchangeCounts(ctx, seq, sendCounts, recvCounts, matrix)
		stop()
		cancel()
		if err != nil && c.life.closed.Load() {
			err = errClosedComm(c.rank)
		}
	}
	if err != nil {
		err = c.failAt(seq, err)
	}
	if o := c.observer; o != nil {
		o.CountsExchanged(time.Since(start), err)
	}
	c.end(seq, false, err)
	return err
}

// alltoallv validates, plans and runs one AllToAllV-shaped exchange. matrix,
// when not nil, is the global traffic matrix every rank holds identically.
func (c *Comm) alltoallv(ctx context.Context, kind transport.OpKind, seq uint64, send []byte, sendCounts []int, recv []byte, recvCounts []int, matrix []int) (algo.Algo, error) {
	if matrix == nil {
		if round := c.sameCall(kind, send, sendCounts, recv, recvCounts); round != nil {
			c.setLastAlgo(algo.AlgoLL)
			return algo.AlgoLL, c.runLLRound(ctx, round) // blockll.go
		}
	}
	if err := c.checkExchange(sendCounts, len(send), recvCounts, len(recv)); err != nil {
		return algo.AlgoAuto, err
	}
	a := c.pickAllToAllV(kind, matrix)
	sched, a, err := c.planAllToAllV(ctx, seq, a, sendCounts, recvCounts, matrix)
	if err != nil {
		return a, err
	}
	c.setLastAlgo(a)
	if round := c.llRound(kind, a, sched, send, recv); round != nil {
		return a, c.runLLRound(ctx, round)
	}
	c.scratch.bufs[algo.BufSend], c.scratch.bufs[algo.BufRecv] = send, recv
	err = c.eng.Run(ctx, kind, seq, 0, sched, &c.scratch.bufs)
	c.scratch.bufs[algo.BufSend], c.scratch.bufs[algo.BufRecv] = nil, nil
	// Every pair exchanged something in this op (a message or a frame, even
	// an empty one), so a peer that starts the next op has finished reading
	// the slots of the previous epoch of the same parity: the LL epoch may
	// advance. Only all-to-all shaped ops advance it; a rooted collective
	// would not give that guarantee.
	c.eng.NextLLEpoch()
	return a, err
}

// checkExchange validates the counts of an AllToAllV-shaped exchange against
// its buffers.
func (c *Comm) checkExchange(sendCounts []int, sendLen int, recvCounts []int, recvLen int) error {
	if err := c.checkCounts("send", sendCounts, sendLen); err != nil {
		return err
	}
	if err := c.checkCounts("recv", recvCounts, recvLen); err != nil {
		return err
	}
	if sendCounts[c.rank] != recvCounts[c.rank] {
		return fault.New(fault.ErrInvalidArgument, c.rank, "sendCounts[self]=%d != recvCounts[self]=%d", sendCounts[c.rank], recvCounts[c.rank])
	}
	return nil
}

// pickAllToAllV is the algorithm of an exchange of kind: the forced one, or
// the one chosen at join from inputs every rank shares, or, with the global
// matrix and no forcing, the choice for that matrix.
func (c *Comm) pickAllToAllV(kind transport.OpKind, matrix []int) algo.Algo {
	a := c.plan.algo
	switch {
	case kind == transport.OpCounts && (a == algo.AlgoStaged || a == algo.AlgoSkew):
		a = algo.AlgoFullmesh // the small counts exchanges that staged and skew rely on
	case matrix != nil && c.cfg.Algo == "":
		a = c.chooseForMatrix(matrix)
	}
	if a == algo.AlgoStaged && !c.topo.evenHosts {
		// Forced or chosen, staged needs equal ranks per host. Every rank
		// sees the same hosts, so every rank falls back alike, and before
		// gathering a matrix only staged would use.
		c.plan.unevenOnce.Do(func() {
			c.log.Warn("a2a: staged needs equal ranks per host; using fullmesh", "hosts", c.topo.numHosts, "ranks", c.size)
		})
		a = algo.AlgoFullmesh
	}
	return a
}

// planAllToAllV plans an exchange by algorithm a and returns the schedule
// and the algorithm to report: ll when every block of this rank goes by LL.
// Staged and skew need the global matrix, gathered in-band when matrix is
// nil.
func (c *Comm) planAllToAllV(ctx context.Context, seq uint64, a algo.Algo, sendCounts, recvCounts, matrix []int) (*algo.Schedule, algo.Algo, error) {
	var err error
	if a == algo.AlgoStaged || a == algo.AlgoSkew {
		if matrix == nil {
			if matrix, err = c.gatherMatrix(ctx, seq, sendCounts); err != nil {
				return nil, a, err
			}
		}
		if a == algo.AlgoSkew {
			err = algo.PlanSkew(&c.plan.sched, algo.SkewArgs{Rank: c.rank, World: c.size, Matrix: matrix, Streams: c.cfg.Streams, Window: 1})
		} else {
			err = algo.PlanStaged(&c.plan.sched, algo.StagedArgs{Rank: c.rank, World: c.size, Matrix: matrix, Hosts: c.topo.hosts, Streams: c.cfg.Streams})
		}
		if err != nil {
			return nil, a, fault.Wrap(fault.ErrInvalidArgument, c.rank, err, "planning %s", a)
		}
		return &c.plan.sched, a, nil
	}
	sched, allLL, err := c.planFlat("alltoallv", a, sendCounts, recvCounts, true)
	if err != nil {
		return nil, a, err
	}
	if allLL {
		a = algo.AlgoLL // for reports: no block of this rank went by frames
	}
	return sched, a, nil
}

// planFlat returns the plan of a flat AllToAllV (pairwise, fullmesh or ll)
// for op, from the cache when a call with the same inputs planned it
// before: these plans depend on the counts and the Comm's settings only.
// With ll, blocks within the pairs' LL cutoffs go by LL. allLL reports that
// every block of this rank does.
func (c *Comm) planFlat(op string, a algo.Algo, sendCounts, recvCounts []int, ll bool) (sched *algo.Schedule, allLL bool, err error) {
	sched, entry, planned := c.plan.cache.lookup(op, a, sendCounts, recvCounts)
	if planned {
		return sched, entry.allLL, nil // a steady loop of calls ends here
	}
	if entry.allLL, err = c.planFlatInto(sched, a, sendCounts, recvCounts, ll); err != nil {
		entry.forget()
		return nil, false, err
	}
	return sched, entry.allLL, nil
}

// planFlatInto plans a flat AllToAllV by algorithm a into sched (see planFlat).
func (c *Comm) planFlatInto(sched *algo.Schedule, a algo.Algo, sendCounts, recvCounts []int, ll bool) (allLL bool, err error) {
	args := algo.AllToAllVArgs{Rank: c.rank, World: c.size, SendCounts: sendCounts, RecvCounts: recvCounts,
		Streams: c.cfg.Streams, Window: c.cfg.Window}
	if ll {
		args.LLCutoff, args.LLQuiet = c.ll.cut, c.ll.quiet
	}
	switch a {
	case algo.AlgoPairwise:
		err = algo.PlanPairwise(sched, args)
	case algo.AlgoFullmesh:
		err = algo.PlanFullmesh(sched, args)
	default:
		err = algo.PlanLL(sched, args)
	}
	if err != nil {
		return false, fault.Wrap(fault.ErrInvalidArgument, c.rank, err, "planning %s", a)
	}
	return args.AllLL(), nil
}

// chooseForMatrix picks an algorithm from the global matrix; every rank holds
// the same matrix and hosts, so every rank picks the same one.
func (c *Comm) chooseForMatrix(matrix []int) algo.Algo {
	return c.plan.chooser.Choose(c.choiceArgs(matrix))
}

// choiceArgs is what the automatic choice reads for an AllToAllV with the
// global matrix, or nil when only this rank's counts are known.
func (c *Comm) choiceArgs(matrix []int) algo.ChoiceArgs {
	local, remote := c.llPriceCutoffs()
	return algo.ChoiceArgs{World: c.size, Streams: c.cfg.Streams, Window: c.cfg.Window, Matrix: matrix, Hosts: c.topo.hosts, Links: c.plan.links,
		Machines: c.topo.machines, Cores: c.topo.machineCores, LLLocal: local, LLRemote: remote}
}

// gatherMatrix builds the global traffic matrix on the data plane: every rank
// sends its row of counts to every rank (an all-to-all of Size*8-byte blocks).
func (c *Comm) gatherMatrix(ctx context.Context, seq uint64, sendCounts []int) ([]int, error) {
	n := c.size
	if c.scratch.matrix == nil {
		c.scratch.matrix = make([]int, n*n)
		c.scratch.rowsOut = make([]byte, 8*n*n)
		c.scratch.rowsIn = make([]byte, 8*n*n)
		c.scratch.rowCounts = make([]int, n)
	}
	for j := range n {
		for k, v := range sendCounts {
			binary.LittleEndian.PutUint64(c.scratch.rowsOut[8*(j*n+k):], uint64(v))
		}
		c.scratch.rowCounts[j] = 8 * n
	}
	if _, err := c.alltoallv(ctx, transport.OpCounts, seq, c.scratch.rowsOut, c.scratch.rowCounts, c.scratch.rowsIn, c.scratch.rowCounts, nil); err != nil {
		return nil, err
	}
	for i := range c.scratch.matrix {
		c.scratch.matrix[i] = int(binary.LittleEndian.Uint64(c.scratch.rowsIn[8*i:]))
	}
	return c.scratch.matrix, nil
}

// AllToAllVMatrix is AllToAllV for callers that hold the whole traffic matrix
// (ExchangeCountsMatrix gives every rank the same one): matrix[i*Size+j] is
// what rank i sends rank j, so this rank sends row Rank and receives column
// Rank. Knowing everyone's traffic lets the ranks agree, with no extra round,
// on algorithms that need it: the staged two-level exchange across hosts and
// the cost model's pick for this very matrix.
func (c *Comm) AllToAllVMatrix(ctx context.Context, send, recv []byte, matrix []int) error {
	return c.exchange(ctx, "alltoallv", "AllToAllVMatrix", func(seq uint64) (algo.Algo, []int, []int, error) {
		n := c.size
		if len(matrix) != n*n {
			return algo.AlgoAuto, nil, nil, fault.New(fault.ErrInvalidArgument, c.rank, "len(matrix)=%d, want %d", len(matrix), n*n)
		}
		for j := range n {
			c.scratch.matSend[j], c.scratch.matRecv[j] = matrix[c.rank*n+j], matrix[j*n+c.rank]
		}
		a, err := c.alltoallv(ctx, transport.OpAllToAllV, seq, send, c.scratch.matSend, recv, c.scratch.matRecv, matrix)
		return a, c.scratch.matSend, c.scratch.matRecv, err
	})
}

// checkCounts validates a counts vector against a buffer of length n (n < 0: no buffer).
func (c *Comm) checkCounts(what string, counts []int, n int) error {
	if len(counts) != c.size {
		return fault.New(fault.ErrInvalidArgument, c.rank, "len(%sCounts)=%d, want %d ranks", what, len(counts), c.size)
	}
	total := 0
	for j, v := range counts {
		if v < 0 {
			return fault.New(fault.ErrInvalidArgument, c.rank, "%sCounts[%d]=%d is negative", what, j, v)
		}
		if v > math.MaxInt-total { // the sum would wrap and pass any buffer check
			return fault.New(fault.ErrInvalidArgument, c.rank, "%sCounts sum past the largest int at [%d]=%d", what, j, v)
		}
		total += v
	}
	if n >= 0 && total > n {
		return fault.New(fault.ErrInvalidArgument, c.rank, "%sCounts sum to %d bytes, %s buffer holds %d", what, total, what, n)
	}
	return nil
}

// observeRejected reports a call refused before it started (the
// communicator was already aborted or closed, or ctx was done).
func (c *Comm) observeRejected(op string, start time.Time, err error) {
	if o := c.observer; o != nil {
		o.OpDone(OpEvent{Op: op, Algo: algo.AlgoAuto.String(), Rank: c.rank, Size: c.size, Duration: time.Since(start), Err: err, LastPeer: -1})
	}
}

// observe reports a finished operation to the Observer.
func (c *Comm) observe(op string, a algo.Algo, seq uint64, sendCounts, recvCounts []int, start time.Time, err error) {
	o := c.observer
	if o == nil {
		return
	}
	ev := OpEvent{Op: op, Algo: a.String(), Rank: c.rank, Size: c.size, Seq: seq, Duration: time.Since(start), Err: err}
	if len(sendCounts) == c.size && len(recvCounts) == c.size {
		var t engine.Traffic
		for j := range sendCounts {
			if j != c.rank {
				t.Add(true, c.eng.SameHost(j), sendCounts[j])
				t.Add(false, c.eng.SameHost(j), recvCounts[j])
			}
		}
		ev.setTraffic(t)
	}
	ev.LastPeer, ev.LastWait = c.eng.LastArrival()
	o.OpDone(ev)
}

// SetAlgo forces the AllToAllV algorithm of the calls that follow, by the
// names of Config.Algo; "" or "auto" returns to the automatic choice. The
// Comm then plans as one that joined with that Config.Algo: an algorithm
// other than ll also runs Barrier and small AllReduces without their LL
// round. Like Config.Algo it must be the same on every rank: set it on all
// of them between the same two calls (a benchmark comparing algorithms
// does).
func (c *Comm) SetAlgo(name string) error {
	a, err := parseAlgo(name)
	if err != nil {
		return err
	}
	// The setting belongs to the collectives: none may run meanwhile (a
	// persistent collective's lease between its uses gives way).
	ends := c.queue.lease.ends.Load()
	for !c.life.collBusy.CompareAndSwap(false, true) {
		if c.queue.revokeAfter(ends) {
			ends = c.queue.lease.ends.Load()
			continue
		}
		return fault.New(fault.ErrInvalidArgument, c.rank, "SetAlgo called while a collective runs on this Comm")
	}
	defer c.queue.wakeSleepers()
	defer c.life.collBusy.Store(false)
	if a == algo.AlgoAuto {
		name, a = "", c.plan.chooser.Choose(c.choiceArgs(nil))
	}
	c.cfg.Algo, c.plan.algo = name, a
	// Forced algorithms other than ll plan without LL blocks, and Barrier
	// and small AllReduces without an LL round, as under Config.Algo; plans
	// made under the old setting no longer hold.
	c.ll = c.newLLPolicy()
	c.plan.cache.forgetAll()
	c.plan.allReduce.valid = false
	return nil
}
