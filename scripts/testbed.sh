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

say() { printf 'testbed: %s\n' "$*"; }
warn() { printf 'testbed: %s\n' "$*" >&2; }
die() {
	local code=$1
	shift
	warn "$*"
	exit "$code"
}

# join_by SEP WORDS... prints the words separated by SEP.
join_by() {
	local sep=$1 out=""
	shift
	for w in "$@"; do
		out+="${out:+$sep}$w"
	done
	printf '%s' "$out"
}

# now_us is the wall clock in microseconds.
now_us() { echo "${EPOCHREALTIME/./}"; }
# secs formats a microsecond interval as seconds with two decimals.
secs() { printf '%d.%02ds' $(($1 / 1000000)) $(($1 % 1000000 / 10000)); }

# await PID LOG DEADLINE EXITED CMD...: waits until CMD succeeds, polling every 0.05 s.
# Dies with EXITED and LOG's tail if PID exits first; returns 1 once SECONDS reaches
# DEADLINE (the caller dies with its own message).
await() {
	local pid=$1 log=$2 deadline=$3 exited=$4
	shift 4
	until "$@"; do
		kill -0 "$pid" 2>/dev/null || die 2 "$exited: $(tail -n 5 "$log")"
		[ "$SECONDS" -lt "$deadline" ] || return 1
		sleep 0.05
	done
}

# ---- arguments ----------------------------------------------------------------------------

need_arg() { [ "$2" -ge 2 ] || die 2 "$1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
	opt=$1
	val=""
	case $opt in
	--*=*)
		val=${opt#*=}
		opt=${opt%%=*}
		set -- "$opt" "$val" "${@:2}"
		;;
	esac
	case $opt in
	-H | --hosts) need_arg "$opt" $#; HOSTS=$2; shift 2 ;;
	-L | --ranks-per-host) need_arg "$opt" $#; LOCAL=$2; shift 2 ;;
	--delay) need_arg "$opt" $#; DELAY=$2; shift 2 ;;
	--rate) need_arg "$opt" $#; RATE=$2; shift 2 ;;
	--a2ad) need_arg "$opt" $#; A2AD=$2; shift 2 ;;
	--moe) need_arg "$opt" $#; MOE=$2; shift 2 ;;
	--algos) need_arg "$opt" $#; ALGOS=$2; shift 2 ;;
	--bench-sizes) need_arg "$opt" $#; BENCH_SIZES=$2; shift 2 ;;
	--bench-dist) need_arg "$opt" $#; BENCH_DIST=$2; shift 2 ;;
	--bench-counts) need_arg "$opt" $#; BENCH_COUNTS=$2; shift 2 ;;
	--bench-timing) need_arg "$opt" $#; BENCH_TIMING=$2; shift 2 ;;
	--check-only) CHECK_ONLY=1; shift ;;
	--timeout) need_arg "$opt" $#; TIMEOUT=$2; shift 2 ;;
	--keep-logs) KEEP_LOGS=1; shift ;;
	--soak) need_arg "$opt" $#; SOAK=$2; shift 2 ;;
	--seed) need_arg "$opt" $#; SEED=$2; shift 2 ;;
	--link-cut) LINK_CUT=1; shift ;;
	--soak-bin) need_arg "$opt" $#; SOAK_BIN=$2; shift 2 ;;
	--run)
		shift
		[ "${1:-}" = -- ] && shift
		[ $# -gt 0 ] || die 2 "--run needs a program: --run -- PROGRAM [ARGS...]"
		RUN_PROG=("$@")
		break
		;;
	-h | --help) usage; exit 0 ;;
	*) usage >&2; die 2 "unknown argument: $opt" ;;
	esac
done

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
if ! is_uint "$HOSTS" || [ "$HOSTS" -lt 1 ] || [ "$HOSTS" -gt 200 ]; then
	die 2 "-H $HOSTS: need 1..200 hosts"
fi
if ! is_uint "$LOCAL" || [ "$LOCAL" -lt 1 ]; then
	die 2 "-L $LOCAL: need at least one rank per host"
fi
if ! is_uint "$TIMEOUT" || [ "$TIMEOUT" -lt 1 ]; then
	die 2 "--timeout $TIMEOUT: seconds >= 1"
