#!/usr/bin/env bash
# compare-mpi.sh: Open MPI and MPICH against a2a on this machine, in one run, same sizes.
#
#   scripts/compare-mpi.sh [-q] [-p FILE.svg] [-r ROUNDS] [-n "2 4"] [-w 8] [-t "shm tcp"]
#                          [-s SIZES] [-o "alltoallv alltoall allreduce"] [-b BUDGET_S] [-S SETTLE_S]
#
#   -q, --quick  three sizes, 8,64K,1M (default: the sweep 8,64,256,1K,4K,16K,64K,256K,1M)
#   -p, --plot[=FILE.svg]  also draw the ratios against size (bin/compareplot) into FILE.svg
#                (default bin/compare.svg), and keep the table beside it in FILE.txt
#   -r  rounds per case (default 3): the cell is the median of the rounds
#   -w  also run AllToAllV alone at this many ranks ("" for none; default 8)
#   -b  time budget per size and op, seconds (default 0.45: the full sweep in about 6 min)
#   -S  untimed calls for this long at the start of every launch, both sides (default 0.2):
#       fresh ranks can run their first ~0.2 s slower, which 20 warm-up calls do not outlast
#
# For every transport and rank count it runs, round after round, scripts/peers/run_mpi.sh
# (Open MPI: ompi-shm or ompi-tcp; on shm also MPICH, whose default device uses shared
# memory on one host; it installs both on first use) and then bin/a2ad bench with the same
# sizes, in both forms: registered buffers (--alloc huge, the default: AllocBuffer memory,
# which shm peers map) and unregistered ones (--alloc heap), so they alternate and share the
# machine's moods. It prints one line per case: the medians over the rounds of the p50
# latencies (slowest rank after a barrier, us), a2a's algorithm, and the ratios Open MPI /
# a2a, MPICH / a2a and unregistered / registered a2a (above 1: registered a2a is faster).
# Bytes are per peer: an AllToAll(V) sends that much to each rank, and an AllReduce sums a
# buffer of ranks x bytes on both sides (the AllToAll's send buffer).
# Needs make build (bin/a2ad; bin/compareplot to plot). Both sides are bimodal at small
# sizes on shared machines: trust a ratio of medians over rounds, not one round.
# Before and after every round it also times the floor of the 8 B cells, the cross-core
# round trip of one cache line (scripts/peers/shm_pingpong.c, cores 0 and 1; needs gcc and 2
# cores), and prints its range over the run above the table, with how many rounds began and
# ended on different sides of 250 ns: the hypervisor moves it between ~50-110 ns (the two
# vCPUs share a cache) and ~400 ns (separate dies, where the shm cells at 1 MiB run 3-6x
# slower), so a cell is read against its own run's floor.
set -euo pipefail
cd "$(dirname "$0")/.."
SWEEP="8,64,256,1K,4K,16K,64K,256K,1M" QUICK="8,64K,1M"
RANKS="2 4" WIDE=8 TRANSPORTS="shm tcp" SIZES=$SWEEP OPS="alltoallv alltoall allreduce" ROUNDS=3 BUDGET=0.45 SETTLE=0.2
PLOT="" cmdline="$*"
# The long forms, anywhere on the line (make compare COMPARE="--quick --plot").
args=()
for a in "$@"; do
	case $a in
	--quick) args+=(-q) ;;
	--plot) args+=(-p bin/compare.svg) ;;
	--plot=*) args+=(-p "${a#--plot=}") ;;
	*) args+=("$a") ;;
	esac
done
set -- ${args[@]+"${args[@]}"}
while getopts "qp:r:n:w:t:s:o:b:S:" opt; do
	case $opt in
	q) SIZES=$QUICK ;;
	p) PLOT=$OPTARG ;;
	r) ROUNDS=$OPTARG ;;
	n) RANKS=$OPTARG ;;
	w) WIDE=$OPTARG ;;
	t) TRANSPORTS=$OPTARG ;;
	s) SIZES=$OPTARG ;;
	o) OPS=$OPTARG ;;
	b) BUDGET=$OPTARG ;;
	S) SETTLE=$OPTARG ;;
	*) awk 'NR > 1 && /^set -euo/ { exit } NR > 1' "$0"; exit 2 ;;
	esac
