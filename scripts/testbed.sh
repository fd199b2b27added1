#!/usr/bin/env bash
# testbed.sh: a multi-host a2a job on one machine, each "host" a network namespace.
#
#   scripts/testbed.sh [-H HOSTS] [-L RANKS_PER_HOST] [--delay D] [--rate R] [--a2ad PATH]
#                      [--moe PATH] [--algos A,B] [--bench-sizes S] [--bench-dist D] [--bench-counts C]
#                      [--bench-timing T]
#                      [--check-only] [--timeout SECS] [--keep-logs]
#   scripts/testbed.sh [-H HOSTS] [-L RANKS_PER_HOST] --soak DURATION [--seed N] [--soak-bin PATH]
#   scripts/testbed.sh [-H HOSTS] [-L RANKS_PER_HOST] --link-cut [--soak-bin PATH]
#   scripts/testbed.sh [-H HOSTS] [-L RANKS_PER_HOST] [--delay D] [--rate R] [--timeout SECS]
#                      --run -- PROGRAM [ARGS...]
#
# Topology (nothing outside these namespaces is touched; needs root):
#
#   netns a2a-tb-<pid>-br        bridge br0, ports vh0..vh<H-1>, no address (or, for --delay
#                                without netem, the user-space delay line on vh0..vh<H-1>)
#   netns a2a-tb-<pid>-h<i>      lo + eth0 (veth; its peer is vh<i> in the bridge namespace),
#                                address 10.77.<pid%256>.<i+1>/24
#
# The subnet exists only inside these namespaces; concurrent runs each have their own
# bridge namespace, so equal subnets never meet. <pid> is this script's process id: a later
# run deletes namespaces whose owner is no longer a running testbed.sh (leftovers of a run
# killed with SIGKILL), together with every process still inside them.
#
# Link shaping: --delay D is the one-way latency between two hosts (so RTT = 2D), --rate R
# the speed of every host's link in each direction. Both are applied as `tc netem delay D/2
# rate R` on both ends of each host's link (egress of eth0 in the host namespace and egress
# of vh<i> in the bridge namespace): a host's traffic to another crosses its own eth0 and the
# other's vh, D/2 each. Ranks of one host talk over lo, unshaped. Without sch_netem, --rate
# uses tbf on the same link ends, and --delay replaces the bridge with the user-space delay
# line cmd/delayswitch (bin/delayswitch from make build, else built with go into
# the log directory; run in the bridge namespace): an L2 learning switch over AF_PACKET
# sockets on vh0..vh<H-1> that forwards every frame D after it arrived, so host-to-host
# frames, which cross it once, take D. It
# reports the measured round trip h0-h1 at setup and its own counters, lateness and CPU use
# at the end; DELAYSWITCH_FLAGS (e.g. "--spin 50us --rtprio 0") tune it. By default it
# sleeps to each frame's due time rather than spinning before it (--spin 0): the simulated
# hosts share this machine's cores, and a line that spins takes CPU from their ranks, which
# a real network never does. Measured on 2 cores, 4 hosts x 2 ranks, 200 us, 1 KiB: with
# --spin 50us frames leave within 38 us of due (p90) but staged vs fullmesh varies 1.2-1.5x
# run to run; with --spin 0 they leave ~40 us late (p50; a wire with jitter) and the ratio
# holds at 1.7-1.8x.
#
# Steps: namespaces and links; `a2ad serve` (NATS + control service) in h0 on
# 10.77.x.1:4222, over TLS with the CA and certificate serve makes itself beyond loopback,
# its credentials (NATS user, job secret and that CA) in a 0600 file every host's
# `a2ad run --creds` reads; correctness: for every algorithm of --algos an AllToAllV bench with --check
# over sizes 0,1,1K,64K (zipf:1.1 traffic), then AllToAll once, every host running
# `a2ad run -n L` with A2A_HOST=host<i>, all hosts in parallel; rank 0's rows must all say
# #wrong 0. Then the MoE demo's ranks (bin/moe --worker, or --moe PATH; skipped if absent)
# run three verified steps: rows between ranks of one host through shared memory, the
# others by AllToAllV over the namespaces' links. Then (unless --check-only) a short benchmark per algorithm over --bench-sizes,
# printing rank 0's rows. An algorithm a2ad rejects is reported and skipped. Teardown runs
# on every exit (EXIT, INT, TERM): every process in the namespaces is killed and every
# namespace deleted (which destroys the veths).
#
# The environment reaches the ranks (a2ad run passes it on), so A2A_STREAMS, A2A_WINDOW, ...
# tune the runs. All "hosts" share this machine's cores; the ranks see that (one machine id)
# and, with more ranks than cores, do not busy-poll unless A2A_SPIN says so.
#
# --soak DURATION (e.g. 15s, 5m) runs, instead of the checks and the benchmark, the soak
# (cmd/soak, bin/soak from make build) as one job across the hosts: random verified
# operations in sessions that mix auto (shm inside a host, TCP between) and forced TCP, then
# every rank's leak check; it passes when every rank prints PASS. The seed is printed.
#
# --link-cut runs, instead, the link-cut test: the soak's link-cut ranks loop ExchangeCounts,
# a verified AllToAllV and an AllReduce; once all run, the last host's link is cut (its
# bridge port set down) mid-operation. Every rank must get a typed a2a error within 3 s of
# the cut (the script prints each rank's error and detection time); then the link comes back
# and every rank must join the same group again, in the same process, and verify 20 rounds.
#
# --run -- PROGRAM ARGS runs, instead, your own program as the job's ranks: every host runs
# `a2ad run -n L -- PROGRAM ARGS` in its namespace, so each rank gets the A2A_* variables as
# a2ad run sets them (A2A_NATS_URL, A2A_GROUP, A2A_SECRET, A2A_RANK, A2A_WORLD_SIZE = H*L,
# A2A_LOCAL_RANK, A2A_LOCAL_SIZE, and those of serve's credentials file), and A2A_HOST=host<i>
# and A2A_LISTEN (its host's address) besides: a2a.ConfigFromEnv joins the job. Every rank's
# output is printed as it comes, each line prefixed "[rank k] " as a2ad run prefixes it
# (stdout to stdout, stderr to stderr); --timeout limits the job. PROGRAM is found as a shell
# finds it (a path, or a name on PATH). The run passes when every rank exits 0; the exit
# status is 1 when any rank fails (the others are stopped 5 s after it) or --timeout ends it.
#
# Exit status: 0 all checks passed; 1 a check failed; 2 usage or setup error (not root,
# iproute2 missing after trying to install it, no netns, no netem and no go to build the
# delay line for --delay, ...);
# 128+N when stopped by signal N (after teardown).
set -uo pipefail

