package a2a

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// Config says how a rank joins its group. ConfigFromEnv reads it from the
// A2A_* variables that `a2ad run` sets, or from those of the launcher that
// started the rank (mpirun, mpiexec, srun, torchrun).
type Config struct {
	NATSURL       string        // A2A_NATS_URL   control plane (default nats://127.0.0.1:4222); a comma-separated list for a cluster
	Group         string        // A2A_GROUP      job name; ranks of one job share it (default "a2a")
	Rank          int           // A2A_RANK       -1: assigned at join
	WorldSize     int           // A2A_WORLD_SIZE number of ranks in the group
	Secret        string        // A2A_SECRET     data-plane authentication
	Algo          string        // A2A_ALGO       "" = auto | pairwise | fullmesh | staged | skew | ll (AllToAllV)
	AlgoAllReduce string        // A2A_ALGO_ALLREDUCE "" = auto | ring | recdoubling | hierarchical | ll (small, one host; else auto)
	Streams       int           // A2A_STREAMS    connections (and shm rings) per peer pair (default DefaultStreams)
	Window        int           // A2A_WINDOW     peers in flight at once for fullmesh (default algo.DefaultWindow, 32)
	Timeout       time.Duration // A2A_TIMEOUT    per-operation deadline when ctx has none, from when the op first waits (default 60s)
	Listen        string        // A2A_LISTEN     data-plane listen address (default: this host's address that reaches the NATS server, port 0)
	Host          string        // A2A_HOST       host identity; ranks with equal ones share memory (default HostIdentity())
	Transport     string        // A2A_TRANSPORT  auto (each pair: the first provider that links it) | a provider's name: shm, verbs, tcp
	Spin          time.Duration // A2A_SPIN       busy-poll time before yielding the core (0: 50us, or none when this host runs more ranks than cores; negative: none)
	Yield         time.Duration // A2A_YIELD      sched_yield time before parking (default 1ms)
	Links         string        // A2A_LINKS      link table: "" built-in | "probe" measured at join | path of `a2ad tune` output (rank 0's counts)
	LLBytes       int           // A2A_LL_BYTES   largest block sent by the LL protocol (0: DefaultLLBytes; negative: no LL unless A2A_ALGO=ll)
	LocalRank     int           // A2A_LOCAL_RANK index among the job's ranks on this host, as the launcher says (ConfigFromEnv: -1 if none does); Join does not use it
	LocalSize     int           // A2A_LOCAL_SIZE the job's ranks on this host, as the launcher says (0: not known); Join does not use it
	Launcher      string        // who set Rank and WorldSize: "" for A2A_* (or the program), else a launcher's name (see ConfigFromEnv)
	Report        time.Duration // A2A_REPORT     how often the rank reports its traffic to a2ad's live view (0: DefaultReportPeriod; negative: never)

	// How the rank logs in to NATS (see natsopts.go); user, password or
	// token may also be in NATSURL.
	NATSCreds    string // A2A_NATS_CREDS    credentials file (user JWT and nkey seed)
	NATSNKey     string // A2A_NATS_NKEY     nkey seed file
	NATSUser     string // A2A_NATS_USER     user name (with NATSPassword)
	NATSPassword string // A2A_NATS_PASSWORD
	NATSToken    string // A2A_NATS_TOKEN    token
	NATSTLSCA    string // A2A_NATS_TLS_CA   CA the server's certificate must chain to (turns TLS on): a PEM file, or the PEM itself as a2ad serve's credentials file holds it
	NATSTLSCert  string // A2A_NATS_TLS_CERT client certificate file, for servers that verify clients
	NATSTLSKey   string // A2A_NATS_TLS_KEY  its key file
	// CredsFile is the credentials file ConfigFromEnv read the fields
	// above from (A2A_CREDS: the one a2ad serve writes), for the errors
	// that say which credentials were refused; Join does not read it.
	CredsFile string

	// HeartbeatInterval and PeerTimeout tune failure detection (defaults
	// 250ms and 1.5s: a dead rank is noticed by everyone within 3s).
	HeartbeatInterval time.Duration
	PeerTimeout       time.Duration

	Logger   *slog.Logger // nil: slog.Default()
	Observer Observer     // nil: none; metrics.Observer implements it

	// Providers are the data planes to use, in order of preference (nil:
	// DefaultProviders). Every rank of a group must list the same ones in
	// the same order; Transport may force one of them by name.
	Providers []transport.Provider
}