done
PEERS=scripts/peers/run_mpi.sh
[ -x "$PEERS" ] || { echo "compare-mpi: $PEERS not found" >&2; exit 2; }
[ -x bin/a2ad ] || { echo "compare-mpi: bin/a2ad missing: make build" >&2; exit 2; }
# Checked before the hour of measuring, not after it.
[ -z "$PLOT" ] || [ -x bin/compareplot ] || { echo "compare-mpi: bin/compareplot missing: make build" >&2; exit 2; }
case $PLOT in "" | *.svg) ;; *) echo "compare-mpi: the plot's file must end in .svg: $PLOT" >&2; exit 2 ;; esac
# The peers' benchmark compiles against both MPIs: their headers must be there too (the
# launcher tests install only the runtimes).
if ! dpkg -s libopenmpi-dev libmpich-dev >/dev/null 2>&1; then
	[ "$(id -u)" = 0 ] || { echo "compare-mpi: needs libopenmpi-dev and libmpich-dev (run as root to install)" >&2; exit 2; }
	apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev mpich libmpich-dev >/dev/null
fi
out=$(mktemp) table=$(mktemp) floors=$(mktemp) spans=$(mktemp)
trap 'rm -f "$out" "$table" "$table.floor" "$table.all" "$floors" "$spans"' EXIT
# The floor's probe, built next to the peers' benchmark; none without gcc or a second core.
PINGPONG=${TMPDIR:-/tmp}/a2av_bench_peers/shm_pingpong
if [ "$(nproc)" -ge 2 ] && command -v gcc >/dev/null; then
	mkdir -p "$(dirname "$PINGPONG")"
	[ "$PINGPONG" -nt scripts/peers/shm_pingpong.c ] || gcc -O2 -o "$PINGPONG" scripts/peers/shm_pingpong.c
else
	PINGPONG=""
fi

# floor: one sample of the cross-core round trip (median of its batches, ns) into $floors
# and $last_floor (empty without the probe).
floor() {
	last_floor=""
	[ -n "$PINGPONG" ] || return 0
	last_floor=$("$PINGPONG" -n 200000 -c 0,1 | sed -n 's/.* rtt_med_ns=\([0-9.]*\) .*/\1/p')
	echo "$last_floor" >>"$floors"
}

# peer TRANSPORT RANKS IMPL CONFIG OPS [ARGS...]: one MPI's rows, "tr n impl op bytes us -";
# ARGS go to the MPI bench after the budget.
peer() {
	"$PEERS" "$4" "$2" "$SIZES" uniform -t "$BUDGET" -S "$SETTLE" "${@:6}" 2>&1 |
		sed -n 's/^RESULT .* op=\([a-z]*\) .* peer_bytes=\([0-9]*\) .* med_us=\([0-9.]*\) .*/'"$1 $2 $3"' \1 \2 \3 -/p' |
		awk -v ops=" $5 " 'index(ops, " " $4 " ")' >>"$out"
}

# bytes SIZE: a size as the sweep writes it (8, 64K, 1M) in bytes.
bytes() {
	case $1 in
	*[Kk]) echo $((${1%[Kk]} * 1024)) ;;
	*[Mm]) echo $((${1%[Mm]} * 1048576)) ;;
	*) echo "$1" ;;
	esac
}

