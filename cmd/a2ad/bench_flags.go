package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/algo"
)

// benchFlags are shared by the launcher and its worker ranks.
type benchFlags struct {
	op      string
	dtype   string
	redop   string
	root    int
	n       int
	algo    string
	sizes   string
	dist    string
	iters   int
	warmup  int
	settle  time.Duration
	budget  time.Duration
	check   bool
	json    bool
	nats    string
	seed    uint64
	streams int
	window  int
	worker  bool
	bind    string
	counts  string
	trans   string
	timing  string
	cpuprof string
	alloc   string
	// persistent measures the persistent form (AllToAllVInit,
	// AllReduceInit: a Start and a Wait per call).
	persistent bool
	// overlap is the off-CPU work (a device kernel's time) each
	// nonblocking call overlaps (--overlap).
	overlap time.Duration
}

func (f *benchFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.op, "op", "alltoallv", "collective: "+oneOf(benchOpNames))
	fs.StringVar(&f.dtype, "dtype", "", "element type: "+oneOf(dtypeNames)+" (default: float32 for the reductions, as nccl-tests; uint8 for the others)")
	fs.StringVar(&f.dtype, "d", "", "short for --dtype")
	fs.StringVar(&f.redop, "redop", "sum", "reduction of allreduce, reduce and reducescatter: "+oneOf(redopNames))
	fs.StringVar(&f.redop, "o", "sum", "short for --redop")
	fs.IntVar(&f.root, "root", 0, "root rank of broadcast, reduce, gather and scatter")
	fs.IntVar(&f.root, "r", 0, "short for --root")
	fs.IntVar(&f.n, "n", 2, "ranks")
	fs.StringVar(&f.algo, "algo", "", "AllToAllV algorithm: "+oneOf(benchAlgos)+", or all: auto and then each forced one at every size, with how auto compares to the best (default: A2A_ALGO, else auto)")
	fs.StringVar(&f.sizes, "sizes", "8:1M", "per-peer bytes: MIN:MAX (x2 steps) or a comma list")
	fs.StringVar(&f.dist, "dist", "uniform", "traffic: uniform | zipf:S | lognormal:SIGMA | hot:F")
	fs.IntVar(&f.iters, "iters", 1000, "maximum timed iterations per size")
	fs.IntVar(&f.warmup, "warmup", 20, "warm-up iterations per size")
	fs.DurationVar(&f.settle, "settle", 0, "untimed calls of the first size for this long before it is measured: fresh ranks can run slower for their first ~0.2 s (make compare gives the MPIs the same)")
	fs.DurationVar(&f.budget, "budget", 1500*time.Millisecond, "time budget per size: fewer iterations (>= 20) for slow sizes")
	fs.BoolVar(&f.check, "check", false, "verify every received element (#wrong counts the wrong ones, N/A without --check); exit non-zero on a mismatch")
	fs.BoolVar(&f.json, "json", false, "one JSON object per row")
	fs.StringVar(&f.nats, "nats", "", "join through this NATS server instead of an embedded one")
	fs.Uint64Var(&f.seed, "seed", 12345, "seed of the traffic matrix (same on every rank)")
	fs.IntVar(&f.streams, "streams", 0, fmt.Sprintf("connections per peer pair (default: A2A_STREAMS or %d)", a2a.DefaultStreams))
	fs.IntVar(&f.window, "window", 0, fmt.Sprintf("fullmesh peers in flight (default: A2A_WINDOW or %d)", algo.DefaultWindow))
	fs.BoolVar(&f.worker, "worker", false, "internal: run as one rank of the benchmark")
	fs.StringVar(&f.counts, "counts", "known", "alltoallv receive counts: known (given) | matrix (AllToAllVMatrix with the global matrix: staged/skew-aware choice) | nats (ExchangeCountsMatrix each call) | inband (AllToAllVInBand)")
	fs.StringVar(&f.trans, "transport", "", "data plane: auto (shm on one host, verbs to others where both have an RDMA port, else tcp) | shm | verbs | tcp (default: A2A_TRANSPORT or auto)")
	fs.StringVar(&f.timing, "timing", "barrier", "barrier: per-rank time after a barrier, slowest rank (as the MPI harness) | span: last rank's start to last rank's end (ranks must share a clock: one machine, e.g. the test bed), which leaves out the barrier's exit skew")
	fs.StringVar(&f.alloc, "alloc", "huge", "send and receive buffers: huge (a2a.AllocBuffer: registered, shareable memfd, 2 MiB aligned; shm peers map it) | heap (make: unregistered)")
	fs.StringVar(&f.cpuprof, "cpuprofile", "", "write each rank's CPU profile to FILE.rankN (go tool pprof)")
	fs.BoolVar(&f.persistent, "persistent", false, "alltoallv (--counts known) and allreduce: the persistent form, planned once (AllToAllVInit, AllReduceInit), a Start and a Wait per call")
	fs.DurationVar(&f.overlap, "overlap", 0, "alltoallv (--counts known): IAllToAllV, then this long off the CPU (blocked in a system call, as a thread waiting for a device kernel), then Wait; compare with the time of each alone")
	fs.StringVar(&f.bind, "bind", "core", "core: one core per rank as mpirun binds (unless oversubscribed) | none")
}

