package a2a

import (
	"slices"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// planCollective plans collective k and returns the algorithm and the
// schedule: c.plan.sched, or for Barrier, whose plan depends on the Comm alone,
// the one planned at its first call. Every choice depends only on what all
// ranks share (world, sizes every rank passes identically, hosts, config), so
// the ranks agree without a round.
func (c *Comm) planCollective(k *coll, a *algo.CollArgs) (algo.Algo, *algo.Schedule, error) {
	if k.name == "allreduce" {
		p := &c.plan.allReduce
		key := allReduceKey{bytes: a.Bytes, dtype: a.DType, op: a.Op, inPlace: a.InPlace, segmented: k.segmented}
		if p.valid && p.key == key {
			return p.algo, &p.sched, nil
		}
		choice, err := c.planInto(&p.sched, k, a)
		p.valid, p.key, p.algo, p.ll = err == nil, key, choice, blockLL{} // a round of the old plan must not run
		return choice, &p.sched, err
	}
	if k.name == "barrier" {
		s, entry, planned := c.plan.cache.lookup(k.name, algo.AlgoAuto, nil, nil)
		if !planned {
			if _, err := c.planInto(s, k, a); err != nil {
				entry.forget()
				return s.Algo, s, err
			}
		}
		return s.Algo, s, nil
	}
	choice, err := c.planInto(&c.plan.sched, k, a)
	return choice, &c.plan.sched, err
}

// planInto plans collective k into s and returns the algorithm.
func (c *Comm) planInto(s *algo.Schedule, k *coll, a *algo.CollArgs) (algo.Algo, error) {
	link := c.plan.links.Flat(c.topo.numHosts)
	switch k.name {
	case "allreduce":
		choice := c.plan.allReduceAlgo
		if choice == algo.AlgoLL && a.Bytes > c.ll.allReduce {
			choice = algo.AlgoAuto // a slot cannot carry it (or there are none)
		}
		if choice == algo.AlgoAuto && a.Bytes <= c.ll.allReduce {
			choice = algo.AlgoLL
		}
		if choice == algo.AlgoAuto {
			choice = algo.ChooseAllReduce(c.size, a.Bytes, c.topo.hosts, link)
			if k.segmented && choice == algo.AlgoRecursiveDoubling {
				// Segments of a large AllReduce are bandwidth-bound: the
				// ring's smaller messages won in measurement (2 ranks,
				// 2 MiB: ring ~590 us, recursive doubling ~700 us).
				choice = algo.AlgoRing
			}
		}
		return choice, algo.PlanAllReduce(s, choice, *a)
	case "reducescatter":
		return algo.AlgoRing, algo.PlanReduceScatterRing(s, *a)
	case "allgather":
		return algo.AlgoRing, algo.PlanAllGatherRing(s, *a)
	case "allgatherv":
		return algo.AlgoRing, algo.PlanAllGatherVRing(s, *a)
	case "broadcast":
		choice := algo.ChooseBroadcast(c.size, a.Bytes, link)
		return choice, algo.PlanBroadcast(s, choice, *a)
	case "reduce":
		return algo.AlgoTree, algo.PlanReduceTree(s, *a)
	case "gather":
		return algo.AlgoDirect, algo.PlanGatherDirect(s, *a)
	case "gatherv":
		return algo.AlgoDirect, algo.PlanGatherVDirect(s, *a)
	case "scatter":
		return algo.AlgoDirect, algo.PlanScatterDirect(s, *a)
	case "scatterv":
		return algo.AlgoDirect, algo.PlanScatterVDirect(s, *a)
	case "barrier":
		if c.ll.barrier {
			return algo.AlgoLL, algo.PlanBarrierLL(s, *a)
		}
		return algo.AlgoDissemination, algo.PlanBarrierDissemination(s, *a)
	}
	return algo.AlgoAuto, fault.New(fault.ErrInvalidArgument, c.rank, "no planner for %s", k.name)
}

// allReducePlan keeps the plan of the last AllReduce: a training loop or a
// benchmark reduces one size over and over, and at 8 bytes planning was a
// third of the call's own cost. Apart from planCache, whose few entries
// belong to the AllToAllV shapes of a MoE step.
type allReducePlan struct {
	valid bool
	key   allReduceKey
	algo  algo.Algo
	sched algo.Schedule
	// ll is the blocking call's LL round over the last buffers (blockll.go).
	ll blockLL
}

// allReduceKey is what an AllReduce plan depends on besides the Comm's
// fixed settings (rank, world, streams, hosts, links, LL limits).
type allReduceKey struct {
	bytes              int
	dtype, op          uint8
	inPlace, segmented bool
}

// planCacheSize is how many recent AllToAllV-shaped plans a Comm keeps. A
// MoE step repeats a few fixed shapes every step (the counts exchange, the
// dispatcher's descriptor AllToAll, the in-band counts round) around the
// varying data exchange, and a benchmark repeats one shape.
const planCacheSize = 4

// planCache keeps the schedules of the last few AllToAllV-shaped calls and of
// Barrier, so that a call with the same inputs as an earlier one runs the
// schedule it planned then instead of planning again. A plan depends only on
// the algorithm, the counts and the Comm's fixed settings (rank, world,
// streams, window, LL cutoffs, hosts), so the key is the algorithm and the
// counts. Each entry owns its schedule: entries never alias Comm.sched.
type planCache struct {
	entries [planCacheSize]cachedPlan
	next    int // the entry the next miss replaces
	hit     int // the entry the last lookup returned, looked at first
}

type cachedPlan struct {
	valid      bool
	op         string // "alltoallv" or "barrier"
	algo       algo.Algo
	send, recv []int
	sched      algo.Schedule
	allLL      bool // AllToAllVArgs.AllLL of the planned call: reported as ll
	// ll is the blocking call's LL round over the last buffers (blockll.go).
	ll blockLL
}

// lookup returns the schedule planned for op with algorithm a and these
// counts, and whether it is planned already. On a miss it returns an entry to
// plan into, keyed to these inputs; the caller must call forget if planning
// fails.
func (p *planCache) lookup(op string, a algo.Algo, send, recv []int) (*algo.Schedule, *cachedPlan, bool) {
	if e := &p.entries[p.hit]; e.matches(op, a, send, recv) {
		return &e.sched, e, true // a loop of one shape hits here
	}
	for i := range p.entries {
		if e := &p.entries[i]; e.matches(op, a, send, recv) {
			p.hit = i
			return &e.sched, e, true
		}
	}
	p.hit = p.next
	e := &p.entries[p.next]
	p.next = (p.next + 1) % len(p.entries)
	e.valid, e.op, e.algo, e.ll = true, op, a, blockLL{} // a round of the old counts must not run
	e.send, e.recv = append(e.send[:0], send...), append(e.recv[:0], recv...)
	return &e.sched, e, false
}

// matches reports whether e holds the plan of op with algorithm a and these counts.
func (e *cachedPlan) matches(op string, a algo.Algo, send, recv []int) bool {
	return e.valid && e.algo == a && e.op == op && slices.Equal(e.send, send) && slices.Equal(e.recv, recv)
}

// forget drops an entry whose planning failed.
func (e *cachedPlan) forget() { e.valid = false }

// forgetAll drops every entry, for a change of the settings plans depend on
// (Comm.SetAlgo changes the LL cutoffs); the schedules' memory stays.
func (p *planCache) forgetAll() {
	for i := range p.entries {
		p.entries[i].valid = false
	}
}
