package a2a

import (
	"net"
	"strconv"
	"strings"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// A launcher starts a job's ranks and tells each one its place through
// environment variables; the names are those the launcher exports ("" where
// it exports none).
type launcher struct {
	name                             string
	rank, size, localRank, localSize string
	// job are variables whose values all ranks of one job share and another
	// job's differ in: together they name the group.
	job []string
	// natsHost is a variable holding the host of the default NATS URL.
	natsHost string
}

// launchers in the order ConfigFromEnv tries them: innermost first, since
// launchers nest and the outer one's variables reach the inner one's ranks.
// torchrun run by srun or mpirun (one agent per node) sees their variables
// with the node's index as rank; the ranks of Hydra's mpiexec and Open MPI's
// mpirun inside a Slurm allocation inherit SLURM_PROCID from the daemon srun
// started on their node.
var launchers = [...]launcher{
	// MASTER_ADDR and MASTER_PORT are the job's rendezvous store: no two
	// running jobs share them. TORCHELASTIC_RUN_ID (--rdzv-id) is "none"
	// unless given, a fresh UUID with --standalone.
	{name: "torchrun", rank: "RANK", size: "WORLD_SIZE", localRank: "LOCAL_RANK", localSize: "LOCAL_WORLD_SIZE",
		job: []string{"TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"}, natsHost: "MASTER_ADDR"},
	// Open MPI 4.1's mpirun exports the job id as PMIX_NAMESPACE (and
	// OMPI_MCA_ess_base_jobid, gone in 5.0), different per mpirun.
	{name: "openmpi", rank: "OMPI_COMM_WORLD_RANK", size: "OMPI_COMM_WORLD_SIZE",
		localRank: "OMPI_COMM_WORLD_LOCAL_RANK", localSize: "OMPI_COMM_WORLD_LOCAL_SIZE", job: []string{"PMIX_NAMESPACE"}},
	// MPICH's Hydra exports no job id (its kvsname is only answered over
	// the PMI socket); Slurm's pmi2 plugin exports PMI_JOBID "job.step".
	{name: "pmi", rank: "PMI_RANK", size: "PMI_SIZE", localRank: "MPI_LOCALRANKID", localSize: "MPI_LOCALNRANKS",
		job: []string{"PMI_JOBID"}},
	{name: "slurm", rank: "SLURM_PROCID", size: "SLURM_NTASKS", localRank: "SLURM_LOCALID",
		job: []string{"SLURM_JOB_ID", "SLURM_STEP_ID"}},
}

// natsPort is the port of the default NATS URL built from a launcher's host
// (NATS's own default, and a2ad serve's).
const natsPort = "4222"

// fromLauncher fills the rank, world size, local rank and size from the
// first launcher whose rank and size variables getenv finds, and the group
// and NATS URL from it when cfg has none. No launcher found is no error.
func (cfg *Config) fromLauncher(getenv func(string) string) error {
	var l *launcher
	for i := range launchers {
		if getenv(launchers[i].rank) != "" && getenv(launchers[i].size) != "" {
			l = &launchers[i]
			break
		}
	}
	if l == nil {
		return nil
	}
	vars := []struct {
		name string
		dst  *int
	}{{l.rank, &cfg.Rank}, {l.size, &cfg.WorldSize}, {l.localRank, &cfg.LocalRank}, {l.localSize, &cfg.LocalSize}}
	for _, v := range vars {
		if v.name == "" || getenv(v.name) == "" {
			continue
		}
		s := getenv(v.name)
		n, err := strconv.Atoi(s)
		if err != nil {
			return fault.Wrap(fault.ErrInvalidArgument, -1, err, "%s=%q (%s)", v.name, s, l.name)
		}
		if n < 0 {
			return fault.New(fault.ErrInvalidArgument, -1, "%s=%d: negative (%s)", v.name, n, l.name)
		}
		*v.dst = n
	}
	switch {
	case cfg.WorldSize < 1:
		return fault.New(fault.ErrInvalidArgument, -1, "%s=%d: must be >= 1 (%s)", l.size, cfg.WorldSize, l.name)
	case cfg.Rank >= cfg.WorldSize:
		return fault.New(fault.ErrInvalidArgument, -1, "%s=%d outside [0,%d) (%s)", l.rank, cfg.Rank, cfg.WorldSize, l.name)
	case cfg.LocalSize > 0 && cfg.LocalRank >= cfg.LocalSize:
		return fault.New(fault.ErrInvalidArgument, -1, "%s=%d outside [0,%d) (%s)", l.localRank, cfg.LocalRank, cfg.LocalSize, l.name)
	}
	cfg.Launcher = l.name
	if cfg.NATSURL == "" && l.natsHost != "" {
		if h := getenv(l.natsHost); h != "" {
			cfg.NATSURL = "nats://" + net.JoinHostPort(h, natsPort)
		}
	}
	if cfg.Group != "" {
		return nil
	}
	id := []string{l.name}
	for _, v := range l.job {
		if s := getenv(v); s != "" {
			id = append(id, s)
		}
	}
	if len(id) == 1 {
		return fault.New(fault.ErrInvalidArgument, -1, "%s exports no job id (%s): set A2A_GROUP to a name all ranks of the job share",
			l.name, strings.Join(l.job, ", "))
	}
	cfg.Group = groupToken(strings.Join(id, "-"))
	return nil
}

// groupToken makes s one NATS subject token, as a group name must be: job
// ids hold dots (Slurm's "4242.0", torchrun's MASTER_ADDR).
func groupToken(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '.' || r == '*' || r == '>' || r <= ' ' || r == 0x7f {
			return '_'
		}
		return r
	}, s)
}