# The functions are in scripts/testbed/*.sh; this file holds the defaults, the state and
# the order of the steps.
TESTBED_DIR=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$TESTBED_DIR")
for part in util args teardown net jobs modes; do
	# shellcheck source=/dev/null
	source "$TESTBED_DIR/testbed/$part.sh"
done

HOSTS=4
LOCAL=2
DELAY=""
RATE=""
A2AD=""
MOE=""
ALGOS="pairwise,fullmesh"
BENCH_SIZES="1K,64K"
BENCH_DIST="uniform"
BENCH_COUNTS="known"
BENCH_TIMING="barrier"
CHECK_ONLY=0
TIMEOUT=120
KEEP_LOGS=0
SOAK=""
SEED=""
LINK_CUT=0
SOAK_BIN=""
RUN_PROG=() # --run: the user's program and its arguments

usage() {
	sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
	cat <<'EOF'
  -H HOSTS             network namespaces ("hosts"), default 4
  -L RANKS_PER_HOST    ranks started in each, default 2
  --delay D            one-way host-to-host latency, e.g. 200us, 1ms (tc netem, else
                       the user-space delay line)
  --rate R             link speed per host and direction, e.g. 1gbit, 100mbit
  --a2ad PATH          a2ad binary, default bin/a2ad of this repository (make build)
  --moe PATH           MoE demo binary, default bin/moe (make build); its check is skipped
                       when it is missing
  --algos A,B          AllToAllV algorithms to check and benchmark, default pairwise,fullmesh;
                       all: every algorithm in one job per size, marking auto's pick
  --bench-sizes S      per-peer sizes of the benchmark (a2ad bench --sizes), default 1K,64K
  --bench-dist D       traffic of the benchmark (a2ad bench --dist), default uniform
  --bench-counts C     how the benchmark's ranks know the counts (a2ad bench --counts):
                       known (default; staged then gathers the matrix in-band every
                       call), matrix (AllToAllVMatrix: staged gets it from the caller),
                       nats or inband
  --bench-timing T     a2ad bench --timing: barrier (default; slowest rank after a
                       barrier) or span (last start to last end: the hosts share this
                       machine's clock, and the barrier's exit skew of up to one
                       inter-host delay stays out)
  --check-only         correctness only, no benchmark
  --timeout SECS       limit of one job (all hosts), default 120
  --keep-logs          keep the per-host logs (their directory is printed)
  --soak DURATION      run the soak for DURATION (15s, 5m) instead of the checks
  --seed N             the soak's seed (default: random, printed)
  --link-cut           run the link-cut test instead of the checks
  --soak-bin PATH      soak binary, default bin/soak (make build)
  --run -- PROG ARGS   run PROG ARGS as the job's ranks (A2A_* set as a2ad run sets them),
                       every rank's output prefixed [rank k], instead of the checks
EOF
}

parse_args "$@"
check_args
check_prerequisites

# ---- state and teardown ---------------------------------------------------------------------

RUN=$$
PFX=a2a-tb-$RUN
BRNS=$PFX-br
NET=10.77.$((RUN % 256))
NAMESPACES=() # created by this run, bridge last
PIDS=()       # background processes started by this run
LOGDIR=""
CLEANED=0

trap cleanup EXIT
trap 'on_signal INT 2' INT
trap 'on_signal TERM 15' TERM
trap 'on_signal HUP 1' HUP
remove_leftovers

# ---- namespaces, links and control plane ---------------------------------------------------

T0=$(now_us)
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/a2a-tb.$RUN.XXXXXX") || die 2 "mktemp failed"
H0IP=$(host_ip 0)
NATS_URL=tls://$H0IP:4222
WORLD=$((HOSTS * LOCAL))
make_network
start_control_plane
measure_delay_line

# ---- jobs -----------------------------------------------------------------------------------

JOB=0
FAILED=()   # "name: reason" of failed checks
REJECTED=() # algorithms a2ad rejected
JOB_US=0    # duration of the last job
JOB_OUT=""  # host 0's stdout of the last job
ROW_RE='^\[rank 0\] +[0-9]+ +[0-9]+ '

[ ${#RUN_PROG[@]} -eq 0 ] || run_user_program
[ -z "$SOAK" ] || run_soak
[ "$LINK_CUT" = 0 ] || run_link_cut
run_checks
run_bench
summarize
