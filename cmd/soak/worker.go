package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/transport/shm"
)

// workerOptions are what every rank of a soak is started with; all ranks
// must get the same ones.
type workerOptions struct {
	seed      uint64
	duration  time.Duration
	transport string // mix | auto | tcp | shm
	inject    string // "" | corrupt | leak
	opTimeout time.Duration
	start     time.Time // when the soak started: rank 0 stops by it
}

// layout is how a session's ranks see hosts and which data plane they use.
type layout struct {
	name      string
	hosts     int    // 1 or 2 posed hosts; 0: the host identity of the environment (test bed)
	transport string // A2A_TRANSPORT: "" auto, tcp, shm
}

// layouts are the data planes a soak mixes. On one machine the ranks pose as
// one host (shared memory, or TCP forced) or as two (shared memory inside a
// host, TCP between); in the test bed each namespace is a host already.
func layouts(envHosts bool, transport string) []layout {
	all := []layout{
		{"1host-auto", 1, ""}, {"1host-tcp", 1, "tcp"}, {"1host-shm", 1, "shm"},
		{"2hosts-auto", 2, ""}, {"2hosts-tcp", 2, "tcp"},
	}
	if envHosts {
		all = []layout{{"hosts-auto", 0, ""}, {"hosts-tcp", 0, "tcp"}}
	}
	var out []layout
	for _, l := range all {
		switch {
		case transport == "mix",
			transport == "auto" && l.transport == "",
			transport == l.transport:
			out = append(out, l)
		}
	}
	return out
}

// sessionConfig is one session's configuration, drawn alike on every rank.
type sessionConfig struct {
	layout       layout
	algo, algoAR string
	streams      int
	window       int
	llBytes      int
	ops          int
}

func (sc sessionConfig) String() string {
	algo, ar := sc.algo, sc.algoAR
	if algo == "" {
		algo = "auto"
	}
	if ar == "" {
		ar = "auto"
	}
	return fmt.Sprintf("layout=%s algo=%s allreduce=%s streams=%d window=%d llbytes=%d ops=%d",
		sc.layout.name, algo, ar, sc.streams, sc.window, sc.llBytes, sc.ops)
}

func pick[T any](rng *rand.Rand, v ...T) T { return v[rng.IntN(len(v))] }

func drawSession(rng *rand.Rand, ls []layout) sessionConfig {
	return sessionConfig{
		layout: ls[rng.IntN(len(ls))],
		// Auto selection half of the time, else a forced algorithm.
		algo:    pick(rng, "", "", "", "", "", "pairwise", "fullmesh", "staged", "skew", "ll"),
		algoAR:  pick(rng, "", "", "", "ring", "recdoubling", "hierarchical", "ll"),
		streams: pick(rng, 0, 0, 1, 3),
		window:  pick(rng, 0, 0, 1, 2),
		llBytes: pick(rng, 0, 0, -1, 256),
		ops:     50 + rng.IntN(350),
	}
}

// apply sets cfg up for the session.
func (sc sessionConfig) apply(cfg *a2a.Config, base string, session, rank, world int) {
	cfg.Group = fmt.Sprintf("%s-s%d", base, session)
	cfg.Algo, cfg.AlgoAllReduce = sc.algo, sc.algoAR
	cfg.Streams, cfg.Window, cfg.LLBytes = sc.streams, sc.window, sc.llBytes
	cfg.Transport = sc.layout.transport
	switch sc.layout.hosts {
	case 1:
		cfg.Host = base + "-host0"
	case 2:
		cfg.Host = fmt.Sprintf("%s-host%d", base, rank*2/world)
	}
}

// workerResult is one rank's account of its soak.
type workerResult struct {
	sessions, ops int
	bytes         int64
	byOp          map[string]int
	samples       []usage // between sessions, after warm-up
	base, final   usage   // what the leak check compared
}