// ConfigFromEnv reads a Config from the A2A_* environment variables.
//
// When neither A2A_RANK nor A2A_WORLD_SIZE is set, the rank, world size and
// local rank come from the launcher that started the process, the first of
// these whose rank and size variables are both set:
//
//	torchrun  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; job TORCHELASTIC_RUN_ID, MASTER_ADDR, MASTER_PORT
//	openmpi   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; job PMIX_NAMESPACE
//	pmi       PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS (MPICH's Hydra, Slurm's pmi2); job PMI_JOBID
//	slurm     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; job SLURM_JOB_ID, SLURM_STEP_ID
//
// Config.Launcher names the one found. Unless A2A_GROUP is set, the group is
// the launcher's name and its job variables' values (e.g. "slurm-4242-0");
// a launcher that exports none (Hydra's mpiexec) needs A2A_GROUP. torchrun's
// MASTER_ADDR is the default control-plane host (nats://MASTER_ADDR:4222)
// when A2A_NATS_URL is unset. A2A_* variables that are set always win.
//
// A2A_CREDS names a credentials file, the one `a2ad serve` writes or a job
// file of `a2ad job new`: its NATS login (A2A_NATS_USER, A2A_NATS_PASSWORD
// or another A2A_NATS_* way), TLS CA (A2A_NATS_TLS_CA), A2A_SECRET and, in a
// job file, A2A_GROUP (before a launcher's) fill what the environment leaves unset,
// so that a launcher passes one variable (mpirun -x A2A_CREDS). A login set
// in the environment replaces the file's whole.
func ConfigFromEnv() (Config, error) {
	getenv, credsFile, err := withCredsFile(os.Getenv)
	if err != nil {
		return Config{Rank: -1, LocalRank: -1}, err
	}
	cfg := Config{
		CredsFile:     credsFile,
		NATSURL:       os.Getenv("A2A_NATS_URL"),
		Group:         getenv("A2A_GROUP"),
		Rank:          -1,
		LocalRank:     -1,
		Secret:        getenv("A2A_SECRET"),
		Algo:          os.Getenv("A2A_ALGO"),
		AlgoAllReduce: os.Getenv("A2A_ALGO_ALLREDUCE"),
		Listen:        os.Getenv("A2A_LISTEN"),
		Host:          os.Getenv("A2A_HOST"),
		Transport:     os.Getenv("A2A_TRANSPORT"),
		Links:         os.Getenv("A2A_LINKS"),
		NATSCreds:     getenv("A2A_NATS_CREDS"),
		NATSNKey:      getenv("A2A_NATS_NKEY"),
		NATSUser:      getenv("A2A_NATS_USER"),
		NATSPassword:  getenv("A2A_NATS_PASSWORD"),
		NATSToken:     getenv("A2A_NATS_TOKEN"),
		NATSTLSCA:     getenv("A2A_NATS_TLS_CA"),
		NATSTLSCert:   getenv("A2A_NATS_TLS_CERT"),
		NATSTLSKey:    getenv("A2A_NATS_TLS_KEY"),
	}
	if os.Getenv("A2A_RANK") == "" && os.Getenv("A2A_WORLD_SIZE") == "" {
		if err := cfg.fromLauncher(os.Getenv); err != nil {
			return cfg, err
		}
	}
	ints := []struct {
		name string
		dst  *int
	}{{"A2A_RANK", &cfg.Rank}, {"A2A_WORLD_SIZE", &cfg.WorldSize}, {"A2A_STREAMS", &cfg.Streams}, {"A2A_WINDOW", &cfg.Window}, {"A2A_LL_BYTES", &cfg.LLBytes},
		{"A2A_LOCAL_RANK", &cfg.LocalRank}, {"A2A_LOCAL_SIZE", &cfg.LocalSize}}
	for _, v := range ints {
		if s := os.Getenv(v.name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil {
				return cfg, fault.Wrap(fault.ErrInvalidArgument, -1, err, "%s=%q", v.name, s)
			}
			*v.dst = n
		}
	}
	durations := []struct {
		name string
		dst  *time.Duration
	}{{"A2A_TIMEOUT", &cfg.Timeout}, {"A2A_SPIN", &cfg.Spin}, {"A2A_YIELD", &cfg.Yield}, {"A2A_REPORT", &cfg.Report}}
	for _, v := range durations {
		if s := os.Getenv(v.name); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil {
				return cfg, fault.Wrap(fault.ErrInvalidArgument, -1, err, "%s=%q", v.name, s)
			}
			*v.dst = d
		}
	}
	return cfg, nil
}

// DefaultStreams is the number of streams per peer pair. Two let the
// frames of one large message alternate between connections: 4 ranks on 2
// cores over TCP, 1 MiB AllToAll 1434-1544 us with two against 2647-2891 us
// with one (Open MPI 1849 us), 4 MiB 8289-8633 against 14163-14597 us; 2
// ranks, small messages and shared memory showed no difference.
const DefaultStreams = 2

