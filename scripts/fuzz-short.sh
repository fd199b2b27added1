#!/usr/bin/env bash
# Runs every go test -fuzz target of the module for a while each, one at a
# time (go test -fuzz takes one target per run). make test runs it with the
# default of 3 s per target (about a minute in all); make fuzz runs it long.
#
#   scripts/fuzz-short.sh [-t DURATION] [-p PARALLEL] [TARGET_REGEXP]
#
# -t is go test's -fuzztime (default 3s), -p the fuzzing workers
# (-parallel, default 2). A failing target stops the run; go test writes the
# failing input under the package's testdata/fuzz/FuzzXxx/, where it stays
# as a seed once fixed.
set -euo pipefail

fuzztime=3s
parallel=2
while getopts "t:p:" opt; do
	case $opt in
	t) fuzztime=$OPTARG ;;
	p) parallel=$OPTARG ;;
	*) echo "usage: $0 [-t DURATION] [-p PARALLEL] [TARGET_REGEXP]" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
only=${1:-.}

cd "$(dirname "$0")/.."
GO=${GO:-go}

# Every FuzzXxx function, with its package directory.
mapfile -t targets < <(grep -rlE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]+\(f \*testing\.F\)' . |
	while read -r file; do
		dir=$(dirname "$file")
		grep -oE '^func Fuzz[A-Za-z0-9_]+' "$file" | sed "s|^func |$dir |"
	done | sort)

start=$SECONDS
ran=0
for t in "${targets[@]}"; do
	dir=${t% *}
	name=${t#* }
	[[ $name =~ $only ]] || continue
	echo "fuzz: $dir $name ($fuzztime)"
	# Seeds and testdata/fuzz run first; a failure there fails at once.
	for try in 1 2; do
		if "$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -parallel "$parallel" "$dir" >/tmp/fuzz-short.$$ 2>&1; then
			break
		fi
		# Go before 1.27 can fail a target when -fuzztime ends while a worker
		# is mid-input (go.dev/issue/75804): "context deadline exceeded" and
		# no failing input written. That alone is retried once; anything
		# else, or the same twice, is a failure.
		if [ "$try" = 1 ] && grep -q '^    context deadline exceeded$' /tmp/fuzz-short.$$ &&
			! grep -qE 'Failing input written|^panic:|_test\.go:[0-9]+:' /tmp/fuzz-short.$$; then
			echo "fuzz: $dir $name: the fuzzing coordinator's deadline race (go.dev/issue/75804), once more" >&2
			continue
		fi
		cat /tmp/fuzz-short.$$
		rm -f /tmp/fuzz-short.$$
		echo "fuzz: $dir $name FAILED" >&2
		exit 1
	done
	tail -n 3 /tmp/fuzz-short.$$ | grep -E '^fuzz: elapsed' | tail -n 1 || true
	rm -f /tmp/fuzz-short.$$
	ran=$((ran + 1))
done
if [ "$ran" = 0 ]; then
	echo "fuzz: no target matches $only" >&2
	exit 1
fi
echo "fuzz: $ran targets, no failure, $((SECONDS - start)) s"
