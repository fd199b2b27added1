package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/algo"
)

// cmdPlan prints, without running anything, the estimated time under the cost
// model of every candidate AllToAllV algorithm for a traffic matrix and the
// one auto selection picks: a summary of a few lines per size. --rounds adds
// the schedules themselves.
func cmdPlan(ctx context.Context, _ *slog.Logger, args []string) error {
	p, err := newPlanner(args)
	if err != nil {
		return err
	}
	if p.moe != "" {
		return planMoE(ctx, os.Stdout, p.moe, p.n, p.hosts, p.redundant)
	}
	for _, size := range p.sizes {
		if err := p.printSize(size); err != nil {
			return err
		}
	}
	return nil
}

// planFlags are the flags of a2ad plan, as given.
type planFlags struct {
	algos       string
	llBytes     int
	n           int
	sizeSpec    string
	distSpec    string
	seed        uint64
	streams     int
	window      int
	rank        int
	rounds      int
	hosts       int
	machines    int
	cores       int
	linksFile   string
	localClass  string
	remoteClass string
	moe         string // planmoe.go
	redundant   int
}

func (f *planFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.algos, "algo", "all", "candidates: all, or a comma list of pairwise, fullmesh, skew, staged, ll")
	fs.IntVar(&f.llBytes, "ll-bytes", a2a.DefaultLLBytes, llBytesUsage)
	fs.IntVar(&f.n, "n", 8, "ranks")
	fs.StringVar(&f.sizeSpec, "sizes", "64K", "per-peer bytes: MIN:MAX (x2 steps) or a comma list")
	fs.StringVar(&f.distSpec, "dist", "uniform", "traffic: uniform | zipf:S | lognormal:SIGMA | hot:F")
	fs.Uint64Var(&f.seed, "seed", 12345, "seed of the traffic matrix")
	fs.IntVar(&f.streams, "streams", a2a.DefaultStreams, "connections per peer pair, as a job has by default")
	fs.IntVar(&f.window, "window", algo.DefaultWindow, "fullmesh peers in flight")
	fs.IntVar(&f.rank, "rank", 0, "rank whose schedule is printed")
	fs.IntVar(&f.rounds, "rounds", 0, "rounds of each schedule printed after its estimate (0: the summary only, -1: whole schedules)")
	fs.IntVar(&f.hosts, "hosts", 1, "hosts the ranks are spread over (consecutive ranks per host)")
	fs.IntVar(&f.machines, "machines", 0, "machines the hosts share (consecutive hosts per machine; 0: one per host), e.g. 1 for the test bed's namespaces")
	fs.IntVar(&f.cores, "cores", 0, "CPUs each machine gives the job (0: a core per rank); fewer than its ranks bound every estimate by the machine's total work")
	fs.StringVar(&f.linksFile, "links", "", "link table written by \"a2ad tune\" (default: built-in)")
	fs.StringVar(&f.localClass, "local-class", "shm", "data plane between ranks of one host (shm, tcp, verbs; shm-mapped: shm copying from registered buffers): prices the local role")
	fs.StringVar(&f.remoteClass, "remote-class", "tcp", "data plane between hosts (tcp, verbs): prices the remote role")
	fs.StringVar(&f.moe, "moe", "", "instead: the MoE expert placement routing.Balance computes for -n ranks over --hosts from these loads: a rank's /metrics URL (a2a_moe_expert_load), a file of them, or a file (- for stdin) of one load per expert")
	fs.IntVar(&f.redundant, "redundant", 0, "with --moe: slots beyond one per expert, for replicas of the hot ones")
}

// validate checks the flags that shape the job: ranks, hosts, machines.
func (f *planFlags) validate() error {
	if f.n < 1 || f.rank < 0 || f.rank >= f.n || f.hosts < 1 || f.machines < 0 || f.machines > f.hosts || f.cores < 0 {
		return usagef("need -n >= 1, 0 <= --rank < n, --hosts >= 1, 0 <= --machines <= --hosts, --cores >= 0")
	}
	return nil
}

// planLinks is the link table that prices the plans: --links, or the
// built-in one, for the classes of the two roles.
func planLinks(f planFlags) (algo.Links, error) {
	if f.linksFile == "" {
		return a2a.BuiltinLinks().Table(f.localClass, f.remoteClass), nil
	}
	l, err := algo.LoadLinks(f.linksFile)
	if err != nil {
		return algo.Links{}, err
	}
	return l.For(f.localClass, f.remoteClass, a2a.BuiltinLinks()), nil
}

// planCandidates reads --algo: the algorithms whose schedules are printed.
func planCandidates(list string) ([]algo.Algo, error) {
	var cands []algo.Algo
	for _, name := range strings.Split(list, ",") {
		if name == "all" {
			// Every candidate, also those auto leaves out here (each says why).
			cands = append(cands, algo.AlgoPairwise, algo.AlgoFullmesh, algo.AlgoStaged, algo.AlgoSkew, algo.AlgoLL)
			continue
		}
		a, err := algo.ParseAlgo(name)
		if err != nil || !plannable(a) {
			return nil, usagef("--algo %q: pairwise, fullmesh, skew, staged or ll", name)
		}
		cands = append(cands, a)
	}
	return cands, nil
}

