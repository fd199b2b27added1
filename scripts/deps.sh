#!/usr/bin/env bash
# Installs what the tests need that a fresh machine lacks, using Debian's packages:
#   nats-server  the standalone NATS server binary (the external-server test)
#   prometheus   promtool (metric-name lint) and the Prometheus server (scrape test)
# Idempotent: does nothing when everything is present.
set -euo pipefail
need=()
command -v nats-server >/dev/null 2>&1 || need+=(nats-server)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
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