// The values of --algo (the AllToAllV algorithms of A2A_ALGO) and
// --transport (A2A_TRANSPORT).
var (
	benchAlgos      = []string{"auto", "pairwise", "fullmesh", "staged", "skew", "ll"}
	benchTransports = transportNames()
)

// parseBench parses and checks the flags the launcher and its workers share.
func parseBench(args []string) (benchFlags, []int, dist, error) {
	var f benchFlags
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return f, nil, dist{}, usageError{err}
	}
	sizes, err := parseSizes(f.sizes)
	if err != nil {
		return f, nil, dist{}, usageError{err}
	}
	d, err := parseDist(f.dist)
	if err != nil {
		return f, nil, dist{}, usageError{err}
	}
	if err := f.validateChoices(); err != nil {
		return f, nil, dist{}, err
	}
	if err := f.validateCallForm(); err != nil {
		return f, nil, dist{}, err
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if err := f.validateForOp(d, set); err != nil {
		return f, nil, dist{}, err
	}
	return f, sizes, d, nil
}

// validateChoices checks the flags that take one of a list of values.
func (f *benchFlags) validateChoices() error {
	if !slices.Contains(benchOpNames, f.op) {
		return usagef("unknown --op %q: valid ops are %s", f.op, strings.Join(benchOpNames, ", "))
	}
	if f.alloc != "huge" && f.alloc != "heap" {
		return usagef("--alloc %q: huge or heap", f.alloc)
	}
	if f.timing != "barrier" && f.timing != "span" {
		return usagef("--timing %q: barrier or span", f.timing)
	}
	if f.counts != "known" && f.counts != "matrix" && f.counts != "nats" && f.counts != "inband" {
		return usagef("--counts %q: known, matrix, nats or inband", f.counts)
	}
	if f.algo != "" && f.algo != "all" && !slices.Contains(benchAlgos, f.algo) {
		return usagef("--algo %q: %s or all", f.algo, strings.Join(benchAlgos, ", "))
	}
	if f.algo == "all" && f.op != "alltoallv" && f.op != "alltoall" {
		return usagef("--algo all: the algorithms are alltoallv's and alltoall's, not %s's", f.op)
	}
	if f.trans != "" && !slices.Contains(benchTransports, f.trans) {
		return usagef("--transport %q: %s", f.trans, strings.Join(benchTransports, ", "))
	}
	return nil
}

// validateCallForm checks the flags that change how each call is made:
// --persistent and --overlap.
func (f *benchFlags) validateCallForm() error {
	if f.persistent && !(f.op == "alltoallv" && f.counts == "known" || f.op == "allreduce") {
		return usagef("--persistent: alltoallv with --counts known, or allreduce, not %s", f.op)
	}
	if f.overlap != 0 && (f.op != "alltoallv" || f.counts != "known" || f.persistent || f.overlap < 0) {
		return usagef("--overlap %v: a positive duration, for alltoallv with --counts known, not with --persistent", f.overlap)
	}
	return nil
}

// validateForOp checks the flags that only some ops take: the traffic
// distribution, the element type, the reduction and the root. set holds
// the flags given on the command line.
func (f *benchFlags) validateForOp(d dist, set map[string]bool) error {
	if f.op != "alltoallv" && d.kind != "uniform" {
		return usagef("--op %s moves equal blocks: --dist must be uniform", f.op)
	}
	if _, err := parseDType(f.dtype, f.op); err != nil {
		return usageError{err}
	}
	if _, err := parseRedop(f.redop); err != nil {
		return usageError{err}
	}
	switch {
	case (set["d"] || set["dtype"]) && f.op == "barrier":
		return usagef("--dtype: barrier moves no data")
	case (set["o"] || set["redop"]) && !reduction(f.op):
		return usagef("--redop: %s does not reduce (allreduce, reduce and reducescatter do)", f.op)
	case (set["r"] || set["root"]) && !rooted(f.op):
		return usagef("--root: %s has no root (broadcast, reduce, gather and scatter do)", f.op)
	case f.root < 0 || !f.worker && f.root >= f.n:
		return usagef("--root %d: not a rank of %d", f.root, f.n)
	}
	return nil
}

// configure sets what the flags override in a worker's configuration.
func (f *benchFlags) configure(cfg *a2a.Config) {
	if f.algo != "" && f.algo != "all" {
		cfg.Algo = f.algo
	}
	if f.streams > 0 {
		cfg.Streams = f.streams
	}
	if f.window > 0 {
		cfg.Window = f.window
	}
}

// transportNames is auto and the names of a2a's default data planes.
func transportNames() []string {
	names := []string{"auto"}
	for _, p := range a2a.DefaultProviders(a2a.Config{}) {
		names = append(names, p.Name())
	}
	return names
}