// plannable reports whether plan can print a's schedule: auto is a choice,
// not a schedule.
func plannable(a algo.Algo) bool {
	switch a {
	case algo.AlgoPairwise, algo.AlgoFullmesh, algo.AlgoSkew, algo.AlgoStaged, algo.AlgoLL:
		return true
	}
	return false
}

// planner is a validated a2ad plan command line and what every size's plans
// share: the job's layout over hosts and machines and the LL cutoffs.
type planner struct {
	planFlags
	links algo.Links
	sizes []int
	dist  dist
	cands []algo.Algo

	hostOf       []int // host of each rank
	machineOf    []int // machine of each rank; nil unless --machines and --cores
	machineCores []int // cores of each machine; nil with machineOf
	// The LL cutoffs a Comm plans pairwise and fullmesh with under auto
	// (the printed rank's view; every pair quiet, as under auto).
	llLocal, llRemote int
	autoCut           []int
	autoQuiet         []bool
	llCut             []int // LL cutoff of the ll candidate: every peer but the printed rank

	chooser algo.Chooser
	s       algo.Schedule
}

// newPlanner parses and checks plan's command line and lays out the job.
func newPlanner(args []string) (*planner, error) {
	p := &planner{}
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	p.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return nil, usageError{err}
	}
	var err error
	if p.links, err = planLinks(p.planFlags); err != nil {
		return nil, usageError{err}
	}
	if p.sizes, err = parseSizes(p.sizeSpec); err != nil {
		return nil, usageError{err}
	}
	if p.dist, err = parseDist(p.distSpec); err != nil {
		return nil, usageError{err}
	}
	if err := p.validate(); err != nil {
		return nil, err
	}
	if p.cands, err = planCandidates(p.algos); err != nil {
		return nil, err
	}
	p.layOut()
	p.setCutoffs()
	return p, nil
}

// layOut places the ranks on hosts, consecutive ranks per host, and the
// hosts on machines when --machines and --cores crowd them.
func (p *planner) layOut() {
	p.hostOf = make([]int, p.n)
	for r := range p.hostOf {
		p.hostOf[r] = r * p.hosts / p.n
	}
	if p.machines == 0 || p.cores == 0 {
		return
	}
	p.machineOf, p.machineCores = make([]int, p.n), make([]int, p.machines)
	for r := range p.machineOf {
		p.machineOf[r] = p.hostOf[r] * p.machines / p.hosts
	}
	for m := range p.machineCores {
		p.machineCores[m] = p.cores
	}
}

// setCutoffs computes the printed rank's LL cutoffs under auto and those of
// the ll candidate from --ll-bytes, as a Comm does from A2A_LL_BYTES: each
// pair's data plane caps the setting at its slot; forced ll uses the
// default when the setting turns LL off.
func (p *planner) setCutoffs() {
	p.llLocal = pairLLCutoff(p.links.LocalClass, p.llBytes)
	p.llRemote = pairLLCutoff(p.links.RemoteClass, p.llBytes)
	forced := max(p.llBytes, 0)
	p.autoCut, p.autoQuiet = make([]int, p.n), make([]bool, p.n)
	p.llCut = make([]int, p.n)
	for j := range p.autoCut {
		p.autoCut[j], p.autoQuiet[j] = p.llLocal, true
		p.llCut[j] = pairLLCutoff(p.links.LocalClass, forced)
		if p.hostOf[j] != p.hostOf[p.rank] {
			p.autoCut[j] = p.llRemote
			p.llCut[j] = pairLLCutoff(p.links.RemoteClass, forced)
		}
	}
	if p.llLocal < 0 {
		p.autoCut, p.autoQuiet = nil, nil // no pair uses LL
	} else {
		p.autoCut[p.rank] = -1
	}
	p.llCut[p.rank] = -1
}

// planTraffic is one size's traffic: the matrix and the printed rank's row
// and column of it.
type planTraffic struct {
	size       int
	m          []int
	send, recv []int
}

