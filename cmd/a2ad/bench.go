package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/internal/launch"
	"github.com/a2a-moe/a2a/internal/nap"
)

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
	if err := checkBind(f.bind); err != nil {
		return err
	}
	var env []string
	if f.trans != "" {
		env = append(env, "A2A_TRANSPORT="+f.trans)
	}
	// Where the hypervisor runs the CPUs, and other processes' load, not the
	// launch, decide whether a run on a shared VM gets the fast figures: say
	// what they were (docs/PERFORMANCE.md, "Bimodal runs on the 2-core
	// machine").
	floor := timeFloor()
	start, markErr := markLoad()
	err = launchSelf(ctx, log, "bench", args, launch.Spec{N: f.n, NATSURL: f.nats, BindVia: bindVia(f.bind), Env: env})
	if err == nil && markErr == nil {
		reportLoad(os.Stderr, start)
	}
	if err == nil {
		reportFloor(os.Stderr, floor)
	}
	return err
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
	settled      bool // the launch's --settle calls are made
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
	if b.f.overlap > 0 {
		q := b.c.IAllToAllV(ctx, b.send, b.sendC, b.recv, b.recvC)
		nap.For(b.f.overlap)
		_, err := q.Wait(ctx)
		return err
	}
	return b.c.AllToAllV(ctx, b.send, b.sendC, b.recv, b.recvC)
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
	if b.f.persistent {
		p, err := b.persistent()
		if err != nil {
			return row, err
		}
		defer p.Close()
		op.call = func(ctx context.Context) error {
			if err := p.Start(ctx); err != nil {
				return err
			}
			return p.Wait(ctx)
		}
	}
	return b.measure(ctx, row, op)
}

// persistent plans the persistent form of the op over the buffers point
// set up (--persistent).
func (b *bench) persistent() (*a2a.Persistent, error) {
	if b.f.op == "allreduce" {
		return b.c.AllReduceInit(b.send, b.recv, b.dtype, b.redop)
	}
	return b.c.AllToAllVInit(b.send, b.sendC, b.recv, b.recvC)
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
