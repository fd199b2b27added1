package main

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/internal/launch"
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
	fs.StringVar(&f.alloc, "alloc", "huge", "send and receive buffers: huge (a2a.AllocBuffer: 2 MiB aligned, transparent huge pages) | heap (make)")
	fs.StringVar(&f.cpuprof, "cpuprofile", "", "write each rank's CPU profile to FILE.rankN (go tool pprof)")
	fs.StringVar(&f.bind, "bind", "core", "core: one core per rank as mpirun binds (unless oversubscribed) | none")
}

// The values of --algo (the AllToAllV algorithms of A2A_ALGO) and
// --transport (A2A_TRANSPORT).
var (
	benchAlgos      = []string{"auto", "pairwise", "fullmesh", "staged", "skew", "ll"}
	benchTransports = transportNames()
)

// transportNames is auto and the names of a2a's default data planes.
func transportNames() []string {
	names := []string{"auto"}
	for _, p := range a2a.DefaultProviders(a2a.Config{}) {
		names = append(names, p.Name())
	}
	return names
}

// benchHelp closes `a2ad bench -h`.
const benchHelp = `Each row is one size, with nccl-tests' columns:
  size    bytes: per peer block for alltoallv, alltoall, allgather, gather and
          scatter; the buffer each rank passes for the others (rounded down to
          whole elements, and for reducescatter to n blocks)
  count   elements of the type a rank moves in all (nccl-tests' count)
  type    the element type (-d); redop (-o) and root (-r) are "none" and -1
          for ops without them
  algo    the algorithm a2a picked for the last call; with --algo all,
          auto>ALGO for the automatic choice, then one row per forced
          algorithm (staged needs equal ranks on several hosts, and falls
          back to fullmesh), and a comment line comparing auto to the best
  avg_us, p50_us, p99_us
          the slowest rank's time per call over the timed calls
  algbw   bytes moved by a rank (count elements) over the average time
  busbw   algbw times nccl-tests' factor: 2(n-1)/n for allreduce, 1 for
          broadcast and reduce, (n-1)/n for the others
  #wrong  elements found wrong by --check over all ranks (N/A without it)
--json prints the same fields, one object per row (wrong is null without
--check).
`

// benchRow is one line of output; the JSON keys are a stable interface
// (scripts/compare-mpi.sh reads size, p50_us and algo).
type benchRow struct {
	Op    string  `json:"op"`
	Algo  string  `json:"algo"`
	Ranks int     `json:"ranks"`
	Size  int     `json:"size"`
	Count int     `json:"count"` // elements of Type, as nccl-tests counts them
	Type  string  `json:"type"`
	Redop string  `json:"redop"` // "none" unless the op reduces
	Root  int     `json:"root"`  // -1 unless the op has a root
	Avg   float64 `json:"avg_us"`
	P50   float64 `json:"p50_us"`
	P99   float64 `json:"p99_us"`
	AlgBW float64 `json:"algbw_gbps"`
	BusBW float64 `json:"busbw_gbps"`
	Wrong *int    `json:"wrong"` // wrong elements over all ranks; null without --check
	Check string  `json:"check"` // ok, fail, or skip without --check
	// Forced is the algorithm --algo all set for this row ("auto" for the
	// automatic choice); absent otherwise.
	Forced string `json:"forced,omitempty"`
}

// wrongText is the #wrong column: N/A without --check, as nccl-tests prints.
func (r benchRow) wrongText() string {
	if r.Wrong == nil {
		return "N/A"
	}
	return strconv.Itoa(*r.Wrong)
}

// cmdBench measures one collective, nccl-tests style: as the launcher it
// starts the ranks, each a copy of itself with --worker that measures and,
// on rank 0, prints the rows.
func cmdBench(ctx context.Context, log *slog.Logger, args []string) error {
	f, sizes, d, err := parseBench(args)
	if err != nil {
		return err
	}
	if f.worker {
		return benchWorker(ctx, log, f, sizes, d)
	}
	if f.n < 1 {
		return usagef("-n %d: need at least one rank", f.n)
	}
	if f.bind != "core" && f.bind != "none" {
		return usagef("--bind %q: core or none", f.bind)
	}
	var env []string
	if f.trans != "" {
		env = append(env, "A2A_TRANSPORT="+f.trans)
	}
	return launchSelf(ctx, log, "bench", args, launch.Spec{N: f.n, NATSURL: f.nats, BindVia: bindVia(f.bind), Env: env})
}

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