# scaled SIZES N: every size of the list, in bytes, times N.
scaled() {
	local s list=""
	for s in ${1//,/ }; do list+="${list:+,}$(($(bytes "$s") * $2))"; done
	echo "$list"
}

# ours TRANSPORT RANKS OPS ALLOC WHO: a2a's rows, "tr n WHO op bytes us algo".
# The peers' AllReduce sums ranks x bytes per rank (the AllToAll's send buffer, see
# a2av_bench.c); a2a's bench takes the buffer's own size, so it gets that product, and its
# rows are filed under the bytes per peer again.
ours() {
	local sizes per
	for op in $3; do
		sizes=$SIZES per=1
		[ "$op" = allreduce ] && sizes=$(scaled "$SIZES" "$2") per=$2
		# One JSON object per row; pick size, p50_us and algo by key.
		bin/a2ad bench --op "$op" -n "$2" --transport "$1" --sizes "$sizes" --budget "${BUDGET}s" --settle "${SETTLE}s" --alloc "$4" --json 2>&1 |
			awk -v k="$1 $2 $5 $op" -v per="$per" '
				function val(key,   v) {
					if (!match($0, "\"" key "\": *(\"[^\"]*\"|[^,}]*)")) return ""
					v = substr($0, RSTART, RLENGTH); sub(/^"[^"]*": */, "", v); gsub(/"/, "", v)
					return v
				}
				/^\{.*"p50_us":/ {print k, val("size") / per, val("p50_us"), val("algo")}' >>"$out"
	done
}

for tr in $TRANSPORTS; do
	for n in $RANKS $WIDE; do
		ops=$OPS
		[ "$n" = "$WIDE" ] && ops=alltoallv
		for ((round = 1; round <= ROUNDS; round++)); do
			echo "compare-mpi: $tr, $n ranks, round $round of $ROUNDS" >&2
			floor
			first=$last_floor
			peer "$tr" "$n" ompi "ompi-$tr" "$ops"
			if [ "$tr" = shm ]; then
				# Oversubscribed, MPICH's default device busy-polls through the scheduler's
				# time slices: ~8 ms a call at every size, 1000x the others. A short budget
				# and 5 timed calls show that and save ~2 minutes of the sweep.
				more=()
				[ "$n" -gt "$(nproc)" ] && more=(-t 0.1 -w 3 -m 5)
				peer "$tr" "$n" mpich mpich "$ops" "${more[@]}"
			fi
			ours "$tr" "$n" "$ops" huge a2a
			ours "$tr" "$n" "$ops" heap a2a-heap
			# Again after the round: the hypervisor may have moved the vCPUs in it.
			floor
			[ -z "$first" ] || echo "$first $last_floor" >>"$spans"
		done
	done
done
awk -v rounds="$ROUNDS" '
	{ key = $1 " " $2 " " $4 " " $5; v[key, $3, ++cnt[key, $3]] = $6
	  if ($3 == "a2a" && !index("," algos[key] ",", "," $7 ",")) algos[key] = (algos[key] == "" ? $7 : algos[key] "," $7)
	  if (!(key in seen)) { seen[key] = 1; order[n++] = key } }
	# median of the rounds of one implementation (insertion sort: at most a few values)
	function med(k, who,   i, j, m, t, a) {
		m = cnt[k, who]
		for (i = 1; i <= m; i++) a[i] = v[k, who, i] + 0
		for (i = 2; i <= m; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
		return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
	}
	function has(k, who) { return ((k, who) in cnt) }
	function ratio(k, who) { return has(k, who) ? sprintf("%.2f", med(k, who) / med(k, "a2a")) : "-" }
	function lat(k, who) { return has(k, who) ? sprintf("%.2f", med(k, who)) : "-" }
	END {
		printf "# medians of %d rounds of p50 latencies (us); ratio above 1: a2a is faster\n", rounds
		printf "%-4s %-5s %-10s %9s %11s %11s %11s %11s  %-16s %9s %10s %9s\n", "tr", "ranks", "op", "bytes", "ompi_us", "mpich_us", "a2a_us", "heap_us", "a2a_algo", "ompi/a2a", "mpich/a2a", "heap/a2a"
		for (i = 0; i < n; i++) {
			k = order[i]
			if (!has(k, "a2a") || (!has(k, "ompi") && !has(k, "mpich"))) continue
			split(k, f, " ")
			printf "%-4s %-5s %-10s %9s %11s %11s %11.2f %11s  %-16s %9s %10s %9s\n", f[1], f[2], f[3], f[4], lat(k, "ompi"), lat(k, "mpich"), med(k, "a2a"), lat(k, "a2a-heap"), algos[k], ratio(k, "ompi"), ratio(k, "mpich"), ratio(k, "a2a-heap")
		}
	}' "$out" >"$table"
# The floor's range goes above the table as a comment line, which compareplot skips.
if [ -s "$floors" ]; then
	sort -n "$floors" | awk '{ v[++n] = $1 } END {
		printf "# floor: cross-core round trip of one cache line (shm_pingpong, cores 0,1), %d samples: %.0f-%.0f ns, median %.0f ns\n", n, v[1], v[n], v[int((n + 1) / 2)] }' >"$table.floor"
	# Under 250 ns the vCPUs share a cache, over it they sit apart and the shm cells from
	# 64 KiB run up to 6x slower (docs/PERFORMANCE.md, "Bimodal runs on the 2-core machine").
	awk '{ n++; if (($1 < 250) != ($2 < 250)) s++ } END {
		printf "# floor: %d of %d rounds began and ended on different sides of 250 ns: their implementations may have run with the vCPUs placed differently\n", s, n }' "$spans" >>"$table.floor"
	cat "$table.floor" "$table" >"$table.all" && mv "$table.all" "$table" && rm -f "$table.floor"
fi
cat "$table"
if [ -n "$PLOT" ]; then
	mkdir -p "$(dirname "$PLOT")"
	cp "$table" "${PLOT%.svg}.txt"
	bin/compareplot -o "$PLOT" -title "$(date -u +%F), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg): scripts/compare-mpi.sh $cmdline" "$table"
	echo "compare-mpi: plot in $PLOT, table in ${PLOT%.svg}.txt" >&2
fi
