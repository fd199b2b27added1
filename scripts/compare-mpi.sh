#!/usr/bin/env bash
# compare-mpi.sh: Open MPI against a2a on this machine, in one run, same sizes.
#
#   scripts/compare-mpi.sh [-n "2 4"] [-t "shm tcp"] [-s 8,64K,1M] [-o "alltoallv alltoall allreduce"]
#
# For every transport and rank count it runs ../shared/peers/run_mpi.sh (Open MPI,
# ompi-shm or ompi-tcp; it installs Open MPI on first use), then bin/a2ad bench with the
# same sizes, and prints one line per case: both p50 latencies (slowest rank after a
# barrier, us), a2a's algorithm, and the ratio Open MPI / a2a (above 1: a2a is faster).
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
PEERS=../shared/peers/run_mpi.sh
[ -x "$PEERS" ] || { echo "compare-mpi: $PEERS not found" >&2; exit 2; }
[ -x bin/a2ad ] || { echo "compare-mpi: bin/a2ad missing: make build" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for tr in $TRANSPORTS; do
	for n in $RANKS; do
		"$PEERS" "ompi-$tr" "$n" "$SIZES" uniform 2>&1 |
			sed -n 's/^RESULT .* op=\([a-z]*\) .* peer_bytes=\([0-9]*\) .* med_us=\([0-9.]*\) .*/'"$tr $n"' ompi \1 \2 \3 -/p' >>"$out"
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
	END {
		printf "%-4s %-5s %-10s %9s %11s %11s  %-12s %s\n", "tr", "ranks", "op", "bytes", "ompi_us", "a2a_us", "a2a_algo", "ompi/a2a"
		for (i = 0; i < n; i++) {
			k = order[i]
			if (!((k, "ompi") in us) || !((k, "a2a") in us)) continue
			split(k, f, " ")
			printf "%-4s %-5s %-10s %9s %11.2f %11.2f  %-12s %.2f\n", f[1], f[2], f[3], f[4], us[k, "ompi"], us[k, "a2a"], algo[k], us[k, "ompi"] / us[k, "a2a"]
		}
	}' "$out"
