// Command moe is the expert-routing demo of a2a: N local ranks run a
// mixture-of-experts layer step by step — route, dispatch, expert compute,
// combine — over a real NATS control plane and data plane (shared memory
// between local ranks, TCP otherwise), and check every output against a
// reference computed in a single process.
//
//	go run ./examples/moe                      # 4 ranks, 16 experts, top-2
//	go run ./examples/moe -n 2 --skew 1.2 --capacity 1.0 --steps 10
//
// Each rank hosts experts/N experts, each a small two-layer feed-forward
// network whose float32 weights come from the seed. Per step every rank
// generates its tokens and router logits from (seed, step, rank), gates them
// (top-k softmax, package routing), drops assignments over capacity,
// dispatches the rows to the experts' ranks (package dispatch), runs its
// experts, and combines the outputs back into token order. It then recomputes
// the same layer for its own tokens without any communication and compares.
// Rank 0 prints one line per step; every rank serves Prometheus metrics while
// it runs. The exit status is non-zero if any output differs.
//
// With --dp D the ranks split into D expert-parallel groups, each running
// the layer on a communicator of its own, and every step's rows per expert
// are AllReduced across the groups (dp.go).
//
// With --rebalance-every N (and --redundant R slots for replicas), the
// dispatcher re-places the experts from its load estimate every N steps and
// moves their weights between the ranks: each rank computes with its own
// copies of the experts it hosts (weights.go), so a moved expert runs on the
// weights that came over the data plane.
//
// With --preset deepseek-v3, qwen3-30b-a3b or mixtral-8x7b, the layer has
// that model's experts, top-k and hidden size (preset.go), and rank 0 prints
// DeepEP-style figures after the run: each rank's average dispatch and
// combine time and "logical" GB/s.
//
// The command re-executes itself once per rank with --worker, as `a2ad demo`
// does; a worker can also be started by `a2ad run -n N -- moe --worker ...`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/dispatch"
	"github.com/a2a-moe/a2a/internal/launch"
	"github.com/a2a-moe/a2a/internal/natsd"
)

// options are the demo's flags, shared by the launcher and its workers.
type options struct {
	ranks        int
	experts      int
	k            int
	tokens       int
	hidden       int
	ffn          int
	steps        int
	microbatches int
	maxTokens    int
	skew         float64
	capacity     float64
	seed         uint64
	dtype        reduce.DType
	counts       dispatch.CountsMode
	rows         dispatch.RowPath
	wire         dispatch.WireFormat
	hierarchy    dispatch.HierarchyMode
	hosts        int // fake hosts: rank r on host r*hosts/n (0: the real one)
	metricsAddr  string
	metricsPort  int
	interval     time.Duration
	hold         time.Duration
	natsURL      string
	worker       bool
	corruptRank  int // testing: this rank perturbs one output before verifying
	killRank     int // this rank kills itself (SIGKILL) at killStep; -1: none
	killStep     int
	killReplace  bool    // killRank dies inside the first re-placement instead
	redundant    int     // slots beyond one per expert, for the re-placement
	rebalance    int     // steps between re-placement checks; 0: never
	threshold    float64 // re-place above this estimated max/mean rank load
	preset       string  // a model's layer (preset.go); "" none
	dp           int     // data-parallel groups (dp.go)
}

// parseFlags parses and checks the command line.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{corruptRank: -1, killRank: -1}
	fs := flag.NewFlagSet("moe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var text textFlags
	o.register(fs, &text)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := o.applyPreset(fs, &text); err != nil {
		return o, err
	}
	if err := o.decode(text); err != nil {
		return o, err
	}
	return o, o.validate()
}

// textFlags are the flags given as text that options holds decoded.
type textFlags struct {
	skew, dtype, counts, rows, wire, hierarchy string
}

