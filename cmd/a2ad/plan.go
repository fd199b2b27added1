package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/algo"
)

// cmdPlan prints, without running anything, the AllToAllV schedule every
// candidate algorithm would run for a traffic matrix, its estimated time under
// the cost model, and the one auto selection picks.
func cmdPlan(_ context.Context, _ *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	algos := fs.String("algo", "all", "candidates: all, or a comma list of pairwise, fullmesh, skew, staged, ll")
	llBytes := fs.Int("ll-bytes", a2a.ClassCapabilities("shm").SlotBytes, "LL cutoff for the ll candidate: the shm slot size")
	n := fs.Int("n", 8, "ranks")
	sizes := fs.String("sizes", "64K", "per-peer bytes: MIN:MAX (x2 steps) or a comma list")
	distFlag := fs.String("dist", "uniform", "traffic: uniform | zipf:S | lognormal:SIGMA | hot:F")
	seed := fs.Uint64("seed", 12345, "seed of the traffic matrix")
	streams := fs.Int("streams", a2a.DefaultStreams, "connections per peer pair, as a job has by default")
	window := fs.Int("window", algo.DefaultWindow, "fullmesh peers in flight")
	rank := fs.Int("rank", 0, "rank whose schedule is printed")
	rounds := fs.Int("rounds", 6, "rounds of the schedule printed (0: none, -1: all)")
	hosts := fs.Int("hosts", 1, "hosts the ranks are spread over (consecutive ranks per host)")
	machines := fs.Int("machines", 0, "machines the hosts share (consecutive hosts per machine; 0: one per host), e.g. 1 for the test bed's namespaces")
	cores := fs.Int("cores", 0, "CPUs each machine gives the job (0: a core per rank); fewer than its ranks bound every estimate by the machine's total work")
	linksFile := fs.String("links", "", "link table written by \"a2ad tune\" (default: built-in)")
	localClass := fs.String("local-class", "shm", "data plane between ranks of one host (shm, tcp, verbs): prices the local role")
	remoteClass := fs.String("remote-class", "tcp", "data plane between hosts (tcp, verbs): prices the remote role")
	if err := parseFlags(fs, args); err != nil {
		return usageError{err}
	}
	links := a2a.BuiltinLinks().Table(*localClass, *remoteClass)
	if *linksFile != "" {
		l, err := algo.LoadLinks(*linksFile)
		if err != nil {
			return usageError{err}
		}
		links = l.For(*localClass, *remoteClass, a2a.BuiltinLinks())
	}
	szs, err := parseSizes(*sizes)
	if err != nil {
		return usageError{err}
	}
	d, err := parseDist(*distFlag)
	if err != nil {
		return usageError{err}
	}
	if *n < 1 || *rank < 0 || *rank >= *n || *hosts < 1 || *machines < 0 || *machines > *hosts || *cores < 0 {
		return usagef("need -n >= 1, 0 <= --rank < n, --hosts >= 1, 0 <= --machines <= --hosts, --cores >= 0")
	}
	var cands []algo.Algo
	for _, name := range strings.Split(*algos, ",") {
		if name == "all" {
			// Every candidate, also those auto leaves out here (each says why).
			cands = append(cands, algo.AlgoPairwise, algo.AlgoFullmesh, algo.AlgoStaged, algo.AlgoSkew, algo.AlgoLL)
			continue
		}
		a, err := algo.ParseAlgo(name)
		if err != nil || (a != algo.AlgoPairwise && a != algo.AlgoFullmesh && a != algo.AlgoSkew && a != algo.AlgoStaged && a != algo.AlgoLL) {
			return usagef("--algo %q: pairwise, fullmesh, skew, staged or ll", name)
		}
		cands = append(cands, a)
	}
	var s algo.Schedule
	var chooser algo.Chooser
	hostOf, machineOf := make([]int, *n), []int(nil)
	for r := range hostOf {
		hostOf[r] = r * *hosts / *n
	}
	var machineCores []int
	if *machines > 0 && *cores > 0 {
		machineOf, machineCores = make([]int, *n), make([]int, *machines)
		for r := range machineOf {
			machineOf[r] = hostOf[r] * *machines / *hosts
		}
		for m := range machineCores {
			machineCores[m] = *cores
		}
	}
	// The LL cutoffs a Comm plans pairwise and fullmesh with under auto
	// (the printed rank's view; every pair quiet, as under auto), and those
	// of the ll candidate.
	llLocal := a2a.ClassLLCutoff(links.LocalClass, a2a.DefaultLLBytes)
	llRemote := a2a.ClassLLCutoff(links.RemoteClass, a2a.DefaultLLBytes)
	autoCut, autoQuiet := make([]int, *n), make([]bool, *n)
	for j := range autoCut {
		autoCut[j], autoQuiet[j] = llLocal, true
		if hostOf[j] != hostOf[*rank] {
			autoCut[j] = llRemote
		}
	}
	autoCut[*rank] = -1
	cut := make([]int, *n) // LL cutoff of the ll candidate: every peer but the printed rank
	for j := range cut {
		cut[j] = *llBytes
	}
	cut[*rank] = -1
	for _, size := range szs {
		start := time.Now()
		m := d.matrix(*n, size, *seed)
		send, recv := make([]int, *n), make([]int, *n)
		for j := range *n {
			send[j], recv[j] = m[*rank**n+j], m[j**n+*rank]
		}
		// The one rule auto selection runs in a Comm, on the same inputs.
		priced, chosen := chooser.Price(algo.ChoiceArgs{World: *n, Streams: *streams, Window: *window, Matrix: m, Hosts: hostOf, Links: links, Machines: machineOf, Cores: machineCores,
			LLLocal: llLocal, LLRemote: llRemote})
		fmt.Printf("# plan n=%d size=%d dist=%s streams=%d window=%d hosts=%d%s links local(%s) alpha=%.1fus beta=%.2fGB/s remote(%s) alpha=%.1fus beta=%.2fGB/s: auto picks %s\n",
			*n, size, d, *streams, *window, *hosts, crowdNote(*machines, *cores), links.LocalClass, links.Local.Alpha*1e6, 1/links.Local.Beta/1e9,
			links.RemoteClass, links.Remote.Alpha*1e6, 1/links.Remote.Beta/1e9, chosen)
		for _, a := range cands {
			var cand algo.Candidate
			for _, c := range priced {
				if c.Algo == a {
					cand = c
				}
			}
			if cand.Why != "" {
				fmt.Printf("%-9s left out by auto: %s\n", a, cand.Why)
				continue
			}
			args := algo.AllToAllVArgs{Rank: *rank, World: *n, SendCounts: send, RecvCounts: recv, Streams: *streams, Window: *window,
				LLCutoff: autoCut, LLQuiet: autoQuiet}
			est, note := cand.Estimate, ""
			var err error
			switch a {
			case algo.AlgoPairwise:
				err = algo.PlanPairwise(&s, args)
			case algo.AlgoFullmesh:
				err = algo.PlanFullmesh(&s, args)
			case algo.AlgoSkew:
				err = algo.PlanSkew(&s, algo.SkewArgs{Rank: *rank, World: *n, Matrix: m, Streams: *streams, Window: 1})
			case algo.AlgoLL:
				args.LLCutoff, args.LLQuiet = cut, nil
				err = algo.PlanLL(&s, args)
				est = algo.EstimateLL(m, *n, *streams, *window, *llBytes, links.Flat(*hosts))
				note = " (forced only: under auto every algorithm sends blocks up to a pair's LL cutoff one-sided)"
			case algo.AlgoStaged:
				err = algo.PlanStaged(&s, algo.StagedArgs{Rank: *rank, World: *n, Matrix: m, Hosts: hostOf, Streams: *streams})
			}
			if err != nil {
				return err
			}
			if a == chosen {
				note = " <- auto"
			}
			fmt.Printf("%-9s estimated %10.1f us, %d rounds, %d steps on rank %d%s\n", a, est*1e6, s.NumRounds(), len(s.Steps), *rank, note)
			if *rounds != 0 {
				printRounds(s.String(), *rounds)
			}
		}
		fmt.Printf("lower bound %10.1f us (busiest rank's bytes at full bandwidth; across hosts, or the busiest host's over its ranks' remote links)\n", algo.LowerBoundAllToAllVHosts(m, hostOf, links)*1e6)
		if machineOf != nil {
			fmt.Printf("lower bound %10.1f us on crowded machines (every byte copied at each end over the machine's cores)\n", algo.LowerBoundCrowded(m, hostOf, machineOf, machineCores, links)*1e6)
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

// crowdNote describes the machines of the plan header, when given.
func crowdNote(machines, cores int) string {
	if machines == 0 || cores == 0 {
		return ""
	}
	return fmt.Sprintf(" machines=%d cores/machine=%d", machines, cores)
}
