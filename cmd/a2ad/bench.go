package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/internal/launch"
)

// benchFlags are shared by the launcher and its worker ranks.
type benchFlags struct {
	op      string
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
	alloc   string
}

func (f *benchFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.op, "op", "alltoallv", "collective: "+oneOf(benchOpNames))
	fs.IntVar(&f.n, "n", 2, "ranks")
	fs.StringVar(&f.algo, "algo", "", "AllToAllV algorithm: "+oneOf(benchAlgos)+" (default: A2A_ALGO, else auto)")
	fs.StringVar(&f.sizes, "sizes", "8:1M", "per-peer bytes: MIN:MAX (x2 steps) or a comma list")
	fs.StringVar(&f.dist, "dist", "uniform", "traffic: uniform | zipf:S | lognormal:SIGMA | hot:F")
	fs.IntVar(&f.iters, "iters", 1000, "maximum timed iterations per size")
	fs.IntVar(&f.warmup, "warmup", 20, "warm-up iterations per size")
	fs.DurationVar(&f.budget, "budget", 1500*time.Millisecond, "time budget per size: fewer iterations (>= 20) for slow sizes")
	fs.BoolVar(&f.check, "check", false, "verify every received byte; exit non-zero on a mismatch")
	fs.BoolVar(&f.json, "json", false, "one JSON object per row")
	fs.StringVar(&f.nats, "nats", "", "join through this NATS server instead of an embedded one")
	fs.Uint64Var(&f.seed, "seed", 12345, "seed of the traffic matrix (same on every rank)")
	fs.IntVar(&f.streams, "streams", 0, fmt.Sprintf("connections per peer pair (default: A2A_STREAMS or %d)", a2a.DefaultStreams))
	fs.IntVar(&f.window, "window", 0, fmt.Sprintf("fullmesh peers in flight (default: A2A_WINDOW or %d)", algo.DefaultWindow))
	fs.BoolVar(&f.worker, "worker", false, "internal: run as one rank of the benchmark")
	fs.StringVar(&f.counts, "counts", "known", "alltoallv receive counts: known (given) | matrix (AllToAllVMatrix with the global matrix: staged/skew-aware choice) | nats (ExchangeCountsMatrix each call) | inband (AllToAllVInBand)")
	fs.StringVar(&f.trans, "transport", "", "data plane: auto (shm on one host, tcp to others) | tcp | shm (default: A2A_TRANSPORT or auto)")
	fs.StringVar(&f.timing, "timing", "barrier", "barrier: per-rank time after a barrier, slowest rank (as the MPI harness) | span: last rank's start to last rank's end (ranks must share a clock: one machine, e.g. the test bed), which leaves out the barrier's exit skew")
	fs.StringVar(&f.alloc, "alloc", "huge", "send and receive buffers: huge (a2a.AllocBuffer: 2 MiB aligned, transparent huge pages) | heap (make)")
	fs.StringVar(&f.bind, "bind", "core", "core: one core per rank as mpirun binds (unless oversubscribed) | none")
}

// The values of --algo (the AllToAllV algorithms of A2A_ALGO) and
// --transport (A2A_TRANSPORT).
var (
	benchAlgos      = []string{"auto", "pairwise", "fullmesh", "staged", "skew", "ll"}
	benchTransports = []string{"auto", "tcp", "shm"}
)

// benchRow is one line of output; the JSON keys are a stable interface.
type benchRow struct {
	Op     string  `json:"op"`
	Algo   string  `json:"algo"`
	Ranks  int     `json:"ranks"`
	Size   int     `json:"size"`
	P50    float64 `json:"p50_us"`
	P99    float64 `json:"p99_us"`
	AlgBW  float64 `json:"algbw_gbps"`
	BusBW  float64 `json:"busbw_gbps"`
	Check  string  `json:"check"`
	Iters  int     `json:"-"`
	Counts int     `json:"-"`
}

