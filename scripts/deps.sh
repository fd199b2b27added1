#!/usr/bin/env bash
# Installs what the tests need that a fresh machine lacks, using Debian's packages.
# Each line of NEEDS is "command package": the package is installed when the
# command is missing. Idempotent: does nothing when everything is present.
set -euo pipefail
NEEDS=(
  "nats-server nats-server"   # the standalone NATS server binary (external-server test)
  "promtool prometheus"       # metric-name lint and the Prometheus server (scrape test)
  "mpirun.openmpi openmpi-bin" # Open MPI's mpirun starts ranks in the launcher test
  "mpiexec.hydra mpich"       # MPICH's Hydra mpiexec starts ranks in the launcher test
  "ip iproute2"               # deploy's Slurm test: the batch script's DATA_IFACE address
  "chromium chromium"         # headless browser of a2ad serve's /ui/ test
)
# scripts/deps.sh rdma-lab: what scripts/rdma-lab.sh needs (qemu guest with Soft-RoCE).
NEEDS_RDMA_LAB=(
  "qemu-system-x86_64 qemu-system-x86"
  "ibv_devinfo ibverbs-utils"
  "rdma iproute2"
  "kmod kmod"
  "cpio cpio"
  "xz xz-utils"
  "ib_write_bw perftest"      # the benchmark's reference (ib_write_bw, ib_write_lat) in the guest
)
if [ "${1:-}" = rdma-lab ]; then
  NEEDS=("${NEEDS_RDMA_LAB[@]}")
fi
need=()
for line in "${NEEDS[@]}"; do
  read -r cmd pkg <<<"$line"
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "deps: missing ${need[*]}; run as root or install them with apt-get" >&2
  exit 1
fi
echo "deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