// DefaultLLBytes is the largest block of an AllToAllV between two ranks of
// one host that auto selection sends by the LL protocol (one-sided stores
// into the peer's slot, no handshake) instead of as ring frames; the shm
// slot size (shm.DefaultSlotBytes, also 4096: LL is ahead of frames to
// there, see its measurement) caps it. With A2A_ALGO=ll it is also the cutoff for
// ranks on other hosts, whose LL messages travel as one frame each.
const DefaultLLBytes = 4096

// withDefaults fills unset fields and validates the rest.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.NATSURL == "" {
		cfg.NATSURL = "nats://127.0.0.1:4222"
	}
	if cfg.Group == "" {
		cfg.Group = "a2a"
	}
	if cfg.Streams == 0 {
		cfg.Streams = DefaultStreams
	}
	if cfg.Window == 0 {
		cfg.Window = algo.DefaultWindow
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 60 * time.Second
	}
	if cfg.LLBytes == 0 {
		cfg.LLBytes = DefaultLLBytes
	}
	if cfg.Report == 0 {
		cfg.Report = DefaultReportPeriod
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch {
	case cfg.WorldSize < 1:
		return cfg, fault.New(fault.ErrInvalidArgument, -1, "world size %d: must be >= 1 (A2A_WORLD_SIZE)", cfg.WorldSize)
	case cfg.Rank < -1 || cfg.Rank >= cfg.WorldSize:
		return cfg, fault.New(fault.ErrInvalidArgument, -1, "rank %d outside [0,%d) (A2A_RANK; -1 assigns one)", cfg.Rank, cfg.WorldSize)
	case cfg.Streams < 1 || cfg.Streams > 64:
		return cfg, fault.New(fault.ErrInvalidArgument, -1, "streams %d: must be in 1..64", cfg.Streams)
	case cfg.Window < 1:
		return cfg, fault.New(fault.ErrInvalidArgument, -1, "window %d: must be >= 1", cfg.Window)
	case cfg.Timeout < 0 || cfg.Yield < 0:
		return cfg, fault.New(fault.ErrInvalidArgument, -1, "negative duration in config")
	}
	if _, err := cfg.providers(); err != nil {
		return cfg, err
	}
	a, err := parseAlgo(cfg.Algo)
	if err != nil {
		return cfg, err
	}
	if a == algo.AlgoAuto {
		// "auto" (A2A_ALGO=auto, a2ad bench --algo auto) is the automatic
		// choice, as "" is: the matrix-aware choice and the LL cutoffs test
		// for "".
		cfg.Algo = ""
	}
	if _, err := parseAllReduceAlgo(cfg.AlgoAllReduce); err != nil {
		return cfg, err
	}
	return cfg, nil
}

func (cfg Config) String() string {
	s := fmt.Sprintf("group=%s rank=%d world=%d algo=%q streams=%d", cfg.Group, cfg.Rank, cfg.WorldSize, cfg.Algo, cfg.Streams)
	if cfg.Launcher != "" {
		s += " launcher=" + cfg.Launcher
	}
	return s
}

func parseAlgo(name string) (algo.Algo, error) {
	a, err := algo.ParseAlgo(name)
	if err != nil {
		return a, fault.Wrap(fault.ErrInvalidArgument, -1, err, "A2A_ALGO")
	}
	switch a {
	case algo.AlgoAuto, algo.AlgoPairwise, algo.AlgoFullmesh, algo.AlgoStaged, algo.AlgoSkew, algo.AlgoLL:
		return a, nil
	}
	return a, fault.New(fault.ErrInvalidArgument, -1, "algorithm %q is not available for AllToAllV (auto, pairwise, fullmesh, staged, skew, ll)", name)
}

// parseAllReduceAlgo validates A2A_ALGO_ALLREDUCE.
func parseAllReduceAlgo(name string) (algo.Algo, error) {
	a, err := algo.ParseAlgo(name)
	if err != nil {
		return a, fault.Wrap(fault.ErrInvalidArgument, -1, err, "A2A_ALGO_ALLREDUCE")
	}
	switch a {
	case algo.AlgoAuto, algo.AlgoRing, algo.AlgoRecursiveDoubling, algo.AlgoHierarchical, algo.AlgoLL:
		return a, nil
	}
	return a, fault.New(fault.ErrInvalidArgument, -1, "algorithm %q is not available for AllReduce (ring, recdoubling, hierarchical, ll)", name)
}
