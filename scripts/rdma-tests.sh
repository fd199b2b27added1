#!/bin/sh
# rdma-tests.sh: the tests `make test-rdma` runs inside the RDMA lab guest
# (scripts/rdma-lab.sh run -- scripts/rdma-tests.sh), from the repository root, with bin/
# on PATH. The Makefile builds the test binaries beforehand into bin/rdma-tests/ (the guest
# has no Go toolchain). To add a step, add a `step NAME COMMAND...` line; a Go test binary
# runs from its package directory through `gotest PKGDIR BINARY [FLAGS]`.
#
# At the end it prints the rxe hardware counters and the veth byte counts, and fails if no
# packet crossed rxe. Exit status: 0 when every step passed.
set -u
if [ "${A2A_RDMA_LAB:-}" != 1 ]; then
	echo "rdma-tests.sh runs inside the lab: scripts/rdma-lab.sh run -- scripts/rdma-tests.sh" >&2
	exit 2
fi
root=$(pwd)
failed=""

step() {
	name=$1
	shift
	echo "=== $name"
	t0=$(cut -d' ' -f1 /proc/uptime)
	if "$@"; then r=ok; else r=FAIL; failed="$failed
  $name"; fi
	echo "--- $r: $name ($(awk -v a="$t0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN { printf "%.1f", b - a }') s)"
}

gotest() {
	dir=$1 bin=$2
	shift 2
	(cd "$root/$dir" && exec "$root/bin/rdma-tests/$bin" -test.count=1 -test.timeout=300s "$@")
}

# collectives runs every collective of a2ad bench with --check: small and multi-frame sizes.
collectives() {
	for op in alltoall allreduce reducescatter allgather broadcast reduce gather scatter barrier; do
		a2ad bench -n 4 --transport verbs --op "$op" --check --sizes 8,300K --iters 2 --warmup 1 --budget 1s ||
			{ echo "bench --op $op failed"; return 1; }
	done
}

counters() {
	echo "=== rxe counters (packets) and veth bytes"
	total=0
	for d in /sys/class/infiniband/rxe*; do
		n=$(basename "$d")
		s=$(cat "$d/ports/1/hw_counters/sent_pkts")
		r=$(cat "$d/ports/1/hw_counters/rcvd_pkts")
		net=$(cat "$d/ports/1/gid_attrs/ndevs/0" 2>/dev/null)
		tx=$(cat "/sys/class/net/$net/statistics/tx_bytes" 2>/dev/null)
		rx=$(cat "/sys/class/net/$net/statistics/rx_bytes" 2>/dev/null)
		echo "$n: sent_pkts $s rcvd_pkts $r; $net: tx_bytes $tx rx_bytes $rx"
		total=$((total + r))
	done
	[ "$total" -gt 0 ] || { echo "no packet crossed rxe"; return 1; }
}

step "a2ad devices" a2ad devices --require
step "verbs binding (verbs)" gotest verbs verbs.test -test.v
step "verbs transport (a2a/transport/verbs)" gotest a2a/transport/verbs transport-verbs.test -test.v
# Ranks as processes under a2ad, four of them spread over rxe0 and rxe1 by local rank, with
# every pair forced onto verbs (Join fails if verbs cannot serve a pair).
step "verified AllToAllV over verbs (a2ad run -n 4 a2acheck)" \
	env A2A_TRANSPORT=verbs a2ad run -n 4 -- bin/rdma-tests/a2acheck --rounds 3 --big 1048576
# A newcomer's own program: a module outside this repository, built with go build
# (internal/modtest leaves it in bin/rdma-tests/newcomer), each rank checking every byte.
step "a newcomer's AllToAllV program over verbs (a2ad run -n 4 newcomer)" \
	env A2A_TRANSPORT=verbs a2ad run -n 4 -- bin/rdma-tests/newcomer
step "collectives over verbs (a2ad bench -n 4 --check)" collectives
step "MoE demo over verbs (a2ad run -n 4 moe --worker)" \
	env A2A_TRANSPORT=verbs a2ad run -n 4 -- moe --worker --steps 3 --rows alltoallv
step "rxe counters" counters

if [ -n "$failed" ]; then
	echo "rdma-tests: FAILED:$failed"
	exit 1
fi
echo "rdma-tests: all steps passed"