func cmdBench(ctx context.Context, log *slog.Logger, args []string) error {
	var f benchFlags
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return usageError{err}
	}
	sizes, err := parseSizes(f.sizes)
	if err != nil {
		return usageError{err}
	}
	d, err := parseDist(f.dist)
	if err != nil {
		return usageError{err}
	}
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
	if f.algo != "" && !slices.Contains(benchAlgos, f.algo) {
		return usagef("--algo %q: %s", f.algo, strings.Join(benchAlgos, ", "))
	}
	if f.trans != "" && !slices.Contains(benchTransports, f.trans) {
		return usagef("--transport %q: %s", f.trans, strings.Join(benchTransports, ", "))
	}
	if f.op != "alltoallv" && d.kind != "uniform" {
		return usagef("--op %s moves equal blocks: --dist must be uniform", f.op)
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

func benchWorker(ctx context.Context, log *slog.Logger, f benchFlags, sizes []int, d dist) error {
	c, err := joinWorker(ctx, log, func(cfg *a2a.Config) {
		if f.algo != "" {
			cfg.Algo = f.algo
		}
		if f.streams > 0 {
			cfg.Streams = f.streams
		}
		if f.window > 0 {
			cfg.Window = f.window
		}
	})
	if err != nil {
		return err
	}
	defer c.Close()
	rank, n := c.Rank(), c.Size()
	if rank == 0 && !f.json {
		spin, yield := c.WaitPolicy()
		fmt.Printf("# a2ad bench op=%s ranks=%d dist=%s counts=%s streams=%d seed=%d transport=%s spin=%v yield=%v timing=%s alloc=%s\n",
			f.op, n, d, f.counts, c.Config().Streams, f.seed, c.TransportName(), spin, yield, f.timing, f.alloc)
		fmt.Printf("# %10s %12s %-9s %10s %10s %11s %11s %6s\n", "size", "count", "algo", "p50_us", "p99_us", "algbw_GB/s", "busbw_GB/s", "check")
	}
	b := newBench(c, f)
	for _, size := range sizes {
		row, err := b.point(ctx, size, d)
		if err != nil {
			return fmt.Errorf("size %d: %w", size, err)
		}
		if rank == 0 {
			if f.json {
				out, _ := json.Marshal(row)
				fmt.Println(string(out))
			} else {
				fmt.Printf("  %10d %12d %-9s %10.2f %10.2f %11.3f %11.3f %6s\n", row.Size, row.Counts, row.Algo, row.P50, row.P99, row.AlgBW, row.BusBW, row.Check)
			}
		}
		if row.Check == "fail" {
			return fmt.Errorf("size %d: received bytes differ from what was sent", size)
		}
	}
	return nil
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
}

func newBench(c *a2a.Comm, f benchFlags) *bench {
	n := c.Size()
	return &bench{c: c, f: f, one: make([]int, n), gather: make([]int, n),
		agreeS: make([]byte, 8*n), agreeR: make([]byte, 8*n), sendC: make([]int, n), recvC: make([]int, n),
		learned: make([]int, n), matrix: make([]int, n*n)}
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
	n, rank := b.c.Size(), b.c.Rank()
	row := benchRow{Op: b.f.op, Ranks: n, Size: size, Counts: n * size, Check: "skip"}
	op := collective{algBytes: n * size, busFactor: float64(n-1) / float64(n)}
	if b.f.op == "alltoallv" || b.f.op == "alltoall" {
		b.setupAllToAll(size, d)
		op.call = b.call
		op.verify = func() bool { return verifyRecv(b.recv, rank, b.recvC) < 0 }
	} else {
		var err error
		if op, err = b.collectiveFor(size); err != nil {
			return row, err
		}
		row.Counts = op.algBytes
	}
	return b.measure(ctx, row, op)
}

// setupAllToAll lays out the send and receive buffers of the counts matrix.
func (b *bench) setupAllToAll(size int, d dist) {
	n, rank := b.c.Size(), b.c.Rank()
	m := d.matrix(n, size, b.f.seed)
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
	c, n, rank := b.c, b.c.Size(), b.c.Rank()
	ok := true
	if b.f.check {
		for i := range b.recv {
			b.recv[i] = 0xEE
		}
		if err := op.call(ctx); err != nil {
			return row, err
		}
		ok = op.verify()
	}
	t0 := time.Now()
	for range b.f.warmup {
		if err := op.call(ctx); err != nil {
			return row, err
		}
	}
	iters := b.f.iters
	if b.f.warmup > 0 {
		mean := time.Since(t0) / time.Duration(b.f.warmup)
		if mean > 0 {
			iters = max(20, min(iters, int(b.f.budget/mean)))
		}
	}
	iters, err := b.agreeMin(ctx, iters)
	if err != nil {
		return row, err
	}
	b.stamps = b.stamps[:0]
	for range iters {
		if err := b.barrier(ctx); err != nil {
			return row, err
		}
		start := time.Now()
		if err := op.call(ctx); err != nil {
			return row, err
		}
		end := time.Now()
		// Wall-clock stamps, for --timing span across ranks; the duration
		// itself comes from the monotonic clock.
		b.stamps = append(b.stamps, start.UnixNano(), start.UnixNano()+end.Sub(start).Nanoseconds())
	}
	row.Algo = c.LastAlgo()
	if b.f.check && ok {
		ok = op.verify()
	}
	// Gather every rank's per-iteration start and end stamps (and its check
	// result) on rank 0.
	per := 16*iters + 1
	b.gatherSend = grow(b.gatherSend, per)
	for i, t := range b.stamps {
		binary.LittleEndian.PutUint64(b.gatherSend[8*i:], uint64(t))
	}
	b.gatherSend[16*iters] = 0
	if ok {
		b.gatherSend[16*iters] = 1
	}
	for j := range n {
		b.one[j], b.gather[j] = 0, 0
		if rank == 0 {
			b.gather[j] = per
		}
	}
	b.one[0] = per
	b.gatherRecv = grow(b.gatherRecv, n*per)
	if err := c.AllToAllV(ctx, b.gatherSend, b.one, b.gatherRecv[:len(b.gatherRecv)], b.gather); err != nil {
		return row, err
	}
	if rank != 0 {
		return row, nil
	}
	// The time of each iteration in us: the slowest rank's call, or with
	// --timing span the last start to the last end over all ranks.
	span := b.f.timing == "span"
	slowest := make([]float64, iters)
	var lastStart, lastEnd []int64
	if span {
		lastStart, lastEnd = make([]int64, iters), make([]int64, iters)
	}
	allOK := true
	for r := range n {
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
		allOK = allOK && block[16*iters] == 1
	}
	if span {
		for i := range iters {
			slowest[i] = float64(max(lastEnd[i]-lastStart[i], 0)) / 1e3
		}
	}
	slices.Sort(slowest)
	row.P50 = percentile(slowest, 0.50)
	row.P99 = percentile(slowest, 0.99)
	if row.P50 > 0 {
		row.AlgBW = float64(op.algBytes) / (row.P50 * 1e3) // bytes per ns = GB/s
		row.BusBW = row.AlgBW * op.busFactor
	}
	if b.f.check {
		row.Check = "ok"
		if !allOK {
			row.Check = "fail"
		}
	}
	return row, nil
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