// benchWorker is one rank of the benchmark: it joins the job, measures every
// size and, on rank 0, prints the rows.
func benchWorker(ctx context.Context, log *slog.Logger, f benchFlags, sizes []int, d dist) error {
	c, err := joinWorker(ctx, log, f.configure)
	if err != nil {
		return err
	}
	defer c.Close()
	rank, n := c.Rank(), c.Size()
	if f.cpuprof != "" {
		stop, err := startProfile(fmt.Sprintf("%s.rank%d", f.cpuprof, rank))
		if err != nil {
			return err
		}
		defer stop()
	}
	if f.root >= n {
		return usagef("--root %d: not a rank of %d", f.root, n)
	}
	if rank == 0 && !f.json {
		printBenchHeader(c, f, d)
	}
	b := newBench(c, f)
	for _, size := range sizes {
		measureSize := b.measureSize
		if f.algo == "all" {
			measureSize = b.compareAlgos
		}
		if err := measureSize(ctx, size, d); err != nil {
			return err
		}
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

// printBenchHeader prints the comment lines that open the text output: the
// run's settings and the column names.
func printBenchHeader(c *a2a.Comm, f benchFlags, d dist) {
	spin, yield := c.WaitPolicy()
	fmt.Printf("# a2ad bench op=%s ranks=%d dist=%s counts=%s streams=%d window=%d seed=%d transport=%s spin=%v yield=%v timing=%s alloc=%s\n",
		f.op, c.Size(), d, f.counts, c.Config().Streams, c.Config().Window, f.seed, c.TransportName(), spin, yield, f.timing, f.alloc)
	fmt.Printf("# %10s %12s %8s %6s %5s %-12s %10s %10s %10s %11s %11s %7s\n",
		"size", "count", "type", "redop", "root", "algo", "avg_us", "p50_us", "p99_us", "algbw_GB/s", "busbw_GB/s", "#wrong")
}

// measureSize measures one size under the Comm's own algorithm setting and
// prints its row.
func (b *bench) measureSize(ctx context.Context, size int, d dist) error {
	row, err := b.point(ctx, size, d)
	if err != nil {
		return fmt.Errorf("size %d, algo %s: %w", size, cmp.Or(b.f.algo, "default"), err)
	}
	return b.report(size, row)
}

// compareAlgos measures one size under auto and then each forced algorithm
// (--algo all), prints their rows and a comment line comparing auto to the
// best forced one.
func (b *bench) compareAlgos(ctx context.Context, size int, d dist) error {
	c := b.c
	// An untimed first point at each size: the first algorithm measured
	// there otherwise pays what its warm-up iterations do not cover (TCP
	// windows and buffers growing, ranks settling on their cores), and
	// auto, which goes first, would be compared with forced algorithms
	// that did not pay it.
	if err := c.SetAlgo(benchAlgos[0]); err != nil {
		return err
	}
	if _, err := b.point(ctx, size, d); err != nil {
		return fmt.Errorf("size %d, warm-up: %w", size, err)
	}
	var auto, best benchRow
	for _, a := range benchAlgos { // auto first
		if err := c.SetAlgo(a); err != nil {
			return err
		}
		row, err := b.point(ctx, size, d)
		if err != nil {
			return fmt.Errorf("size %d, algo %s: %w", size, a, err)
		}
		row.Forced = a
		if a == "auto" {
			auto = row
			row.Algo = "auto>" + row.Algo
		} else if best.Forced == "" || row.P50 < best.P50 {
			best = row
		}
		if err := b.report(size, row); err != nil {
			return err
		}
	}
	if c.Rank() == 0 && !b.f.json {
		fmt.Printf("# size %d: auto ran %s, p50 %.2f us; best forced %s, p50 %.2f us; auto/best %.2f\n",
			size, auto.Algo, auto.P50, best.Forced, best.P50, auto.P50/best.P50)
	}
	return nil
}

// report prints a row on rank 0 and fails when --check found wrong
// elements.
func (b *bench) report(size int, row benchRow) error {
	if b.c.Rank() == 0 {
		printRow(b.f.json, row)
	}
	if row.Check == "fail" {
		return fmt.Errorf("size %d: %d elements of the results are wrong", size, *row.Wrong)
	}
	return nil
}

// startProfile starts a CPU profile into path; stop ends it and closes
// the file.
func startProfile(path string) (stop func(), err error) {
	out, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		out.Close()
	}, nil
}

func printRow(asJSON bool, row benchRow) {
	if asJSON {
		out, _ := json.Marshal(row)
		fmt.Println(string(out))
		return
	}
	fmt.Printf("  %10d %12d %8s %6s %5d %-12s %10.2f %10.2f %10.2f %11.3f %11.3f %7s\n", row.Size, row.Count, row.Type, row.Redop, row.Root,
		row.Algo, row.Avg, row.P50, row.P99, row.AlgBW, row.BusBW, row.wrongText())
}

// bench holds one rank's reusable benchmark state.
type bench struct {
	c            *a2a.Comm
	f            benchFlags
	one, gather  []int
	send, recv   []byte
	stamps       []int64 // start and end (Unix ns) of each timed call
	gatherSend   []byte
	gatherRecv   []byte
	agreeS       []byte
	agreeR       []byte
	sendC, recvC []int
	learned      []int // receive counts learned by --counts nats|inband
	matrix       []int
	known        []int // the traffic matrix of the current size
	dtype        reduce.DType
	redop        reduce.Op
	want         []byte // a reduction's correct result
	scratch      []byte
}

// newBench sets up a rank's benchmark; f has been validated by cmdBench.
func newBench(c *a2a.Comm, f benchFlags) *bench {
	n := c.Size()
	b := &bench{c: c, f: f, one: make([]int, n), gather: make([]int, n),
		agreeS: make([]byte, 8*n), agreeR: make([]byte, 8*n), sendC: make([]int, n), recvC: make([]int, n),
		learned: make([]int, n), matrix: make([]int, n*n)}
	b.dtype, _ = parseDType(f.dtype, f.op)
	b.redop, _ = parseRedop(f.redop)
	return b
}

// barrier synchronises the ranks before a timed call, as the MPI harness
// does with MPI_Barrier.
func (b *bench) barrier(ctx context.Context) error { return b.c.Barrier(ctx) }

func (b *bench) call(ctx context.Context) error {
	if b.f.op == "alltoall" {
		return b.c.AllToAll(ctx, b.send, b.recv)
	}
	switch b.f.counts {
	case "nats":
		if err := b.c.ExchangeCountsMatrix(ctx, b.sendC, b.learned, b.matrix); err != nil {
			return err
		}
		return b.c.AllToAllV(ctx, b.send, b.sendC, b.recv, b.learned)
	case "inband":
		return b.c.AllToAllVInBand(ctx, b.send, b.sendC, b.recv, b.learned)
	case "matrix":
		return b.c.AllToAllVMatrix(ctx, b.send, b.recv, b.known)
	}
	return b.c.AllToAllV(ctx, b.send, b.sendC, b.recv, b.recvC)
}

// agreeMin makes every rank use the smallest of the ranks' values.
func (b *bench) agreeMin(ctx context.Context, v int) (int, error) {
	n := b.c.Size()
	for j := range n {
		binary.LittleEndian.PutUint64(b.agreeS[8*j:], uint64(v))
	}
	if err := b.c.AllToAll(ctx, b.agreeS, b.agreeR); err != nil {
		return 0, err
	}
	for j := range n {
		v = min(v, int(binary.LittleEndian.Uint64(b.agreeR[8*j:])))
	}
	return v, nil
}

func (b *bench) point(ctx context.Context, size int, d dist) (benchRow, error) {
	n, rank, es := b.c.Size(), b.c.Rank(), b.dtype.Size()
	row := benchRow{Op: b.f.op, Ranks: n, Type: b.dtype.String(), Redop: "none", Root: -1, Check: "skip"}
	if reduction(b.f.op) {
		row.Redop = b.redop.String()
	}
	if rooted(b.f.op) {
		row.Root = b.f.root
	}
	var op collective
	if b.f.op == "alltoallv" || b.f.op == "alltoall" {
		size -= size % es
		b.setupAllToAll(size, d)
		op = collective{call: b.call, algBytes: n * size, size: size,
			wrong: func() int { return wrongRecv(b.recv, rank, b.recvC, es) }}
	} else {
		var err error
		if op, err = b.collectiveFor(size); err != nil {
			return row, err
		}
	}
	if b.f.op == "barrier" {
		row.Type = "none"
	}
	row.Size, row.Count = op.size, op.algBytes/es
	return b.measure(ctx, row, op)
}

// setupAllToAll lays out the send and receive buffers of the counts matrix,
// in whole elements: the matrix of size/es elements per peer, in bytes.
func (b *bench) setupAllToAll(size int, d dist) {
	n, rank, es := b.c.Size(), b.c.Rank(), b.dtype.Size()
	m := d.matrix(n, size/es, b.f.seed)
	for i := range m {
		m[i] *= es
	}
	b.known = m
	sendTotal, recvTotal := 0, 0
	for j := range n {
		b.sendC[j], b.recvC[j] = m[rank*n+j], m[j*n+rank]
		sendTotal += b.sendC[j]
		recvTotal += b.recvC[j]
	}
	b.send = b.data(b.send, sendTotal)
	b.recv = b.data(b.recv, recvTotal)
	fillSend(b.send, rank, b.sendC)
}

// measure times op: a verified first call with --check, warm-up, then timed
// iterations each after a barrier; rank 0 gathers every rank's times and
// reports the slowest rank of each iteration.
func (b *bench) measure(ctx context.Context, row benchRow, op collective) (benchRow, error) {
	wrong, err := b.firstCall(ctx, op)
	if err != nil {
		return row, err
	}
	iters, err := b.warmUp(ctx, op)
	if err != nil {
		return row, err
	}
	if err := b.timeCalls(ctx, op, iters); err != nil {
		return row, err
	}
	row.Algo = b.c.LastAlgo()
	if row.Algo == "" {
		row.Algo = "-" // keeps the columns of the text rows
	}
	if b.f.check && wrong == 0 {
		wrong = op.wrong() // the last timed call's result
	}
	if err := b.gatherStamps(ctx, iters, wrong); err != nil {
		return row, err
	}
	if b.c.Rank() != 0 {
		return row, nil
	}
	return b.summarize(row, op, iters), nil
}

// firstCall makes, with --check, an untimed first call into a receive
// buffer filled with garbage and counts the wrong elements of its result.
func (b *bench) firstCall(ctx context.Context, op collective) (wrong int, err error) {
	if !b.f.check {
		return 0, nil
	}
	for i := range b.recv {
		b.recv[i] = 0xEE
	}
	if err := op.call(ctx); err != nil {
		return 0, err
	}
	return op.wrong(), nil
}

// warmUp makes the warm-up calls and returns the timed iterations every
// rank agrees on: --iters, fewer (at least 20) when the warm-up calls say
// they would overrun --budget.
func (b *bench) warmUp(ctx context.Context, op collective) (iters int, err error) {
	t0 := time.Now()
	for range b.f.warmup {
		if err := op.call(ctx); err != nil {
			return 0, err
		}
	}
	iters = b.f.iters
	if b.f.warmup > 0 {
		mean := time.Since(t0) / time.Duration(b.f.warmup)
		if mean > 0 {
			iters = max(20, min(iters, int(b.f.budget/mean)))
		}
	}
	return b.agreeMin(ctx, iters)
}

// timeCalls makes the timed calls, each after a barrier, and records their
// start and end in b.stamps.
func (b *bench) timeCalls(ctx context.Context, op collective, iters int) error {
	b.stamps = b.stamps[:0]
	for range iters {
		if err := b.barrier(ctx); err != nil {
			return err
		}
		start := time.Now()
		if err := op.call(ctx); err != nil {
			return err
		}
		end := time.Now()
		// Wall-clock stamps, for --timing span across ranks; the duration
		// itself comes from the monotonic clock.
		b.stamps = append(b.stamps, start.UnixNano(), start.UnixNano()+end.Sub(start).Nanoseconds())
	}
	return nil
}

// gatherStamps gathers every rank's per-iteration start and end stamps (and
// its count of wrong elements) into rank 0's b.gatherRecv.
func (b *bench) gatherStamps(ctx context.Context, iters, wrong int) error {
	n, rank := b.c.Size(), b.c.Rank()
	per := stampBlock(iters)
	b.gatherSend = grow(b.gatherSend, per)
	for i, t := range b.stamps {
		binary.LittleEndian.PutUint64(b.gatherSend[8*i:], uint64(t))
	}
	binary.LittleEndian.PutUint64(b.gatherSend[16*iters:], uint64(wrong))
	for j := range n {
		b.one[j], b.gather[j] = 0, 0
		if rank == 0 {
			b.gather[j] = per
		}
	}
	b.one[0] = per
	b.gatherRecv = grow(b.gatherRecv, n*per)
	return b.c.AllToAllV(ctx, b.gatherSend, b.one, b.gatherRecv[:len(b.gatherRecv)], b.gather)
}

// stampBlock is the size of a rank's block in the gathered stamps: the
// start and end of each of its iters calls, then its wrong elements.
func stampBlock(iters int) int { return 16*iters + 8 }

// summarize fills in row's times, bandwidths and check from the gathered
// stamps, on rank 0.
func (b *bench) summarize(row benchRow, op collective, iters int) benchRow {
	slowest, wrong := b.iterationTimes(iters)
	slices.Sort(slowest)
	sum := 0.0
	for _, t := range slowest {
		sum += t
	}
	row.Avg = math.Round(sum/float64(max(iters, 1))*1e3) / 1e3 // ns, as the others
	row.P50 = percentile(slowest, 0.50)
	row.P99 = percentile(slowest, 0.99)
	if row.Avg > 0 {
		// Over the average time, as nccl-tests.
		row.AlgBW = float64(op.algBytes) / (row.Avg * 1e3) // bytes per ns = GB/s
		row.BusBW = row.AlgBW * busFactor(b.f.op, b.c.Size())
	}
	if b.f.check {
		row.Wrong, row.Check = &wrong, "ok"
		if wrong > 0 {
			row.Check = "fail"
		}
	}
	return row
}

// iterationTimes reads the gathered stamps: the time of each iteration in
// us, the slowest rank's call, or with --timing span the last start to the
// last end over all ranks; and the wrong elements over all ranks.
func (b *bench) iterationTimes(iters int) (times []float64, wrong int) {
	per := stampBlock(iters)
	span := b.f.timing == "span"
	slowest := make([]float64, iters)
	var lastStart, lastEnd []int64
	if span {
		lastStart, lastEnd = make([]int64, iters), make([]int64, iters)
	}
	for r := range b.c.Size() {
		block := b.gatherRecv[r*per:]
		for i := range iters {
			start := int64(binary.LittleEndian.Uint64(block[16*i:]))
			end := int64(binary.LittleEndian.Uint64(block[16*i+8:]))
			switch {
			case !span:
				slowest[i] = max(slowest[i], float64(end-start)/1e3)
			default:
				lastStart[i], lastEnd[i] = max(lastStart[i], start), max(lastEnd[i], end)
			}
		}
		wrong += int(binary.LittleEndian.Uint64(block[16*iters:]))
	}
	if span {
		for i := range iters {
			slowest[i] = float64(max(lastEnd[i]-lastStart[i], 0)) / 1e3
		}
	}
	return slowest, wrong
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// data resizes a send or receive buffer: from a2a.AllocBuffer (the old one
// freed) unless --alloc heap. Only this method allocates b.send and b.recv,
// so the old buffer's origin is known.
func (b *bench) data(old []byte, n int) []byte {
	if b.f.alloc == "heap" {
		return grow(old, n)
	}
	if cap(old) >= n {
		return old[:n]
	}
	if cap(old) > 0 {
		if err := a2a.FreeBuffer(old); err != nil {
			panic(err) // a bug: old came from AllocBuffer
		}
	}
	buf, err := a2a.AllocBuffer(n)
	if err != nil {
		panic(fmt.Sprintf("bench: %d-byte buffer: %v", n, err))
	}
	return buf
}

// grow returns b resized to n bytes; it allocates (dropping the contents) only
// when b's capacity is short, so the timed loops reuse their buffers.
func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}
