#!/bin/sh
# rdma-bench.sh: the verbs benchmark `make bench-rdma` runs inside the RDMA lab guest
# (scripts/rdma-lab.sh run -- scripts/rdma-bench.sh), from the repository root. On the same
# rxe pair (rxe0 <-> rxe1 across the veth pair) it measures, ROUNDS times (default 3):
#
#   perftest:  ib_write_lat -s 8 (t_typical, one way), ib_write_bw -s 1M (BW average)
#   a2ad bench -n 2 --transport verbs, AllToAllV of 8 B and 1 MiB per peer (p50)
#   a2ad bench -n 2 --transport tcp, the same in the same guest (loopback TCP)
#   the bare exchange: both sides RDMA WRITE 8 B at once and poll for the other's, in Go
#     with nothing of a2a (the verbs package's BenchmarkLabWriteLat/exchange/write, p50)
#   the transport's BenchmarkStream: bounce buffers against zero-copy by frame size
#
# and prints the ratios the issue sets as goals: a2a's 8 B latency over ib_write_lat's
# (goal <= 1.5), its 1 MiB bandwidth per direction over ib_write_bw's (goal >= 0.8), TCP's
# 1 MiB time over verbs' (goal > 1); and a2a's 8 B latency over the bare exchange's: an
# AllToAllV of two ranks is an exchange (both directions at once), where ib_write_lat times
# one message at a time. Soft-RoCE under TCG is slow and the guest shares the host: only
# ratios within one run mean anything, and medians rather than means.
set -u
if [ "${A2A_RDMA_LAB:-}" != 1 ]; then
	echo "rdma-bench.sh runs inside the lab: scripts/rdma-lab.sh run -- scripts/rdma-bench.sh" >&2
	exit 2
fi
rounds=${ROUNDS:-3}
root=$(pwd)
gid=$(a2ad devices | awk '/<- selected/ { print $2; exit }')
[ -n "$gid" ] || { echo "no selected GID"; exit 1; }

# perftest between rxe1 (server, 10.77.0.2) and rxe0; prints its one data line.
perftest() {
	tool=$1
	shift
	"$tool" -d rxe1 -x "$gid" "$@" >/tmp/perftest.srv 2>&1 &
	sleep 1
	"$tool" -d rxe0 -x "$gid" "$@" 10.77.0.2 2>&1 | awk '/^ *[0-9]/ { print; exit }'
	wait
}

# bench TRANSPORT SIZE: the p50 in us of a 2-rank AllToAllV of SIZE bytes per peer.
bench() {
	a2ad bench -n 2 --transport "$1" --sizes "$2" --iters 300 --warmup 20 --timing span |
		awk '!/^#/ && NF >= 9 { print $8; exit }'
}

# exchange: the p50 in us of a round of the bare exchange (see above).
exchange() {
	(cd verbs && "$root/bin/rdma-tests/verbs.test" -test.run '^$' \
		-test.bench 'LabWriteLat/exchange/write$' -test.benchtime 1000x -test.timeout 120s) |
		awk '/^Benchmark/ { for (i = 1; i < NF; i++) if ($(i + 1) == "us-round-p50") { print $i; exit } }'
}

for i in $(seq "$rounds"); do
	lat=$(perftest ib_write_lat -s 8 -n 2000 | awk '{ print $5 }')
	bw=$(perftest ib_write_bw -s 1048576 -n 200 | awk '{ print $4 }')
	v8=$(bench verbs 8)
	v1m=$(bench verbs 1M)
	t1m=$(bench tcp 1M)
	t8=$(bench tcp 8)
	xch=$(exchange)
	echo "round $i: ib_write_lat 8 B ${lat} us, ib_write_bw 1 MiB ${bw} MB/s; bare exchange 8 B ${xch} us;" \
		"verbs 8 B ${v8} us, 1 MiB ${v1m} us; tcp 8 B ${t8} us, 1 MiB ${t1m} us"
	awk -v lat="$lat" -v bw="$bw" -v v8="$v8" -v v1m="$v1m" -v t1m="$t1m" -v xch="$xch" 'BEGIN {
		vbw = 1048576 / v1m   # bytes per us = MB/s, per direction
		printf "  ratios: 8 B verbs/ib_write_lat %.2f (goal <= 1.5), bare exchange/ib_write_lat %.2f, verbs/bare exchange %.2f; 1 MiB verbs/ib_write_bw %.2f (%.1f MB/s per direction; goal >= 0.8); 1 MiB tcp/verbs time %.2f (goal > 1)\n",
			v8 / lat, xch / lat, v8 / xch, vbw / bw, vbw, t1m / v1m
	}'
done

echo "=== bounce buffers (bcopy) against zero-copy from registered memory (zcopy), one way"
(cd a2a/transport/verbs && "$root/bin/rdma-tests/transport-verbs.test" -test.run '^$' -test.bench 'Stream|PingPong' -test.benchtime 200x) |
	grep -E '^Benchmark'