// register defines the flags on fs: most set o's fields, the others text's,
// which decode reads into o.
func (o *options) register(fs *flag.FlagSet, text *textFlags) {
	fs.IntVar(&o.ranks, "n", 4, "local ranks")
	fs.StringVar(&o.preset, "preset", "", "a model's MoE layer: "+presetNames+"; sets --experts, --k and --hidden from it, and --dtype bf16, --capacity 0 and --ffn "+strconv.Itoa(presetFFN)+" (flags given win), and prints DeepEP-style dispatch and combine figures")
	fs.IntVar(&o.experts, "experts", 16, "experts E in the layer")
	fs.IntVar(&o.k, "k", 2, "experts per token (top-k)")
	fs.IntVar(&o.tokens, "tokens", 256, "tokens per rank per step")
	fs.IntVar(&o.hidden, "hidden", 64, "hidden size H (elements per token row)")
	fs.IntVar(&o.ffn, "ffn", 128, "inner size of each expert's feed-forward network")
	fs.IntVar(&o.steps, "steps", 5, "steps")
	fs.IntVar(&o.microbatches, "microbatches", 1, "micro-batches per step; with 2 or more, the exchange of one overlaps the expert compute of the previous")
	fs.IntVar(&o.maxTokens, "max-tokens", 0, "decode mode: at most this many tokens per micro-batch, received into fixed buffers with the counts in the same round as the rows (0: off; needs --counts inband, at most 2 micro-batches)")
	fs.StringVar(&text.skew, "skew", "0", "router skew: S or zipf:S, the Zipf exponent of the experts' popularity (0: uniform)")
	fs.Float64Var(&o.capacity, "capacity", 1.25, "capacity factor: each expert takes at most ceil(T*k/E*factor) of a rank's T tokens (<= 0: unlimited)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of tokens, router logits and expert weights")
	fs.StringVar(&text.dtype, "dtype", "float32", "element type of token rows: float32 or bfloat16")
	fs.StringVar(&text.counts, "counts", "inband", "how ranks learn receive counts: inband (data plane) or nats (control plane)")
	fs.StringVar(&text.rows, "rows", "auto", "how rows travel: auto (shared memory when every rank is on this host) or alltoallv")
	fs.StringVar(&text.wire, "wire", "same", "format of dispatched rows: same (the dtype) or fp8 (E4M3 with a float32 scale per 128 elements; needs --counts inband)")
	fs.StringVar(&text.hierarchy, "hierarchy", "auto", "across hosts, send a token to each remote host once, through a relay rank there: auto (where the cost model prices it lower), on or off")
	fs.IntVar(&o.hosts, "hosts", 0, "fake this many hosts: rank r runs on host r*hosts/n (TCP between them, shared memory inside), as the test bed's namespaces would (0: the real one)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "127.0.0.1", "host the /metrics servers listen on")
	fs.IntVar(&o.metricsPort, "metrics-port", 0, "rank r serves /metrics on port BASE+r (0: any free port)")
	fs.DurationVar(&o.interval, "interval", 0, "pause between steps")
	fs.DurationVar(&o.hold, "hold", 0, "keep the ranks and their /metrics up this long after the last step")
	fs.StringVar(&o.natsURL, "nats", "", "control plane to join (default: embed a NATS server)")
	fs.BoolVar(&o.worker, "worker", false, "internal: run as one rank (A2A_* environment)")
	fs.IntVar(&o.corruptRank, "corrupt-rank", -1, "testing: this rank alters one output element, so verification must fail")
	fs.IntVar(&o.killRank, "kill-rank", -1, "this rank (1..n-1) kills itself with SIGKILL at --kill-step; the others shrink the group, re-place its experts and carry on")
	fs.IntVar(&o.killStep, "kill-step", 2, "the step at which --kill-rank dies")
	fs.BoolVar(&o.killReplace, "kill-in-replace", false, "--kill-rank dies inside the first re-placement, as it imports the weights it receives, instead of at --kill-step")
	fs.IntVar(&o.redundant, "redundant", 0, "redundant expert slots: hot experts get replicas in them at a re-placement (needs --rebalance-every; experts+redundant a multiple of -n)")
	fs.IntVar(&o.rebalance, "rebalance-every", 0, "every this many steps, re-place the experts from the measured load when it is uneven, moving their weights between ranks (0: never)")
	fs.Float64Var(&o.threshold, "rebalance-threshold", 1.05, "re-place only when the estimated max/mean rank load exceeds this")
	fs.IntVar(&o.dp, "dp", 1, "data-parallel groups: the ranks split (Comm.Split) into this many expert-parallel groups of n/dp ranks, each running the layer, and every step's rows per expert are AllReduced across them")
}

// decode sets the fields of the flags given as text.
func (o *options) decode(text textFlags) error {
	var err error
	if o.skew, err = strconv.ParseFloat(strings.TrimPrefix(text.skew, "zipf:"), 64); err != nil || o.skew < 0 {
		return fmt.Errorf("--skew %q: want S or zipf:S with S >= 0", text.skew)
	}
	if o.dtype, err = reduce.ParseDType(text.dtype); err != nil || (o.dtype != reduce.Float32 && o.dtype != reduce.BFloat16) {
		return fmt.Errorf("--dtype %q: float32 or bfloat16", text.dtype)
	}
	if o.counts, err = dispatch.ParseCountsMode(text.counts); err != nil {
		return fmt.Errorf("--counts %q: inband or nats", text.counts)
	}
	if o.rows, err = dispatch.ParseRowPath(text.rows); err != nil {
		return fmt.Errorf("--rows %q: auto or alltoallv", text.rows)
	}
	if o.wire, err = dispatch.ParseWireFormat(text.wire); err != nil {
		return fmt.Errorf("--wire %q: same or fp8", text.wire)
	}
	if o.hierarchy, err = dispatch.ParseHierarchyMode(text.hierarchy); err != nil {
		return fmt.Errorf("--hierarchy %q: auto, on or off", text.hierarchy)
	}
	return nil
}

// validate checks the values against each other.
func (o *options) validate() error {
	switch {
	case o.ranks < 1:
		return fmt.Errorf("-n %d: want at least one rank", o.ranks)
	case o.hosts < 0 || o.hosts > o.ranks:
		return fmt.Errorf("--hosts %d: want 0..n", o.hosts)
	case o.experts < 1 || o.k < 1 || o.k > o.experts:
		return fmt.Errorf("--experts %d --k %d: want 1 <= k <= experts", o.experts, o.k)
	case o.tokens < 0 || o.hidden < 1 || o.ffn < 1 || o.steps < 0:
		return fmt.Errorf("--tokens, --hidden, --ffn and --steps must be positive")
	case o.microbatches < 1 || o.microbatches > max(o.tokens, 1):
		return fmt.Errorf("--microbatches %d: want 1..tokens", o.microbatches)
	case o.wire == dispatch.WireFP8 && o.counts != dispatch.CountsInBand:
		return fmt.Errorf("--wire fp8: needs --counts inband")
	case o.metricsPort < 0 || o.metricsPort > 65535:
		return fmt.Errorf("--metrics-port %d", o.metricsPort)
	}
	return errors.Join(o.validateKill(), o.validateDecode(), o.validateDP(), o.validateRebalance())
}

// validateKill checks --kill-rank and --kill-step.
func (o *options) validateKill() error {
	switch {
	case o.killRank == 0 || o.killRank < -1 || (!o.worker && o.killRank >= o.ranks):
		return fmt.Errorf("--kill-rank %d: want 1..n-1 (rank 0 prints the run)", o.killRank)
	case o.killRank > 0 && (o.killStep < 0 || o.killStep >= o.steps):
		return fmt.Errorf("--kill-step %d: want 0..steps-1", o.killStep)
	}
	return nil
}

// validateDecode checks --max-tokens against the other flags.
func (o *options) validateDecode() error {
	switch mb := (o.tokens + o.microbatches - 1) / o.microbatches; {
	case o.maxTokens < 0 || (o.maxTokens > 0 && (o.counts != dispatch.CountsInBand || o.microbatches > 2 || o.rebalance > 0)):
		return fmt.Errorf("--max-tokens %d: want >= 0; the decode mode needs --counts inband, at most 2 micro-batches and no --rebalance-every", o.maxTokens)
	case o.maxTokens > 0 && mb > o.maxTokens:
		return fmt.Errorf("--max-tokens %d: micro-batches of %d tokens do not fit", o.maxTokens, mb)
	}
	return nil
}

// validateDP checks --dp against the rest.
func (o *options) validateDP() error {
	switch {
	case o.dp < 1 || o.ranks%o.dp != 0:
		return fmt.Errorf("--dp %d: want a divisor of -n %d", o.dp, o.ranks)
	case o.dp > 1 && (o.killRank > 0 || o.rebalance > 0 || o.counts != dispatch.CountsInBand):
		return fmt.Errorf("--dp %d: not with --kill-rank, --rebalance-every or --counts nats", o.dp)
	}
	return nil
}

// validateRebalance checks the re-placement flags.
func (o *options) validateRebalance() error {
	n := o.experts + o.redundant
	switch {
	case o.killReplace && (o.killRank < 1 || o.rebalance == 0):
		return fmt.Errorf("--kill-in-replace: want --kill-rank and --rebalance-every")
	case o.rebalance < 0 || o.redundant < 0 || (o.redundant > 0 && o.rebalance == 0):
		return fmt.Errorf("--redundant %d --rebalance-every %d: want both >= 0, redundant slots only with a re-placement", o.redundant, o.rebalance)
	case o.rebalance > 0 && (n%o.ranks != 0 || n/o.ranks > o.experts):
		return fmt.Errorf("--redundant %d: experts %d plus redundant slots must be a multiple of -n %d, at most experts per rank", o.redundant, o.experts, o.ranks)
	}
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		// Asked for: the help is the answer, as with go's own -h.
	case err != nil:
		fmt.Fprintln(os.Stderr, "moe:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: logLevel()}))
	if o.worker {
		return runWorker(ctx, log, o, stdout)
	}
	return launchRanks(ctx, log, o, args, stdout, stderr)
}

// launchRanks starts the control plane (unless --nats names one) and the
// ranks, each a copy of this program with --worker.
func launchRanks(ctx context.Context, log *slog.Logger, o options, args []string, stdout, stderr io.Writer) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	url, plane := o.natsURL, "NATS control plane at "+o.natsURL+" (--nats)"
	group, secret := launch.NewGroup("moe"), launch.NewSecret()
	var env []string
	if url == "" {
		// The embedded server lets in the ranks (a user limited to the
		// job's subjects, its password handed over in their environment)
		// and the service (in-process), no one else.
		ranks := natsd.NewUser(group, control.Subjects(group))
		svcUser := natsd.NewUser("moe-service", nil)
		srv, err := natsd.StartServer(natsd.Config{Listen: "127.0.0.1:0", Users: []natsd.User{ranks, svcUser}})
		if err != nil {
			return err
		}
		defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
		url, env = srv.ClientURL(), ranks.Env()
		plane = "embedded NATS control plane at " + url
		// The rendezvous and counts service a2ad serve runs; the ranks
		// would elect a coordinator among themselves without it.
		nc, err := nats.Connect(url, append(svcUser.Options(), nats.InProcessServer(srv), nats.Name("moe demo control service"))...)
		if err != nil {
			return err
		}
		defer nc.Close()
		svc, err := control.NewService(nc, []byte(secret), log)
		if err != nil {
			return err
		}
		defer svc.Close()
	}
	fmt.Fprintf(stdout, "moe: %d local ranks, %s\n", o.ranks, plane)
	return launch.Run(ctx, launch.Spec{
		N: o.ranks, NATSURL: url, Group: group, Secret: secret, Env: env,
		Prog: self, Args: append([]string{"--worker"}, args...),
		Stdout: stdout, Stderr: stderr, Expendable: boolInt(o.killRank > 0),
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func logLevel() slog.Level {
	var l slog.Level
	if s := os.Getenv("A2A_LOG"); s != "" && l.UnmarshalText([]byte(s)) == nil {
		return l
	}
	return slog.LevelWarn
}
