#!/usr/bin/env bash
# compare-mpi.sh: Open MPI and MPICH against a2a on this machine, in one run, same sizes.
#
#   scripts/compare-mpi.sh [-n "2 4"] [-t "shm tcp"] [-s 8,64K,1M] [-o "alltoallv alltoall allreduce"]
#
# For every transport and rank count it runs scripts/peers/run_mpi.sh (Open MPI,
# ompi-shm or ompi-tcp; on shm also MPICH, whose default device uses shared memory on one
# host; it installs both on first use), then bin/a2ad bench with the same sizes, and
# prints one line per case: the p50 latencies (slowest rank after a barrier, us), a2a's
# algorithm, and the ratios Open MPI / a2a and MPICH / a2a (above 1: a2a is faster).
# Needs make build. Both sides drift run to run on shared machines: compare ratios of one
# run, and run it more than once before trusting a small difference.
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS="2 4" TRANSPORTS="shm tcp" SIZES="8,64K,1M" OPS="alltoallv alltoall allreduce"
while getopts "n:t:s:o:" opt; do
	case $opt in
	n) RANKS=$OPTARG ;;
	t) TRANSPORTS=$OPTARG ;;
	s) SIZES=$OPTARG ;;
	o) OPS=$OPTARG ;;
	*) sed -n '2,11p' "$0"; exit 2 ;;
	esac
done
PEERS=scripts/peers/run_mpi.sh
[ -x "$PEERS" ] || { echo "compare-mpi: $PEERS not found" >&2; exit 2; }
[ -x bin/a2ad ] || { echo "compare-mpi: bin/a2ad missing: make build" >&2; exit 2; }
# The peers' benchmark compiles against both MPIs: their headers must be there too (the
# launcher tests install only the runtimes).
if ! dpkg -s libopenmpi-dev libmpich-dev >/dev/null 2>&1; then
	[ "$(id -u)" = 0 ] || { echo "compare-mpi: needs libopenmpi-dev and libmpich-dev (run as root to install)" >&2; exit 2; }
	apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev mpich libmpich-dev >/dev/null
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for tr in $TRANSPORTS; do
	for n in $RANKS; do
		peers="ompi:ompi-$tr"
		[ "$tr" = shm ] && peers="$peers mpich:mpich"
		for peer in $peers; do
			"$PEERS" "${peer#*:}" "$n" "$SIZES" uniform 2>&1 |
				sed -n 's/^RESULT .* op=\([a-z]*\) .* peer_bytes=\([0-9]*\) .* med_us=\([0-9.]*\) .*/'"$tr $n ${peer%%:*}"' \1 \2 \3 -/p' >>"$out"
		done
		for op in $OPS; do
			# One JSON object per row; pick size, p50_us and algo by key.
			bin/a2ad bench --op "$op" -n "$n" --transport "$tr" --sizes "$SIZES" --json 2>&1 |
				awk -v k="$tr $n a2a $op" '
					function val(key,   v) {
						if (!match($0, "\"" key "\": *(\"[^\"]*\"|[^,}]*)")) return ""
						v = substr($0, RSTART, RLENGTH); sub(/^"[^"]*": */, "", v); gsub(/"/, "", v)
						return v
					}
					/^\{.*"p50_us":/ {print k, val("size"), val("p50_us"), val("algo")}' >>"$out"
		done
	done
done
awk '
	{ key = $1 " " $2 " " $4 " " $5; us[key, $3] = $6; algo[key] = ($3 == "a2a") ? $7 : algo[key]
	  if (!(key in seen)) { seen[key] = 1; order[n++] = key } }
	function ratio(k, who) { return ((k, who) in us) ? sprintf("%.2f", us[k, who] / us[k, "a2a"]) : "-" }
	function lat(k, who) { return ((k, who) in us) ? sprintf("%.2f", us[k, who]) : "-" }
	END {
		printf "%-4s %-5s %-10s %9s %11s %11s %11s  %-12s %9s %10s\n", "tr", "ranks", "op", "bytes", "ompi_us", "mpich_us", "a2a_us", "a2a_algo", "ompi/a2a", "mpich/a2a"
		for (i = 0; i < n; i++) {
			k = order[i]
			if (!((k, "a2a") in us) || (!((k, "ompi") in us) && !((k, "mpich") in us))) continue
			split(k, f, " ")
			printf "%-4s %-5s %-10s %9s %11s %11s %11.2f  %-12s %9s %10s\n", f[1], f[2], f[3], f[4], lat(k, "ompi"), lat(k, "mpich"), us[k, "a2a"], algo[k], ratio(k, "ompi"), ratio(k, "mpich")
		}
	}' "$out"