// runWorker is one rank of a soak: sessions of random operations until the
// duration is over, each session a fresh Join with a configuration drawn
// from the seed, then the leak check.
func runWorker(ctx context.Context, log *slog.Logger, o workerOptions) (workerResult, error) {
	res := workerResult{byOp: map[string]int{}}
	cfg0, err := a2a.ConfigFromEnv()
	if err != nil {
		return res, err
	}
	cfg0.Logger = log
	if cfg0.Rank < 0 || cfg0.WorldSize < 2 {
		return res, fmt.Errorf("soak: needs A2A_RANK and A2A_WORLD_SIZE >= 2 (rank %d, world %d)", cfg0.Rank, cfg0.WorldSize)
	}
	ls := layouts(os.Getenv("A2A_HOST") != "", o.transport)
	if len(ls) == 0 {
		return res, fmt.Errorf("soak: --transport %q: no layout uses it here", o.transport)
	}
	s := newRankState(cfg0.WorldSize, o.seed)
	s.touch()
	o.start = time.Now()
	warm := o.duration / 5
	var groups []string
	for session := 0; ; session++ {
		sc := drawSession(rand.New(rand.NewPCG(o.seed, uint64(session))), ls)
		cfg := cfg0
		sc.apply(&cfg, cfg0.Group, session, cfg0.Rank, cfg0.WorldSize)
		stop, err := runSession(ctx, s, cfg, sc, session, o, &res)
		groups = append(groups, cfg.Group)
		if err != nil {
			return res, fmt.Errorf("session %d (%s): %w", session, sc, err)
		}
		res.sessions++
		if time.Since(o.start) >= warm || stop {
			u, err := measure()
			if err != nil {
				return res, err
			}
			if len(res.samples) == 0 && o.inject == "leak" {
				defer injectLeak()() // after the baseline: the check must find it
			}
			res.samples = append(res.samples, u)
		}
		if stop {
			break
		}
	}
	res.base, res.final, err = leakCheck(res.samples, 5*time.Second)
	runtime.KeepAlive(s) // its buffers were in the baseline: they stay in the final sample
	if err != nil {
		return res, err
	}
	left, err := shmLeftovers(shm.DefaultDir, groups)
	if err != nil {
		return res, err
	}
	if len(left) > 0 {
		return res, fmt.Errorf("leak: shared-memory segments left in %s: %v", shm.DefaultDir, left)
	}
	return res, nil
}

// runSession joins one session's group, runs its operations and leaves;
// rank 0 decides by the clock whether another session follows and tells
// the others by Broadcast.
func runSession(ctx context.Context, s *rankState, cfg a2a.Config, sc sessionConfig, session int, o workerOptions, res *workerResult) (bool, error) {
	jctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	c, err := a2a.Join(jctx, cfg)
	cancel()
	if err != nil {
		return false, fmt.Errorf("join: %w", err)
	}
	defer c.Close()
	s.c, s.me = c, c.Rank()
	defer func() { s.c = nil }() // a closed Comm is garbage: the leak check must not count it
	t0 := time.Now()
	for k := range sc.ops {
		seq := int64(session)<<20 | int64(k)
		rng := rand.New(rand.NewPCG(o.seed^0x5eed, uint64(seq)))
		op := drawOp(rng)
		if o.inject == "corrupt" && s.me == 1 && session == 0 && k == 0 {
			s.inject = true
		}
		octx, cancel := context.WithTimeout(ctx, o.opTimeout)
		err := op.run(s, octx, rng, seq)
		cancel()
		if err != nil {
			if ve := (*verifyError)(nil); errors.As(err, &ve) {
				c.Abort(err) // release the other ranks at once
			}
			return false, fmt.Errorf("op %d (%s, algorithm %s): %w", k, op.name, c.LastAlgo(), err)
		}
		res.ops++
		res.byOp[op.name]++
	}
	res.bytes = s.bytes
	flag := []byte{0}
	if s.me == 0 && time.Since(o.start) >= o.duration {
		flag[0] = 1
	}
	bctx, cancel := context.WithTimeout(ctx, o.opTimeout)
	defer cancel()
	if err := c.Broadcast(bctx, flag, 0); err != nil {
		return false, fmt.Errorf("stop flag: %w", err)
	}
	if s.me == 0 {
		fmt.Printf("soak: session %d %s transport=%s in %.2fs\n", session, sc, c.TransportName(), time.Since(t0).Seconds())
	}
	if err := c.Close(); err != nil && !errors.Is(err, a2a.ErrClosed) {
		return false, fmt.Errorf("close: %w", err)
	}
	return flag[0] == 1, nil
}

// leaked holds what injectLeak leaks, so the collector cannot take it back.
var leaked []*os.File

// injectLeak leaks a descriptor, a goroutine and 4 MiB on purpose (--inject
// leak), to show that the leak check fails. It returns the function that
// puts the leak right after the check, for tidiness.
func injectLeak() func() {
	f, err := os.Open("/dev/null")
	if err == nil {
		leaked = append(leaked, f)
	}
	stop := make(chan struct{})
	go func() { <-stop }()
	leakedMem = make([]byte, 4<<20)
	for i := range leakedMem {
		leakedMem[i] = 1
	}
	return func() { close(stop) }
}

// leakedMem is the memory injectLeak leaks.
var leakedMem []byte

// summary is a rank's success line.
func (r workerResult) summary(rank int) string {
	names := make([]string, 0, len(r.byOp))
	for n := range r.byOp {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, " %s=%d", n, r.byOp[n])
	}
	grow := 100 * float64(r.final.heap-r.base.heap) / float64(r.base.heap)
	return fmt.Sprintf("rank %d PASS sessions=%d ops=%d verified=%.1fMiB; after warm-up: goroutines %d->%d fds %d->%d live heap %.2f->%.2fMiB (%+.2f%%) shm-maps %d, segments 0; ops:%s",
		rank, r.sessions, r.ops, float64(r.bytes)/(1<<20), r.base.goroutines, r.final.goroutines,
		r.base.fds, r.final.fds, float64(r.base.heap)/(1<<20), float64(r.final.heap)/(1<<20), grow, r.final.shmMaps, b.String())
}