fi
[ -n "$ALGOS" ] || die 2 "--algos is empty"
case $BENCH_COUNTS in
known | matrix | nats | inband) ;;
*) die 2 "--bench-counts $BENCH_COUNTS: known, matrix, nats or inband" ;;
esac
case $BENCH_TIMING in
barrier | span) ;;
*) die 2 "--bench-timing $BENCH_TIMING: barrier or span" ;;
esac
IFS=, read -r -a ALGO_LIST <<<"$ALGOS"
if [ -n "$SOAK" ]; then
	[[ $SOAK =~ ^([0-9]+)(s|m)$ ]] || die 2 "--soak $SOAK: want N followed by s or m (e.g. 15s, 5m)"
	soak_secs=$((10#${BASH_REMATCH[1]}))
	[ "${BASH_REMATCH[2]}" = m ] && soak_secs=$((soak_secs * 60))
	# The job's limit: the soak, its last session and the leak check.
	[ "$TIMEOUT" -ge $((soak_secs + 120)) ] || TIMEOUT=$((soak_secs + 120))
	[ -n "$SEED" ] || SEED=$(((RANDOM << 30 | RANDOM << 15 | RANDOM) + 1))
	is_uint "$SEED" && [ "$SEED" -gt 0 ] || die 2 "--seed $SEED: a positive integer"
fi
[ -n "$SOAK" ] && [ "$LINK_CUT" = 1 ] && die 2 "--soak and --link-cut: one at a time"
[ "$LINK_CUT" = 1 ] && [ "$HOSTS" -lt 2 ] && die 2 "--link-cut needs at least 2 hosts"
if [ ${#RUN_PROG[@]} -gt 0 ] && { [ -n "$SOAK" ] || [ "$LINK_CUT" = 1 ]; }; then
	die 2 "--run: not with --soak or --link-cut (one at a time)"
fi
for a in "${ALGO_LIST[@]}"; do
	[[ $a =~ ^[a-z0-9_-]+$ ]] || die 2 "--algos: bad algorithm name '$a'"
done

# Delay in microseconds, halved per link end (printed with a .5 when odd).
DELAY_US=0
if [ -n "$DELAY" ]; then
	if [[ $DELAY =~ ^([0-9]+)(us|ms|s)$ ]]; then
		case ${BASH_REMATCH[2]} in
		us) DELAY_US=$((10#${BASH_REMATCH[1]})) ;;
		ms) DELAY_US=$((10#${BASH_REMATCH[1]} * 1000)) ;;
		s) DELAY_US=$((10#${BASH_REMATCH[1]} * 1000000)) ;;
		esac
	else
		die 2 "--delay $DELAY: want N followed by us, ms or s (e.g. 200us)"
	fi
fi
HALF_DELAY="$((DELAY_US / 2)).$((DELAY_US % 2 * 5))us"

# Rate in bytes per second (tc units: bit = bits/s, bps = bytes/s), for tbf's burst.
RATE_BPS=0
if [ -n "$RATE" ]; then
	RATE=${RATE,,}
	if [[ $RATE =~ ^([0-9]+)([kmgt]?)(bit|bps)$ ]]; then
		n=$((10#${BASH_REMATCH[1]}))
		case ${BASH_REMATCH[2]} in
		k) n=$((n * 1000)) ;;
		m) n=$((n * 1000000)) ;;
		g) n=$((n * 1000000000)) ;;
		t) n=$((n * 1000000000000)) ;;
		esac
		[ "${BASH_REMATCH[3]}" = bit ] && n=$((n / 8))
		RATE_BPS=$n
	fi
	[ "$RATE_BPS" -gt 0 ] || die 2 "--rate $RATE: want N followed by bit, kbit, mbit, gbit (or bps, kbps, ...)"
fi

# ---- prerequisites --------------------------------------------------------------------------

[ "$(id -u)" = 0 ] || die 2 "needs root for network namespaces (run with sudo)"
if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
	warn "iproute2 missing: installing it with apt-get"
	if command -v apt-get >/dev/null 2>&1; then
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 >/dev/null 2>&1
	fi
	if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
		die 2 "iproute2 (ip, tc) missing and apt-get could not install it"
	fi
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# need_exe VAR WHAT [HINT]: makes the path in VAR absolute; dies unless it is executable.
need_exe() {
	local -n exe=$1
	case $exe in /*) ;; *) exe=$PWD/$exe ;; esac
	[ -x "$exe" ] || die 2 "$2 binary $exe not found${3:+: $3}"
}
[ -n "$A2AD" ] || A2AD=$ROOT/bin/a2ad
need_exe A2AD a2ad "run make build, or pass --a2ad PATH"
if [ -n "$SOAK" ] || [ "$LINK_CUT" = 1 ]; then
	[ -n "$SOAK_BIN" ] || SOAK_BIN=$ROOT/bin/soak
	need_exe SOAK_BIN soak "run make build, or pass --soak-bin PATH"
fi
if [ ${#RUN_PROG[@]} -gt 0 ]; then
	# As a shell finds it, then absolute: the ranks start in other namespaces.
	case ${RUN_PROG[0]} in
	*/*) need_exe "RUN_PROG[0]" "--run: program" ;;
	*)
		prog=$(command -v -- "${RUN_PROG[0]}") || die 2 "--run: program ${RUN_PROG[0]} not found on PATH"
		RUN_PROG[0]=$prog
		need_exe "RUN_PROG[0]" "--run: program"
		;;
	esac
fi
if [ -n "$MOE" ]; then
	need_exe MOE MoE
elif [ -x "$ROOT/bin/moe" ]; then
	MOE=$ROOT/bin/moe
fi

# Started processes get SIGTERM if this shell dies without running its traps (SIGKILL).
PDEATH=()
if [[ $(setpriv --help 2>&1) == *--pdeathsig* ]]; then
	PDEATH=(setpriv --pdeathsig TERM)
fi

# ---- teardown -------------------------------------------------------------------------------

RUN=$$
PFX=a2a-tb-$RUN
BRNS=$PFX-br
NET=10.77.$((RUN % 256))
NAMESPACES=() # created by this run, bridge last
PIDS=()       # background processes started by this run
LOGDIR=""
CLEANED=0

# kill_ns_procs kills every process inside the given namespaces: SIGTERM, then SIGKILL
# after 3 s for those still there.
kill_ns_procs() {
	local ns pids=() more p
	for ns in "$@"; do
		mapfile -t more < <(ip netns pids "$ns" 2>/dev/null)
		pids+=("${more[@]}")
	done
	[ ${#pids[@]} -gt 0 ] || return 0
	kill -TERM "${pids[@]}" 2>/dev/null
	for _ in $(seq 30); do
		local alive=()
		for p in "${pids[@]}"; do
			kill -0 "$p" 2>/dev/null && alive+=("$p")
		done
		[ ${#alive[@]} -gt 0 ] || return 0
		pids=("${alive[@]}")
		sleep 0.1
	done
	kill -KILL "${pids[@]}" 2>/dev/null
	return 0
}

cleanup() {
	[ "$CLEANED" = 1 ] && return
	CLEANED=1
	local p ns
	for p in "${PIDS[@]}"; do
		kill -TERM "$p" 2>/dev/null
	done
	kill_ns_procs "${NAMESPACES[@]}"
	for p in "${PIDS[@]}"; do
		kill -KILL "$p" 2>/dev/null
		wait "$p" 2>/dev/null
	done
	for ns in "${NAMESPACES[@]}"; do
		ip netns del "$ns" 2>/dev/null || warn "could not delete namespace $ns"
	done
	if [ -n "$LOGDIR" ]; then
		if [ "$KEEP_LOGS" = 1 ]; then
			warn "logs kept in $LOGDIR"
		else
			rm -rf "$LOGDIR"
		fi
	fi
}

# shellcheck disable=SC2317 # called by the traps below
on_signal() {
	warn "interrupted by SIG$1: tearing down"
	cleanup
	trap - "$1"
	exit $((128 + $2))
}
trap cleanup EXIT
trap 'on_signal INT 2' INT
trap 'on_signal TERM 15' TERM
trap 'on_signal HUP 1' HUP

# Leftovers of earlier runs whose owner is gone (killed with SIGKILL, machine rebooted
# processes, ...): a namespace a2a-tb-<pid>-* whose <pid> is not a running testbed.sh.
owner_alive() {
	grep -qa 'testbed\.sh' "/proc/$1/cmdline" 2>/dev/null
}
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^a2a-tb-[0-9]+-'); do
	owner=${ns#a2a-tb-}
	owner=${owner%%-*}
	[ "$owner" = "$RUN" ] && continue
	owner_alive "$owner" && continue
	kill_ns_procs "$ns"
	ip netns del "$ns" 2>/dev/null && warn "removed leftover namespace $ns (run $owner is gone)"
done
for dir in "${TMPDIR:-/tmp}"/a2a-tb.[0-9]*.*; do
	[ -d "$dir" ] || continue
	owner=${dir##*/a2a-tb.}
	owner=${owner%%.*}
	owner_alive "$owner" || rm -rf "$dir"
done

# ---- namespaces and links -------------------------------------------------------------------

T0=$(now_us)
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/a2a-tb.$RUN.XXXXXX") || die 2 "mktemp failed"
host_ns() { echo "$PFX-h$1"; }
host_ip() { echo "$NET.$(($1 + 1))"; }
H0IP=$(host_ip 0)
NATS_URL=tls://$H0IP:4222
WORLD=$((HOSTS * LOCAL))

# setup runs one setup command, exiting 2 with its error output when it fails.
setup() {
	local out
	if ! out=$("$@" 2>&1); then
		die 2 "setup failed: $*: $out"
	fi
}

# shape puts the link emulation on one end of a host's link: shape NS DEV.
shape() {
	local ns=$1 dev=$2
	[ -n "$DELAY$RATE" ] || return 0
	if [ "$USE_NETEM" = 1 ]; then
		local args=(netem)
		[ -n "$DELAY" ] && args+=(delay "$HALF_DELAY")
		[ -n "$RATE" ] && args+=(rate "$RATE")
		setup tc -n "$ns" qdisc replace dev "$dev" root "${args[@]}"
		return 0
	fi
	# Without netem the delay is the delay line's (USER_DELAY); tbf shapes the rate:
	# burst of 1 ms at the rate (at least 64 KiB so one GSO packet fits).
	[ -n "$RATE" ] || return 0
	local burst=$((RATE_BPS / 1000))
	[ "$burst" -ge 65536 ] || burst=65536
	setup tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$RATE" burst "$burst" latency 100ms
}

setup ip netns add "$BRNS"
NAMESPACES+=("$BRNS")
setup ip -n "$BRNS" link set lo up
setup ip -n "$BRNS" link add br0 type bridge
setup ip -n "$BRNS" link set br0 up

# netem shapes when the kernel has it (probed on br0, which carries no shaping itself);
# without it --delay takes the user-space delay line instead of the bridge and --rate
# falls back to tbf.
USE_NETEM=0
USER_DELAY=0
if [ -n "$DELAY$RATE" ]; then
	modprobe sch_netem >/dev/null 2>&1 # built in, or no modules at all: the probe decides
	if tc -n "$BRNS" qdisc replace dev br0 root netem delay 1us >/dev/null 2>&1; then
		USE_NETEM=1
		setup tc -n "$BRNS" qdisc del dev br0 root
	else
		[ -n "$RATE" ] && warn "this kernel lacks tc netem: shaping --rate $RATE with tbf"
		[ -n "$DELAY" ] && USER_DELAY=1
	fi
fi
SWITCH=""
SWITCH_PID=""
if [ "$USER_DELAY" = 1 ] && [ -x "$ROOT/bin/delayswitch" ]; then
	SWITCH=$ROOT/bin/delayswitch # make build
elif [ "$USER_DELAY" = 1 ]; then
	GO=${GO:-go}
	command -v "$GO" >/dev/null 2>&1 ||
		die 2 "--delay: this kernel lacks tc netem (CONFIG_NET_SCH_NETEM / module sch_netem), there is no bin/delayswitch (make build) and no go ($GO) to build the user-space delay line"
	SWITCH=$LOGDIR/delayswitch
	if ! out=$(cd "$ROOT" && "$GO" build -o "$SWITCH" ./cmd/delayswitch 2>&1); then
		die 2 "--delay: building the user-space delay line failed: $out"
	fi
fi
if [ "$USER_DELAY" = 1 ]; then
	setup ip -n "$BRNS" link del br0 # the delay line is the switch
fi
for ((i = 0; i < HOSTS; i++)); do
	ns=$(host_ns "$i")
	setup ip netns add "$ns"
	NAMESPACES=("$ns" "${NAMESPACES[@]}")
	setup ip -n "$ns" link set lo up
	setup ip -n "$ns" link add eth0 type veth peer name "vh$i" netns "$BRNS"
	setup ip -n "$ns" addr add "$(host_ip "$i")/24" dev eth0
	setup ip -n "$ns" link set eth0 up
	[ "$USER_DELAY" = 1 ] || setup ip -n "$BRNS" link set "vh$i" master br0
	setup ip -n "$BRNS" link set "vh$i" up
	shape "$ns" eth0
	shape "$BRNS" "vh$i"
done
# The delay line: every frame between two hosts leaves it DELAY after it arrived. It runs
# in the bridge namespace, so teardown kills it with everything else there; it also dies
# with this shell (parent-death signal). Real-time priority: the wire's delay should not
# depend on how busy the hosts' ranks keep the cores (a SCHED_FIFO thread that sleeps
# between frames, and to each frame's due time; see the header for --spin).
if [ "$USER_DELAY" = 1 ]; then
	ports=()
	for ((i = 0; i < HOSTS; i++)); do
		ports+=("vh$i")
	done
	read -r -a switch_flags <<<"${DELAYSWITCH_FLAGS:-}"
	"${PDEATH[@]}" ip netns exec "$BRNS" "$SWITCH" --delay "${DELAY_US}us" --rtprio 10 --spin 0 "${switch_flags[@]}" \
		"${ports[@]}" >"$LOGDIR/delayswitch.log" 2>&1 &
	SWITCH_PID=$!
	PIDS+=("$SWITCH_PID")
	await "$SWITCH_PID" "$LOGDIR/delayswitch.log" $((SECONDS + 5)) "the delay line exited" \
		grep -q '^delayswitch: ready' "$LOGDIR/delayswitch.log" ||
		die 2 "the delay line is not ready after 5s: $(tail -n 5 "$LOGDIR/delayswitch.log")"
fi
SHAPING="none"
if [ -n "$DELAY$RATE" ]; then
	if [ "$USER_DELAY" = 1 ]; then
		SHAPING="delay $DELAY one-way (user-space delay line)${RATE:+, rate $RATE per direction (tbf)}"
	else
		SHAPING="${DELAY:+delay $DELAY one-way ($HALF_DELAY per link end)}${DELAY:+${RATE:+, }}${RATE:+rate $RATE per direction}"
		[ "$USE_NETEM" = 1 ] && SHAPING+=" (netem)" || SHAPING+=" (tbf)"
	fi
fi
# Every "host" runs on this machine's cores; the ranks see that themselves (one machine id)
# and stop spinning when they outnumber the cores, as the bench header's spin= shows.
say "$HOSTS hosts x $LOCAL ranks in namespaces $PFX-h0..h$((HOSTS - 1)) on $NET.0/24, bridge in $BRNS; shaping: $SHAPING"

# ---- control plane --------------------------------------------------------------------------

# The control plane listens beyond loopback, so over TLS: a2ad serve makes a CA and a
# certificate for its address itself, and writes the CA into its credentials file, which
# the ranks read (a2ad run --creds): nothing made by hand, as docs/MULTIHOST.md promises.
CREDS=$LOGDIR/serve.env
"${PDEATH[@]}" ip netns exec "$(host_ns 0)" "$A2AD" serve --listen "$H0IP:4222" --metrics '' \
	--creds "$CREDS" \
	>"$LOGDIR/serve.log" 2>&1 &
SERVE_PID=$!
PIDS+=("$SERVE_PID")
# Wait until every host reaches the NATS port: the server listens and every link works.
deadline=$((SECONDS + 15))
reaches_nats() { timeout 2 ip netns exec "$(host_ns "$1")" bash -c "exec 3<>/dev/tcp/$H0IP/4222" 2>/dev/null; }
for ((i = 0; i < HOSTS; i++)); do
	await "$SERVE_PID" "$LOGDIR/serve.log" "$deadline" "a2ad serve exited in $(host_ns 0)" reaches_nats "$i" ||
		die 2 "host $i ($(host_ns "$i")) cannot reach the control plane at $H0IP:4222 after 15s"
done
await "$SERVE_PID" "$LOGDIR/serve.log" "$deadline" "a2ad serve exited in $(host_ns 0)" \
	grep -q '^a2ad: TLS with a CA made for this start' "$LOGDIR/serve.log" ||
	die 2 "a2ad serve beyond loopback does not say it serves TLS with a CA of its own: $(tail -n 5 "$LOGDIR/serve.log")"
T_SETUP=$(($(now_us) - T0))
say "control plane at $NATS_URL in $(host_ns 0), TLS with serve's own CA; setup took $(secs "$T_SETUP")"

# The delay line's round trip h0-h1 as the ranks will see it (TCP, one byte each way):
# 2 x --delay plus the hosts' own stack and wake-up costs.
if [ "$USER_DELAY" = 1 ] && [ "$HOSTS" -ge 2 ]; then
	"${PDEATH[@]}" ip netns exec "$(host_ns 1)" "$SWITCH" rtt --listen "$(host_ip 1):4299" \
		>"$LOGDIR/rtt.log" 2>&1 &
	rtt_pid=$!
	PIDS+=("$rtt_pid")
	if rtt=$(timeout 20 ip netns exec "$(host_ns 0)" "$SWITCH" rtt --connect "$(host_ip 1):4299" \
		--count 100 --interval 500us 2>&1); then
		say "delay line: round trip h0->h1 (TCP ping-pong) ${rtt#rtt * }; want 2 x $DELAY + the hosts' stack"
	else
		warn "delay line: could not measure the round trip h0-h1: $rtt"
	fi
	kill -TERM "$rtt_pid" 2>/dev/null
	wait "$rtt_pid" 2>/dev/null
fi

# ---- jobs -----------------------------------------------------------------------------------

JOB=0
FAILED=()   # "name: reason" of failed checks
REJECTED=() # algorithms a2ad rejected
JOB_US=0    # duration of the last job
JOB_OUT=""  # host 0's stdout of the last job
ROW_RE='^\[rank 0\] +[0-9]+ +[0-9]+ '

# start_job NAME ARGS...: starts `WORKER ARGS` as one job of H*L ranks, every host's ranks
# started by `a2ad run` in its namespace, all hosts in parallel, and returns. WORKER is the
# caller's local array (bash scoping is dynamic): call it through bench_job, moe_job or a
# function of that kind. JOB_TAG names the job's logs: $LOGDIR/<JOB_TAG>.h<i>.{out,err};
# JOB_OUT is host 0's stdout. With JOB_STREAM=1 (also the caller's local) the ranks' output
# goes to this script's stdout and stderr instead, as it comes, and there are no logs.
# wait_job waits for it.
start_job() {
	JOB_NAME=$1
	shift
	JOB=$((JOB + 1))
	JOB_TAG="$JOB.${JOB_NAME//\//-}"
	local group="tb$RUN-$JOB-${JOB_NAME//\//-}" i
	JOB_OUT=$LOGDIR/$JOB_TAG.h0.out
	JOB_PIDS=()
	JOB_T0=$(now_us)
	for ((i = 0; i < HOSTS; i++)); do
		if [ "${JOB_STREAM:-0}" = 1 ]; then
			host_run "$i" "$group" "$@" &
		else
			host_run "$i" "$group" "$@" >"$LOGDIR/$JOB_TAG.h$i.out" 2>"$LOGDIR/$JOB_TAG.h$i.err" &
		fi
		JOB_PIDS[i]=$!
		PIDS+=("$!")
	done
}

# host_run I GROUP ARGS...: host I's part of start_job's job, `a2ad run` of its ranks in its
# namespace. It replaces the shell it runs in (exec), so the pid start_job keeps is the run's.
host_run() {
	local i=$1 group=$2
	shift 2
	exec "${PDEATH[@]}" ip netns exec "$(host_ns "$i")" \
		env A2A_HOST="host$i" A2A_LISTEN="$(host_ip "$i"):0" \
		"$A2AD" run -n "$LOCAL" --world "$WORLD" --rank-offset $((i * LOCAL)) \
		--nats "$NATS_URL" --group "$group" --creds "$CREDS" --bind none -- \
		"${WORKER[@]}" "$@"
}

# wait_job waits for the job start_job started. Returns 0 when every host's run exits 0, 3
# when a2ad rejected the --algo, 1 otherwise (FAILED names the hosts).
wait_job() {
	local name=$JOB_NAME tag=$JOB_TAG t0=$JOB_T0 pids=("${JOB_PIDS[@]}") st=() i
	for ((i = 0; i < HOSTS; i++)); do
		st[i]=""
	done
	# Wait for all; once one host failed the others get 5 s to notice (they fail with
	# peer lost / aborted) before they are stopped; the whole job gets --timeout.
	local remaining=$HOSTS first_fail="" failed_at=0 stopped=0 timed_out=0 cut=()
	local deadline=$((SECONDS + TIMEOUT))
	while [ "$remaining" -gt 0 ]; do
		for ((i = 0; i < HOSTS; i++)); do
			[ -z "${st[i]}" ] || continue
			kill -0 "${pids[i]}" 2>/dev/null && continue
			wait "${pids[i]}"
			st[i]=$?
			remaining=$((remaining - 1))
			if [ "${st[i]}" != 0 ] && [ -z "$first_fail" ] && [ "$stopped" = 0 ]; then
				first_fail=$i
				failed_at=$SECONDS
			fi
		done
		[ "$remaining" -gt 0 ] || break
		if [ "$stopped" = 0 ] && { [ -n "$first_fail" ] && [ $((SECONDS - failed_at)) -ge 5 ] || [ "$SECONDS" -ge "$deadline" ]; }; then
			[ -z "$first_fail" ] && timed_out=1
			stopped=$SECONDS
			for ((i = 0; i < HOSTS; i++)); do
				[ -n "${st[i]}" ] && continue
				cut[i]=1
				kill -TERM "${pids[i]}" 2>/dev/null
			done
		elif [ "$stopped" != 0 ] && [ $((SECONDS - stopped)) -ge 5 ]; then
			for ((i = 0; i < HOSTS; i++)); do
				[ -n "${st[i]}" ] || kill -KILL "${pids[i]}" 2>/dev/null
			done
		fi
		sleep 0.05
	done
	JOB_US=$(($(now_us) - t0))
	# a2ad validates --algo when a rank joins: every rank fails at once with this message.
	local rej
	if [ -n "$first_fail" ] && rej=$(grep -s -h -E 'invalid argument.*(A2A_ALGO|algorithm)' "$LOGDIR/$tag".h*.err); then
		rej=${rej%%$'\n'*}
		REJECT_MSG=${rej#\[rank *\] }
		return 3
	fi
	local failed=() hung=()
	for ((i = 0; i < HOSTS; i++)); do
		if [ -n "${cut[i]:-}" ]; then
			hung+=("host $i")
		elif [ "${st[i]}" != 0 ]; then
			failed+=("host $i ($(host_ns "$i")) exit ${st[i]}")
		fi
	done
	[ ${#failed[@]} -gt 0 ] || [ ${#hung[@]} -gt 0 ] || return 0
	local list why
	if [ "$timed_out" = 1 ]; then
		list=$(join_by ", " "${hung[@]}")
		why="$list still running after --timeout ${TIMEOUT}s (stopped)"
	else
		list=$(join_by ", " "${failed[@]}")
		why="failed: $list"
		[ ${#hung[@]} -gt 0 ] && why+="; $(join_by ", " "${hung[@]}") stopped 5s later"
	fi
	FAILED+=("$name: $why")
	warn "FAIL $name: $why"
	if [ -n "$first_fail" ] && [ -f "$LOGDIR/$tag.h$first_fail.err" ]; then
		warn "  stderr of host $first_fail ($(host_ns "$first_fail")), the first to fail:"
		tail -n 15 "$LOGDIR/$tag.h$first_fail.err" | sed 's/^/    /' >&2
	fi
	return 1
}

# run_job NAME ARGS...: start_job and wait_job.
run_job() {
	start_job "$@"
	wait_job
}

# bench_job NAME ARGS...: run_job with `a2ad bench --worker ARGS` on every rank.
bench_job() {
	local WORKER=("$A2AD" bench --worker)
	run_job "$@"
}

# moe_job NAME ARGS...: run_job with the MoE demo's ranks, `MOE --worker ARGS`.
moe_job() {
	local WORKER=("$MOE" --worker)
	run_job "$@"
}

# job_out prints the file holding host 0's stdout of the last job.
job_out() { printf '%s' "$JOB_OUT"; }

# rows prints rank 0's output of the last job's host 0 without the rank prefix.
rows() { sed -n 's/^\[rank 0\] //p' "$(job_out)"; }

# check_rows NAME NROWS: rank 0 printed NROWS rows (a positive multiple of it when NROWS ends
# in '*', as --algo all prints a row per algorithm and size), all with #wrong (the last
# column) 0.
check_rows() {
	local name=$1 want=$2 out n bad count_ok=0
	out=$(job_out)
	n=$(grep -cE "$ROW_RE" "$out")
	bad=$(grep -E "$ROW_RE" "$out" | awk '$NF != "0"' | head -n 3)
	case $want in
	*\*) [ "$n" -gt 0 ] && [ $((n % ${want%\*})) = 0 ] && count_ok=1 ;;
	*) [ "$n" = "$want" ] && count_ok=1 ;;
	esac
	if [ "$count_ok" = 0 ] || [ -n "$bad" ] || grep -q fail "$out"; then
		FAILED+=("$name: rank 0 (host 0) printed $n of $want rows, not all with #wrong 0")
		warn "FAIL $name: rank 0 (host 0, $(host_ns 0)) printed $n of $want rows, want all with #wrong 0:"
		sed 's/^/    /' "$out" >&2
		return 1
	fi
	return 0
}

# ---- soak and link cut (instead of the checks) ------------------------------------------------

# soak_job NAME ARGS...: start_job with the soak's ranks, `SOAK_BIN --worker ARGS`.
soak_start() {
	local WORKER=("$SOAK_BIN" --worker)
	start_job "$@"
}

# job_lines RE prints the lines of the last job's ranks (every host) that match RE, without
# the rank prefix a2ad run adds.
job_lines() { cat "$LOGDIR/$JOB_TAG".h*.out 2>/dev/null | grep -E "$1" | sed 's/^\[rank [0-9]*\] //'; }

# finish prints the summary line of a soak or link-cut run and exits.
finish() {
	local what=$1
	cleanup
	local detail="hosts=$HOSTS ranks/host=$LOCAL $what; total $(secs $(($(now_us) - T0)))"
	if [ ${#FAILED[@]} -gt 0 ]; then
		say "FAIL $(join_by "; " "${FAILED[@]}"); $detail"
		exit 1
	fi
	say "PASS $detail"
	exit 0
}

# user_job NAME: run_job with the user's program (--run) as the ranks, their output
# streamed with a2ad run's prefixes.
user_job() {
	local WORKER=("${RUN_PROG[@]}") JOB_STREAM=1
	run_job "$@"
}

if [ ${#RUN_PROG[@]} -gt 0 ]; then
	say "run: $WORLD ranks ($HOSTS hosts x $LOCAL) of ${RUN_PROG[*]}"
	if user_job run; then
		say "ok   run in $(secs "$JOB_US"): every rank exited 0"
	fi
	finish "shaping=[$SHAPING] run=[${RUN_PROG[*]}]"
fi

if [ -n "$SOAK" ]; then
	say "soak: $WORLD ranks for $SOAK, seed $SEED (reproduce: scripts/testbed.sh -H $HOSTS -L $LOCAL --soak $SOAK --seed $SEED)"
	soak_start soak --seed "$SEED" --duration "$SOAK"
	if wait_job; then
		passed=$(job_lines 'soak: rank [0-9]+ PASS' | wc -l)
		if [ "$passed" = "$WORLD" ]; then
			say "ok   soak in $(secs "$JOB_US"): $(job_lines 'soak: session' | wc -l) sessions"
			job_lines 'soak: rank [0-9]+ PASS' | sed 's/; ops:.*//; s/^/    /'
		else
			FAILED+=("soak: $passed of $WORLD ranks printed PASS")
		fi
	fi
	finish "soak=$SOAK seed=$SEED"
fi

if [ "$LINK_CUT" = 1 ]; then
	CUT=$((HOSTS - 1))
	say "link cut: $WORLD ranks loop ExchangeCounts + AllToAllV + AllReduce; host $CUT's link (vh$CUT) goes down mid-operation"
	soak_start link-cut --link-cut --seed "$(((RANDOM << 15 | RANDOM) + 1))"
	job_alive() {
		local p
		for p in "${JOB_PIDS[@]}"; do
			kill -0 "$p" 2>/dev/null || return 1
		done
	}
	# All ranks in the loop (each prints "running" after its first verified round).
	deadline=$((SECONDS + 60))
	until [ "$(job_lines 'linkcut: rank [0-9]+ running' | wc -l)" = "$WORLD" ]; do
		if ! job_alive || [ "$SECONDS" -ge "$deadline" ]; then
			FAILED+=("link cut: the ranks did not all start their loop")
			wait_job
			finish "link-cut"
		fi
		sleep 0.05
	done
	sleep 1 # well inside the loop: every rank is in some operation
	setup ip -n "$BRNS" link set "vh$CUT" down
	T_CUT=$(now_us)
	say "link of host $CUT cut at $T_CUT us"
	# Every rank must report a typed error within 3 s; 10 s is the hang limit here.
	deadline=$((SECONDS + 10))
	while [ "$(job_lines 'linkcut: rank [0-9]+ error' | wc -l)" -lt "$WORLD" ] && [ "$SECONDS" -lt "$deadline" ]; do
		sleep 0.05
	done
	# Down a second longer, so the ranks' first tries to join again meet the cut link.
	sleep 1
	setup ip -n "$BRNS" link set "vh$CUT" up
	T_UP=$(now_us)
	say "link of host $CUT back after $(secs $((T_UP - T_CUT)))"
	slowest=0
	reported=0
	while IFS= read -r line; do
		[[ $line =~ rank\ ([0-9]+)\ error\ at_us=([0-9]+)\ kind=([a-z+-]+)\ op=([a-z]+) ]] || continue
		r=${BASH_REMATCH[1]} at=${BASH_REMATCH[2]} kind=${BASH_REMATCH[3]} op=${BASH_REMATCH[4]}
		reported=$((reported + 1))
		d=$((at - T_CUT))
		[ "$d" -gt "$slowest" ] && slowest=$d
		host=$((r / LOCAL))
		say "  rank $r (host $host) in $op: $kind after $(secs "$d"): ${line#*: }"
		[ "$kind" != untyped ] || FAILED+=("link cut: rank $r got an untyped error")
		[ "$d" -le 3000000 ] || FAILED+=("link cut: rank $r detected the cut after $(secs "$d"), limit 3s")
	done < <(job_lines 'linkcut: rank [0-9]+ error' | sort -t' ' -k3n)
	[ "$reported" = "$WORLD" ] || FAILED+=("link cut: $reported of $WORLD ranks reported an error within 10s (the rest hang)")
	say "slowest detection $(secs "$slowest")"
	if wait_job; then
		joined=$(job_lines 'linkcut: rank [0-9]+ rejoined' | wc -l)
		job_lines 'linkcut: rank [0-9]+ (closed|rejoined)' | sed 's/^/    /'
		[ "$joined" = "$WORLD" ] || FAILED+=("link cut: $joined of $WORLD ranks joined again and verified")
		say "joined again and verified on all $joined ranks, $(secs $(($(now_us) - T_UP))) after the link came back"
	fi
	finish "link-cut host=$CUT slowest-detection=$(secs "$slowest")"
fi

CHECK_SIZES="0,1,1K,64K"
N_CHECK_SIZES=4
CHECK_ARGS=(--sizes "$CHECK_SIZES" --check --iters 20 --warmup 2)
ACCEPTED=()
CHECKED=()
T1=$(now_us)
say "correctness: AllToAllV over sizes $CHECK_SIZES (zipf:1.1) per algorithm, then AllToAll; $WORLD ranks"
for algo in "${ALGO_LIST[@]}"; do
	name="alltoallv/$algo"
	bench_job "$name" --op alltoallv --algo "$algo" --dist zipf:1.1 "${CHECK_ARGS[@]}"
	case $? in
	3)
		REJECTED+=("$algo")
		warn "a2ad rejects algorithm '$algo': $REJECT_MSG (skipped)"
		continue
		;;
	0)
		ACCEPTED+=("$algo")
		want_rows=$N_CHECK_SIZES
		[ "$algo" = all ] && want_rows="$N_CHECK_SIZES*"
		if check_rows "$name" "$want_rows"; then
			CHECKED+=("$algo")
			say "ok   $name in $(secs "$JOB_US")"
			rows | grep -v '^#' | sed 's/^/    /'
		fi
		;;
	*) ACCEPTED+=("$algo") ;;
	esac
done
if [ ${#ACCEPTED[@]} -eq 0 ]; then
	die 2 "a2ad accepts none of --algos $ALGOS"
fi
name="alltoall"
if bench_job "$name" --op alltoall "${CHECK_ARGS[@]}"; then
	if check_rows "$name" "$N_CHECK_SIZES"; then
		CHECKED+=("alltoall")
		say "ok   $name in $(secs "$JOB_US")"
		rows | grep -v '^#' | sed 's/^/    /'
	fi
fi
if [ -n "$MOE" ]; then
	name="moe"
	if moe_job "$name" -n "$WORLD" --experts $((2 * WORLD)) --tokens 48 --hidden 32 --ffn 16 --steps 3 --skew 1.1; then
		out=$(job_out)
		if grep -q "all 3 steps verified on $WORLD ranks" "$out"; then
			CHECKED+=("moe")
			say "ok   $name in $(secs "$JOB_US"): $(grep -m1 -o 'rows: .*' "$out" | sed 's/ (.*//')"
		else
			FAILED+=("$name: rank 0 did not report 3 verified steps (see $out)")
			warn "$name: rank 0 did not report 3 verified steps"
		fi
	fi
else
	warn "MoE check skipped: no bin/moe (make build) and no --moe"
fi
T_CHECK=$(($(now_us) - T1))

# ---- benchmark ------------------------------------------------------------------------------

BENCHED=()
T_BENCH=0
if [ "$CHECK_ONLY" = 0 ] && [ ${#FAILED[@]} -eq 0 ]; then
	T2=$(now_us)
	for algo in "${ACCEPTED[@]}"; do
		name="bench/$algo"
		say "benchmark: alltoallv algo=$algo hosts=$HOSTS ranks/host=$LOCAL dist=$BENCH_DIST counts=$BENCH_COUNTS timing=$BENCH_TIMING shaping: $SHAPING"
		if bench_job "$name" --op alltoallv --algo "$algo" --dist "$BENCH_DIST" --counts "$BENCH_COUNTS" \
			--timing "$BENCH_TIMING" --sizes "$BENCH_SIZES"; then
			rows
			BENCHED+=("$algo")
		fi
	done
	T_BENCH=$(($(now_us) - T2))
elif [ "$CHECK_ONLY" = 0 ]; then
	warn "benchmark skipped: correctness failed"
fi

# ---- teardown and summary -------------------------------------------------------------------

# The delay line prints its counters, the lateness of its sends and its CPU use on SIGTERM.
if [ -n "$SWITCH_PID" ]; then
	kill -TERM "$SWITCH_PID" 2>/dev/null
	wait "$SWITCH_PID" 2>/dev/null
	sed -n 's/^delayswitch: \(frames\|lateness\|cpu\|last\)/delay line: \1/p' "$LOGDIR/delayswitch.log" |
		while IFS= read -r line; do say "$line"; done
fi
cleanup
T_ALL=$(($(now_us) - T0))
join() { [ $# -gt 0 ] && join_by , "$@" || echo none; }
times="setup $(secs "$T_SETUP"), checks $(secs "$T_CHECK")"
[ "$CHECK_ONLY" = 1 ] || times+=", bench $(secs "$T_BENCH")"
detail="hosts=$HOSTS ranks/host=$LOCAL shaping=[$SHAPING] checked=[$(join "${CHECKED[@]}")] benchmarked=[$(join "${BENCHED[@]}")] rejected=[$(join "${REJECTED[@]}")]; $times, total $(secs "$T_ALL")"
if [ ${#FAILED[@]} -gt 0 ]; then
	say "FAIL ${#FAILED[@]} check(s): $(join_by "; " "${FAILED[@]}"); $detail"
	exit 1
fi
say "PASS $detail"
exit 0
