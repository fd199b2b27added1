package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"a2a/a2a/algo"
)

// cmdPlan prints, without running anything, the AllToAllV schedule every
// candidate algorithm would run for a traffic matrix, its estimated time under
// the cost model, and the one auto selection picks.
func cmdPlan(_ context.Context, _ *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	algos := fs.String("algo", "all", "candidates: all, or a comma list of pairwise, fullmesh")
	n := fs.Int("n", 8, "ranks")
	sizes := fs.String("sizes", "64K", "per-peer bytes: MIN:MAX (x2 steps) or a comma list")
	distFlag := fs.String("dist", "uniform", "traffic: uniform | zipf:S | lognormal:SIGMA | hot:F")
	seed := fs.Uint64("seed", 12345, "seed of the traffic matrix")
	streams := fs.Int("streams", 1, "connections per peer pair")
	window := fs.Int("window", algo.DefaultWindow, "fullmesh peers in flight")
	rank := fs.Int("rank", 0, "rank whose schedule is printed")
	rounds := fs.Int("rounds", 6, "rounds of the schedule printed (0: none, -1: all)")
	hosts := fs.Int("hosts", 1, "hosts the ranks are spread over (staged comes with the hierarchy issue)")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	szs, err := parseSizes(*sizes)
	if err != nil {
		return usageError{err}
	}
	d, err := parseDist(*distFlag)
	if err != nil {
		return usageError{err}
	}
	if *n < 1 || *rank < 0 || *rank >= *n || *hosts < 1 {
		return usagef("need -n >= 1, 0 <= --rank < n, --hosts >= 1")
	}
	var cands []algo.Algo
	for _, name := range strings.Split(*algos, ",") {
		if name == "all" {
			cands = append(cands, algo.AlgoPairwise, algo.AlgoFullmesh)
			continue
		}
		a, err := algo.ParseAlgo(name)
		if err != nil || (a != algo.AlgoPairwise && a != algo.AlgoFullmesh) {
			return usagef("--algo %q: pairwise or fullmesh", name)
		}
		cands = append(cands, a)
	}
	link := algo.DefaultLink()
	var s algo.Schedule
	for _, size := range szs {
		start := time.Now()
		m := d.matrix(*n, size, *seed)
		send, recv := make([]int, *n), make([]int, *n)
		for j := range *n {
			send[j], recv[j] = m[*rank**n+j], m[j**n+*rank]
		}
		chosen := algo.ChooseAllToAllV(*n, *streams, *window, m, link)
		fmt.Printf("# plan n=%d size=%d dist=%s streams=%d window=%d hosts=%d link alpha=%.1fus beta=%.2fGB/s: auto picks %s\n",
			*n, size, d, *streams, *window, *hosts, link.Alpha*1e6, 1/link.Beta/1e9, chosen)
		for _, a := range cands {
			est := algo.EstimateAllToAllV(a, m, *n, *streams, *window, link)
			args := algo.AllToAllVArgs{Rank: *rank, World: *n, SendCounts: send, RecvCounts: recv, Streams: *streams, Window: *window}
			plan := algo.PlanPairwise
			if a == algo.AlgoFullmesh {
				plan = algo.PlanFullmesh
			}
			if err := plan(&s, args); err != nil {
				return err
			}
			fmt.Printf("%-9s estimated %10.1f us, %d rounds, %d steps on rank %d\n", a, est*1e6, s.NumRounds(), len(s.Steps), *rank)
			if *rounds != 0 {
				printRounds(s.String(), *rounds)
			}
		}
		fmt.Printf("# planned in %v\n", time.Since(start).Round(time.Microsecond))
	}
	return nil
}

// printRounds prints a schedule description up to max rounds (-1: all).
func printRounds(desc string, max int) {
	lines := strings.Split(strings.TrimRight(desc, "\n"), "\n")
	shown := 0
	for i, l := range lines {
		if i == 0 {
			continue // the summary line is printed by the caller
		}
		if strings.HasPrefix(l, "round ") {
			if max >= 0 && shown == max {
				fmt.Printf("    ... %d more rounds\n", strings.Count(desc, "\nround ")-shown)
				return
			}
			shown++
		}
		fmt.Println("    " + l)
	}
}
