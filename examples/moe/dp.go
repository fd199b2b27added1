package main

import (
	"context"
	"fmt"
	"io"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
)

// Data parallelism (--dp D). The world's n ranks split (Comm.Split) into D
// expert-parallel groups of n/D consecutive ranks: each group runs the
// whole layer (every expert placed over its own ranks, its dispatcher on
// the group's communicator, unchanged), on tokens of its own (they come
// from the world rank). The ranks that hold the same experts in each group
// form a data-parallel group of D ranks (a second Split), across which
// every step's rows per expert are summed with an AllReduce, as the
// gradients of replicated experts would be; the sum is checked against
// the loads gathered over the world communicator. All three communicators
// share the world's data plane.

// dataParallel is a rank's data-parallel group and what checks it.
type dataParallel struct {
	world, dp  *a2a.Comm
	groups     int
	send, recv []int64
	all        []int64 // the world's loads, by rank
}

// splitDP splits world into groups expert-parallel groups and returns this
// rank's, and its data-parallel group.
func splitDP(ctx context.Context, world *a2a.Comm, groups, experts int) (*a2a.Comm, *dataParallel, error) {
	n := world.Size()
	if groups < 1 || n%groups != 0 {
		return nil, nil, fmt.Errorf("--dp %d: want a divisor of the %d ranks", groups, n)
	}
	per := n / groups
	ep, err := world.Split(ctx, world.Rank()/per, world.Rank())
	if err != nil {
		return nil, nil, err
	}
	dp, err := world.Split(ctx, world.Rank()%per, world.Rank())
	if err != nil {
		ep.Close()
		return nil, nil, err
	}
	return ep, &dataParallel{world: world, dp: dp, groups: groups,
		send: make([]int64, experts), recv: make([]int64, experts), all: make([]int64, n*experts)}, nil
}

func (p *dataParallel) close() { p.dp.Close() }

// allReduce sums load (this rank's rows per expert in the step) over the
// data-parallel group, checks the sum against the world's loads and writes
// the line of the step to out.
func (p *dataParallel) allReduce(ctx context.Context, step int, load []int, out io.Writer) error {
	for e, n := range load {
		p.send[e] = int64(n)
	}
	if err := a2a.AllReduceSlice(ctx, p.dp, p.send, p.recv, reduce.Sum); err != nil {
		return fmt.Errorf("step %d: data-parallel AllReduce: %w", step, err)
	}
	if err := a2a.AllGatherSlice(ctx, p.world, p.send, p.all); err != nil {
		return fmt.Errorf("step %d: gathering the loads: %w", step, err)
	}
	per, me, E := p.world.Size()/p.groups, p.world.Rank(), len(load)
	total := int64(0)
	for e := range E {
		want := int64(0)
		for r := me % per; r < p.world.Size(); r += per {
			want += p.all[r*E+e]
		}
		if p.recv[e] != want {
			return fmt.Errorf("step %d: data-parallel AllReduce gives %d rows for expert %d, the world's loads %d", step, p.recv[e], e, want)
		}
		total += want
	}
	fmt.Fprintf(out, "  dp: rows per expert AllReduced over %d groups, %d rows, equal to the world's gathered loads\n", p.groups, total)
	return nil
}
