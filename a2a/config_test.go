package a2a

import (
	"errors"
	"strings"
	"testing"
)

// clearEnv empties (for the test) every variable ConfigFromEnv reads for
// ranks and groups, so the cases do not depend on the launcher, if any, that
// runs the tests.
func clearEnv(t *testing.T) {
	names := []string{"A2A_NATS_URL", "A2A_GROUP", "A2A_RANK", "A2A_WORLD_SIZE", "A2A_LOCAL_RANK", "A2A_LOCAL_SIZE"}
	for _, l := range launchers {
		names = append(append(names, l.rank, l.size, l.localRank, l.localSize, l.natsHost), l.job...)
	}
	for _, n := range names {
		if n != "" {
			t.Setenv(n, "")
		}
	}
}

func TestConfigFromEnvLaunchers(t *testing.T) {
	type want struct {
		launcher                          string
		rank, world, localRank, localSize int
		group, nats                       string
	}
	openMPI := map[string]string{"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
		"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_NAMESPACE": "1525547009"}
	hydra := map[string]string{"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
	slurm := map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"}
	torchrun := map[string]string{"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
		"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none"}
	with := func(base map[string]string, more ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(more); i += 2 {
			m[more[i]] = more[i+1]
		}
		return m
	}
	both := func(a, b map[string]string) map[string]string {
		m := with(a)
		for k, v := range b {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want want
	}{
		{"none", nil, want{"", -1, 0, -1, 0, "", ""}},
		{"a2ad run", map[string]string{"A2A_RANK": "1", "A2A_WORLD_SIZE": "3", "A2A_LOCAL_RANK": "1", "A2A_LOCAL_SIZE": "3", "A2A_GROUP": "job-1"},
			want{"", 1, 3, 1, 3, "job-1", ""}},
		{"openmpi", openMPI, want{"openmpi", 2, 4, 0, 2, "openmpi-1525547009", ""}},
		{"hydra with A2A_GROUP", with(hydra, "A2A_GROUP", "g7"), want{"pmi", 3, 4, 1, 2, "g7", ""}},
		{"slurm pmi2", with(slurm, "PMI_RANK", "5", "PMI_SIZE", "8", "PMI_JOBID", "4242.0"), want{"pmi", 5, 8, -1, 0, "pmi-4242_0", ""}},
		{"slurm", slurm, want{"slurm", 5, 8, 1, 0, "slurm-4242-0", ""}},
		{"slurm without step", with(slurm, "SLURM_STEP_ID", ""), want{"slurm", 5, 8, 1, 0, "slurm-4242", ""}},
		{"torchrun", torchrun, want{"torchrun", 3, 8, 3, 4, "torchrun-none-10_1_2_3-29500", "nats://10.1.2.3:4222"}},
		{"torchrun IPv6", with(torchrun, "MASTER_ADDR", "fd00::1"), want{"torchrun", 3, 8, 3, 4, "torchrun-none-fd00::1-29500", "nats://[fd00::1]:4222"}},
		{"torchrun by hand", with(torchrun, "TORCHELASTIC_RUN_ID", "", "LOCAL_WORLD_SIZE", ""),
			want{"torchrun", 3, 8, 3, 0, "torchrun-10_1_2_3-29500", "nats://10.1.2.3:4222"}},
		// Launchers nest: the innermost one's ranks win.
		{"torchrun under srun", both(slurm, torchrun), want{"torchrun", 3, 8, 3, 4, "torchrun-none-10_1_2_3-29500", "nats://10.1.2.3:4222"}},
		{"mpirun under sbatch", both(slurm, openMPI), want{"openmpi", 2, 4, 0, 2, "openmpi-1525547009", ""}},
		{"rank without size is no launcher", with(slurm, "RANK", "1"), want{"slurm", 5, 8, 1, 0, "slurm-4242-0", ""}},
		// A2A_* win.
		{"A2A_RANK and size", with(openMPI, "A2A_RANK", "1", "A2A_WORLD_SIZE", "2"), want{"", 1, 2, -1, 0, "", ""}},
		{"A2A_WORLD_SIZE alone", with(slurm, "A2A_WORLD_SIZE", "8"), want{"", -1, 8, -1, 0, "", ""}},
		{"A2A group, url, local", with(torchrun, "A2A_GROUP", "mine", "A2A_NATS_URL", "nats://h:1", "A2A_LOCAL_RANK", "0", "A2A_LOCAL_SIZE", "1"),
			want{"torchrun", 3, 8, 0, 1, "mine", "nats://h:1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			cfg, err := ConfigFromEnv()
			if err != nil {
				t.Fatal(err)
			}
			got := want{cfg.Launcher, cfg.Rank, cfg.WorldSize, cfg.LocalRank, cfg.LocalSize, cfg.Group, cfg.NATSURL}
			if got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
			if cfg.WorldSize > 0 {
				if _, err := cfg.withDefaults(); err != nil {
					t.Errorf("the config does not validate: %v", err)
				}
			}
			if cfg.Launcher != "" && !strings.Contains(cfg.String(), "launcher="+cfg.Launcher) {
				t.Errorf("String() %q does not name the launcher", cfg.String())
			}
		})
	}
}

func TestConfigFromEnvBadLauncherValues(t *testing.T) {
	for _, tc := range []struct {
		env      map[string]string
		variable string // the error must name it
	}{
		{map[string]string{"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "4"}, "OMPI_COMM_WORLD_RANK"},
		{map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2.5"}, "OMPI_COMM_WORLD_LOCAL_SIZE"},
		{map[string]string{"PMI_RANK": "4", "PMI_SIZE": "4", "A2A_GROUP": "g"}, "PMI_RANK"},
		{map[string]string{"PMI_RANK": "1", "PMI_SIZE": "4"}, "A2A_GROUP"}, // Hydra: no job id
		{map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "0", "SLURM_JOB_ID": "1"}, "SLURM_NTASKS"},
		{map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "one", "SLURM_JOB_ID": "1"}, "SLURM_LOCALID"},
		{map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "A2A_GROUP"},
		{map[string]string{"RANK": "-1", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "RANK"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "LOCAL_RANK"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "A2A_LOCAL_RANK": "zero"}, "A2A_LOCAL_RANK"},
	} {
		clearEnv(t)
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		_, err := ConfigFromEnv()
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.variable) {
			t.Errorf("%v: error %v, want ErrInvalidArgument naming %s", tc.env, err, tc.variable)
		}
	}
}

// The default group must be one NATS subject token, or Join refuses it.
func TestDefaultGroupIsAToken(t *testing.T) {
	cfg, err := Config{WorldSize: 1}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Group != groupToken(cfg.Group) || cfg.Group == "" {
		t.Errorf("default group %q is not a NATS subject token", cfg.Group)
	}
}
