package deploy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

const slurmScript = "slurm/a2a.sbatch"

// TestSlurmScript checks the batch script with bash -n, then runs it as
// Slurm would run it on one node of a 3-task allocation: srun and scontrol are
// stand-ins (testdata/slurm) that start the step's tasks here; a2ad, its
// embedded NATS server and the ranks are real. Its settings put every listener
// on loopback, and its submit directory in a temporary directory: the job's
// credentials file must go with the job.
func TestSlurmScript(t *testing.T) {
	if out, err := exec.Command("bash", "-n", slurmScript).CombinedOutput(); err != nil {
		t.Fatalf("bash -n %s: %v\n%s", slurmScript, err, out)
	}
	standin, err := filepath.Abs(filepath.Join("testdata", "slurm"))
	if err != nil {
		t.Fatal(err)
	}
	const ntasks, jobID = 3, "4242"
	natsPort := freePort(t)
	submitDir := t.TempDir()
	run := func(t *testing.T, args ...string) *proc {
		cmd := exec.Command("bash", append([]string{slurmScript}, args...)...)
		cmd.Env = append(baseEnv(t, standin), "SLURM_SUBMIT_DIR="+submitDir,
			"SLURM_JOB_ID="+jobID, "SLURM_JOB_NODELIST=localhost", "SLURM_NNODES=1", "SLURM_NTASKS="+strconv.Itoa(ntasks),
			"NATS_PORT="+strconv.Itoa(natsPort), "METRICS_PORT="+strconv.Itoa(freePort(t)), "RANK_METRICS_PORT=0",
			"LISTEN_HOST=127.0.0.1", "NATS_HOST=127.0.0.1", "DATA_IFACE=lo")
		return start(t, "a2a.sbatch", cmd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	noCredsLeft := func(t *testing.T) {
		t.Helper()
		if left, _ := filepath.Glob(filepath.Join(submitDir, ".a2a-slurm-*")); len(left) > 0 {
			t.Errorf("the job's credentials file outlived it: %v", left)
		}
	}

	// What every rank gets: each task writes its environment and exits.
	t.Run("environment", func(t *testing.T) {
		dir := t.TempDir()
		p := run(t, "sh", "-c", `env > "$0/rank.$SLURM_PROCID"`, dir)
		if err := p.wait(t, ctx); err != nil {
			t.Fatalf("%v\n%s\n%s", err, p.stdout.String(), p.stderr.String())
		}
		noCredsLeft(t)
		var secret, user, password string
		for i := range ntasks {
			raw, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank.%d", i)))
			if err != nil {
				t.Fatal(err)
			}
			env := map[string]string{}
			for _, kv := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
				if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "A2A_") {
					env[k] = v
				}
			}
			if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(env["A2A_SECRET"]) || (secret != "" && env["A2A_SECRET"] != secret) {
				t.Errorf("rank %d: A2A_SECRET %q: want one fresh 32-byte key for all ranks", i, env["A2A_SECRET"])
			}
			secret = env["A2A_SECRET"]
			// The job's own user, minted by serve (an account of the
			// job's), not serve's own: a2ad serve's file names it "a2a".
			if !strings.HasPrefix(env["A2A_NATS_USER"], "job-") || len(env["A2A_NATS_PASSWORD"]) < 16 ||
				(user != "" && (env["A2A_NATS_USER"] != user || env["A2A_NATS_PASSWORD"] != password)) {
				t.Errorf("rank %d: NATS user %q, password of %d bytes: want the job's one user, minted by serve, for all ranks",
					i, env["A2A_NATS_USER"], len(env["A2A_NATS_PASSWORD"]))
			}
			user, password = env["A2A_NATS_USER"], env["A2A_NATS_PASSWORD"]
			cfg := rankConfig(t, env)
			if cfg.Rank != i || cfg.WorldSize != ntasks {
				t.Errorf("task %d: rank %d of %d, want %d of %d", i, cfg.Rank, cfg.WorldSize, i, ntasks)
			}
			if want := fmt.Sprintf("nats://127.0.0.1:%d", natsPort); cfg.NATSURL != want || cfg.Group != "slurm-"+jobID || cfg.Listen != "127.0.0.1:0" {
				t.Errorf("task %d: NATS %q, group %q, listen %q; want %s, slurm-%s, 127.0.0.1:0 (DATA_IFACE=lo)",
					i, cfg.NATSURL, cfg.Group, cfg.Listen, want, jobID)
			}
		}
	})

	// The default program: the MoE demo's ranks, verified.
	t.Run("moe", func(t *testing.T) {
		p := run(t)
		if err := p.wait(t, ctx); err != nil {
			t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, p.stdout.String(), p.stderr.String())
		}
		noCredsLeft(t)
		out := p.stdout.String()
		if !strings.Contains(out, "control plane ready") || !strings.Contains(out, fmt.Sprintf("steps verified on %d ranks", ntasks)) {
			t.Errorf("no control plane or no verified run:\n%s", out)
		}
	})
}
