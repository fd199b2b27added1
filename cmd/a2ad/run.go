package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/transport/shm"
	"github.com/a2a-moe/a2a/internal/launch"
)

func cmdRun(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	n := fs.Int("n", 1, "ranks to start on this host")
	natsURL := fs.String("nats", "", "NATS URL of a shared control plane (default: embed one)")
	group := fs.String("group", "", "group (job) name (default: a fresh one)")
	world := fs.Int("world", 0, "ranks in the whole job when other hosts start the rest (default: -n)")
	offset := fs.Int("rank-offset", 0, "rank of the first process started here")
	secret := fs.String("secret", os.Getenv("A2A_SECRET"), "data-plane secret (default: $A2A_SECRET or random; must be shared across hosts)")
	bind := bindFlag(fs)
	if err := parseFlags(fs, args); err != nil {
		return usageError{err}
	}
	if *bind != "core" && *bind != "none" {
		return usagef("--bind %q: core or none", *bind)
	}
	prog := fs.Args()
	if len(prog) == 0 {
		return usagef("missing program: a2ad run -n N -- PROG [ARGS]")
	}
	if *natsURL == "" && *world > *n {
		return usagef("--world %d > -n %d needs --nats pointing at a shared control plane", *world, *n)
	}
	return launchRanks(ctx, log, launch.Spec{
		N: *n, World: *world, RankOffset: *offset, NATSURL: *natsURL,
		Group: *group, Secret: *secret, Prog: prog[0], Args: prog[1:], Prefix: true,
		BindVia: bindVia(*bind),
	})
}

// launchRanks fills in a fresh group and secret, embeds a control plane when
// spec.NATSURL is empty, and runs the ranks.
func launchRanks(ctx context.Context, log *slog.Logger, spec launch.Spec) error {
	if spec.Group == "" {
		spec.Group = "job-" + randomHex(6)
	}
	if spec.Secret == "" {
		spec.Secret = randomHex(16)
	}
	if spec.NATSURL == "" {
		cp, err := startControlPlane(log, "127.0.0.1:0", "")
		if err != nil {
			return err
		}
		defer cp.Close()
		spec.NATSURL = cp.URL
	}
	// Segments of ranks killed while opening shared memory in an earlier job
	// would stay in /dev/shm until their group runs again: remove them.
	if removed, err := shm.Sweep(shm.DefaultDir); err == nil && len(removed) > 0 {
		log.Info("a2ad: removed stale shared-memory segments", "files", removed)
	}
	if p, err := resolveProg(spec.Prog); err == nil {
		spec.Prog = p
	}
	return launch.Run(ctx, spec)
}

// launchSelf runs spec's ranks as `a2ad NAME --worker ARGS...` with this very
// executable, the way bench, demo and tune start their ranks: each rank parses
// the launcher's own flags again.
func launchSelf(ctx context.Context, log *slog.Logger, name string, args []string, spec launch.Spec) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	spec.Prog = self
	spec.Args = append([]string{name, "--worker"}, args...)
	return launchRanks(ctx, log, spec)
}

// joinWorker joins the job a launcher started this rank in, configured by the
// A2A_* environment it set; adjust, when not nil, overrides fields first.
func joinWorker(ctx context.Context, log *slog.Logger, adjust func(*a2a.Config)) (*a2a.Comm, error) {
	cfg, err := a2a.ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	cfg.Logger = log
	if adjust != nil {
		adjust(&cfg)
	}
	return a2a.Join(ctx, cfg)
}

// bindFlag registers --bind: like mpirun, ranks are bound to one core each
// unless there are more ranks than cores.
func bindFlag(fs *flag.FlagSet) *string {
	return fs.String("bind", "core", "bind each rank to a core (core) or let the scheduler place them (none); oversubscribed ranks are never bound")
}

// bindVia is the launcher's trampoline for a --bind value.
func bindVia(bind string) string {
	if bind != "core" {
		return ""
	}
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	return self
}

func resolveProg(p string) (string, error) {
	if filepath.Base(p) != p {
		return filepath.Abs(p)
	}
	return p, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return hex.EncodeToString(b)
}