// printSize prints the plans of one size: the header with auto's pick, each
// candidate's schedule and estimate, and the lower bounds.
func (p *planner) printSize(size int) error {
	start := time.Now()
	n, rank := p.n, p.rank
	t := planTraffic{size: size, m: p.dist.matrix(n, size, p.seed), send: make([]int, n), recv: make([]int, n)}
	for j := range n {
		t.send[j], t.recv[j] = t.m[rank*n+j], t.m[j*n+rank]
	}
	// The one rule auto selection runs in a Comm, on the same inputs.
	priced, chosen := p.chooser.Price(algo.ChoiceArgs{World: n, Streams: p.streams, Window: p.window, Matrix: t.m, Hosts: p.hostOf, Links: p.links, Machines: p.machineOf, Cores: p.machineCores,
		LLLocal: p.llLocal, LLRemote: p.llRemote})
	p.printHeader(size, chosen)
	for _, a := range p.cands {
		if err := p.printCandidate(a, candidate(priced, a), chosen, t); err != nil {
			return err
		}
	}
	fmt.Printf("lower bound %10.1f us (busiest rank's bytes at full bandwidth; across hosts, or the busiest host's over its ranks' remote links)\n", algo.LowerBoundAllToAllVHosts(t.m, p.hostOf, p.links)*1e6)
	if p.machineOf != nil {
		fmt.Printf("lower bound %10.1f us on crowded machines (every byte copied at each end over the machine's cores)\n", algo.LowerBoundCrowded(t.m, p.hostOf, p.machineOf, p.machineCores, p.links)*1e6)
	}
	fmt.Printf("# planned in %v\n", time.Since(start).Round(time.Microsecond))
	return nil
}

// printHeader prints the line that opens a size's plans.
func (p *planner) printHeader(size int, chosen algo.Algo) {
	links := p.links
	ll := "off"
	if p.llLocal >= 0 {
		ll = fmt.Sprintf("%s:%d,%s:%d", links.LocalClass, p.llLocal, links.RemoteClass, p.llRemote)
	}
	fmt.Printf("# plan n=%d size=%d dist=%s streams=%d window=%d hosts=%d%s links local(%s) alpha=%.1fus beta=%.2fGB/s remote(%s) alpha=%.1fus beta=%.2fGB/s ll=%s: auto picks %s\n",
		p.n, size, p.dist, p.streams, p.window, p.hosts, crowdNote(p.machines, p.cores), links.LocalClass, links.Local.Alpha*1e6, 1/links.Local.Beta/1e9,
		links.RemoteClass, links.Remote.Alpha*1e6, 1/links.Remote.Beta/1e9, ll, chosen)
}

// candidate is a's entry among the priced candidates; the zero Candidate
// (no estimate, not left out) when auto does not price a, as ll.
func candidate(priced []algo.Candidate, a algo.Algo) algo.Candidate {
	var cand algo.Candidate
	for _, c := range priced {
		if c.Algo == a {
			cand = c
		}
	}
	return cand
}

// printCandidate prints why auto leaves a out, or a's estimate and schedule.
func (p *planner) printCandidate(a algo.Algo, cand algo.Candidate, chosen algo.Algo, t planTraffic) error {
	if cand.Why != "" {
		fmt.Printf("%-9s left out by auto: %s\n", a, cand.Why)
		return nil
	}
	if err := p.schedule(a, t); err != nil {
		return err
	}
	est, note := cand.Estimate, ""
	if a == algo.AlgoLL {
		cut := pairLLCutoff(p.links.LocalClass, max(p.llBytes, 0))
		if p.hosts > 1 {
			cut = pairLLCutoff(p.links.RemoteClass, max(p.llBytes, 0)) // priced with the remote link, as Flat
		}
		est = algo.EstimateLL(t.m, p.n, p.streams, p.window, cut, p.links.Flat(p.hosts))
		note = " (forced only: under auto every algorithm sends blocks up to a pair's LL cutoff one-sided)"
	}
	if a == chosen {
		note = " <- auto"
	}
	fmt.Printf("%-9s estimated %10.1f us, %d rounds, %d steps on rank %d%s\n", a, est*1e6, p.s.NumRounds(), len(p.s.Steps), p.rank, note)
	if p.rounds != 0 {
		printRounds(p.s.String(), p.rounds)
	}
	return nil
}

// schedule plans a's schedule of the printed rank into p.s.
func (p *planner) schedule(a algo.Algo, t planTraffic) error {
	args := algo.AllToAllVArgs{Rank: p.rank, World: p.n, SendCounts: t.send, RecvCounts: t.recv, Streams: p.streams, Window: p.window,
		LLCutoff: p.autoCut, LLQuiet: p.autoQuiet}
	switch a {
	case algo.AlgoPairwise:
		return algo.PlanPairwise(&p.s, args)
	case algo.AlgoFullmesh:
		return algo.PlanFullmesh(&p.s, args)
	case algo.AlgoSkew:
		return algo.PlanSkew(&p.s, algo.SkewArgs{Rank: p.rank, World: p.n, Matrix: t.m, Streams: p.streams, Window: 1})
	case algo.AlgoLL:
		args.LLCutoff, args.LLQuiet = p.llCut, nil
		return algo.PlanLL(&p.s, args)
	case algo.AlgoStaged:
		return algo.PlanStaged(&p.s, algo.StagedArgs{Rank: p.rank, World: p.n, Matrix: t.m, Hosts: p.hostOf, Streams: p.streams})
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
