package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/a2a/transport/shm"
	"github.com/a2a-moe/a2a/internal/credsfile"
	"github.com/a2a-moe/a2a/internal/launch"
	"github.com/a2a-moe/a2a/internal/natsd"
)

func cmdRun(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	n := fs.Int("n", 1, "ranks to start on this host")
	natsURL := fs.String("nats", "", "NATS URL of a shared control plane (default: embed one)")
	group := fs.String("group", "", "group (job) name (default: a fresh one)")
	world := fs.Int("world", 0, "ranks in the whole job when other hosts start the rest (default: -n)")
	offset := fs.Int("rank-offset", 0, "rank of the first process started here")
	// No default taken from the environment here: help prints defaults,
	// and a secret must never be printed.
	secret := fs.String("secret", "", "job secret: signs control messages and data-plane connections (default: $A2A_SECRET, the --creds file's, or random; must be shared across hosts; prefer --creds or $A2A_SECRET: a command line is visible to every user)")
	creds := fs.String("creds", "", "with --nats: a credentials file of a2ad serve (or any A2A_* KEY=VALUE file, mode 0600) whose variables the ranks get "+
		"(default: $A2A_CREDS, else serve's default file when it exists, ~/.config/a2ad/serve.env)")
	bind := bindFlag(fs)
	if err := parseFlags(fs, args); err != nil {
		return usageError{err}
	}
	if *secret == "" {
		*secret = os.Getenv("A2A_SECRET")
	}
	if *creds != "" && *natsURL == "" {
		return usagef("--creds is for --nats: the embedded control plane makes its own credentials")
	}
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "secret" })
	if err := checkBind(*bind); err != nil {
		return err
	}
	prog := fs.Args()
	if len(prog) == 0 {
		return usagef("missing program: a2ad run -n N -- PROG [ARGS]")
	}
	if *natsURL == "" && *world > *n {
		return usagef("--world %d > -n %d needs --nats pointing at a shared control plane", *world, *n)
	}
	env, err := jobCredentials(ctx, log, *creds, *natsURL, group, secret, explicit)
	if err != nil {
		return err
	}
	return launchRanks(ctx, log, launch.Spec{
		N: *n, World: *world, RankOffset: *offset, NATSURL: *natsURL,
		Group: *group, Secret: *secret, Env: env, Prog: prog[0], Args: prog[1:], Prefix: true,
		BindVia: bindVia(*bind),
	})
}

// jobCredentials settles what the ranks of `run` log in with, and may set
// their group and secret:
//   - a job file (of a2ad job new, found as runCredentials says): its login,
//     secret and, when it is pinned to one, group;
//   - serve's own file: serve mints the job's own credentials, pinned to
//     its group (mintForRun); the ranks never see serve's; a serve that
//     mints none is shared;
//   - the file's secret otherwise, unless --secret or $A2A_SECRET is set
//     (with --creds, unless --secret is).
func jobCredentials(ctx context.Context, log *slog.Logger, credsPath, natsURL string, group, secret *string, explicit bool) ([]string, error) {
	env, vars, err := runCredentials(log, credsPath, natsURL != "", os.Getenv)
	if err != nil {
		return nil, err
	}
	fileSecret := vars["A2A_SECRET"]
	switch {
	case vars["A2A_GROUP"] != "": // a job file: its login reaches its group alone
		if *group != "" && *group != vars["A2A_GROUP"] {
			return nil, usagef("--group %s: the credentials file is for group %s only", *group, vars["A2A_GROUP"])
		}
		*group = vars["A2A_GROUP"]
	case adminFile(vars):
		if *group == "" {
			*group = launch.NewGroup("job") // pinned: every host of the job gets the same
		}
		jobEnv, job, minted, err := mintForRun(ctx, log, natsURL, vars, *group)
		if err != nil {
			return nil, err
		}
		if minted {
			if explicit {
				return nil, usagef("--secret: serve mints the secret of a job with credentials of its own " +
					"(give --creds JOBFILE of a2ad job new to run with yours)")
			}
			*group, *secret = job.Group, job.Secret
			return jobEnv, nil
		}
	}
	if fileSecret != "" && ((credsPath != "" && !explicit) || *secret == "") {
		*secret = fileSecret
	}
	return env, nil
}

// runCredentials finds the credentials of the a2ad serve that `run --nats`
// joins, and returns what the ranks get and the variables of the file (nil
// without one), its job secret among them:
//   - --creds FILE: every variable of the file, which wins over the
//     environment (the secret too, unless --secret is given);
//   - else $A2A_CREDS, or else serve's default file when it exists: the ranks
//     get A2A_CREDS=FILE and read it themselves (package a2a: the
//     environment's variables win), and its secret is the job's unless
//     A2A_SECRET or --secret is set. So `a2ad run --nats URL` works with the
//     serve this user started, with no flag.
//
// Without --nats (the embedded control plane) there is nothing to find.
func runCredentials(log *slog.Logger, flagPath string, shared bool, getenv func(string) string) (env []string, vars map[string]string, err error) {
	path := flagPath
	if path == "" && shared {
		path = getenv("A2A_CREDS")
		if path == "" {
			if p, err := credsfile.DefaultPath(); err == nil {
				if _, err := os.Stat(p); err == nil {
					path = p
				}
			}
		}
	}
	if path == "" {
		return nil, nil, nil
	}
	vars, err = credsfile.Read(path)
	if err != nil {
		return nil, nil, err
	}
	if flagPath == "" {
		log.Info("a2ad: the ranks log in with the credentials file of a2ad serve (give --creds FILE for another)", "file", path)
		return []string{"A2A_CREDS=" + path}, vars, nil
	}
	for k, v := range vars {
		if k != "A2A_SECRET" {
			env = append(env, k+"="+v)
		}
	}
	slices.Sort(env)
	return env, vars, nil
}

// launchRanks fills in a fresh group and secret, embeds a control plane when
// spec.NATSURL is empty, and runs the ranks.
//
// The embedded control plane lets in only this job: the ranks log in as a
// user made for it with a fresh password, allowed the job's subjects alone
// (control.Subjects), and handed over in their environment (never on a
// command line, which every local user can read in /proc). A password rather
// than a token gives the ranks and the service users of their own, with
// different permissions; rather than an nkey, it needs no seed file on disk.
// The server listens on loopback, so the password never crosses a network.
func launchRanks(ctx context.Context, log *slog.Logger, spec launch.Spec) error {
	if spec.Group == "" {
		spec.Group = launch.NewGroup("job")
	}
	if spec.Secret == "" {
		spec.Secret = launch.NewSecret()
	}
	if spec.NATSURL == "" {
		ranks := natsd.NewUser(spec.Group, control.Subjects(spec.Group))
		cp, err := startControlPlane(log, cpConfig{Listen: "127.0.0.1:0", Secret: []byte(spec.Secret), Users: []natsd.User{ranks}})
		if err != nil {
			return err
		}
		defer cp.Close()
		spec.NATSURL = cp.URL
		spec.Env = append(slices.Clip(spec.Env), ranks.Env()...)
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

// checkBind checks a --bind value.
func checkBind(bind string) error {
	if bind != "core" && bind != "none" {
		return usagef("--bind %q: core or none", bind)
	}
	return nil
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
