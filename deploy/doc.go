// Package deploy holds no code: it is the home of the files that run a2a
// beyond one machine, and its tests check what can be checked of them here.
//
//	kubernetes/   a 3-node NATS cluster, a2ad serve, the ranks as an Indexed Job
//	slurm/        a batch script: a2ad serve on the first node, one rank per task
//	prometheus/   a scrape configuration (static targets)
//	grafana/      the dashboard of the metrics package's families
//	Dockerfile    the image the Kubernetes manifests run (a2ad and the MoE demo)
//
// docs/MULTIHOST.md walks through a multi-host run with them.
//
// No cluster runs in `make test`, so the tests take the files apart instead:
// every manifest parses into the fields it uses (unknown fields fail, as
// kubectl's strict validation does); the ports of the NATS configuration, the
// containers and the Services agree; the cluster routes name the StatefulSet's
// pods through the headless Service; the Job is Indexed with completions and
// parallelism equal to A2A_WORLD_SIZE, and a2a.ConfigFromEnv reads every A2A_*
// variable a rank gets into the Config it should. The NATS configuration passes
// `nats-server -t`. Then the processes the objects describe run on this
// machine: a NATS server on that configuration, a2ad with the Deployment's
// arguments, and the Job's ranks with its command and environment (addresses
// rewritten to loopback), which must finish a verified MoE run. The Slurm
// script passes `bash -n` and runs under a stand-in for srun and scontrol
// (testdata/slurm), with the real a2ad and ranks.
package deploy
