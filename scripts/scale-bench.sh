#!/usr/bin/env bash
# Scale benchmark of one node (`tollgate scalebench`): durable single-node dev
# servers in a temp dir; idle CPU with TENANTS per-tenant overrides against
# BASE_TENANTS, CLIENTS simulated clients' stream bytes, the metering sampler's
# pass with SPANS open spans and DUE due, memory per series after
# SERIES_TENANTS × SERIES_PER_TENANT series, and restart time to ready. Prints
# the machine, then the table. The full default sizes need ~3 GB of RAM and
# several minutes; QUICK=1 shrinks every size for a run of under a minute.
# Usage: [QUICK=1] [TENANTS=…] [CLIENTS=…] … scripts/scale-bench.sh [more scalebench flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=./bin/tollgate
go build -o "$bin" ./cmd/tollgate
if [ "${QUICK:-0}" = 1 ]; then
  : "${TENANTS:=2000}" "${CLIENTS:=50}" "${SPANS:=20000}" "${DUE:=200}" "${SERIES_PER_TENANT:=20000}"
  : "${STREAM_WINDOW:=5s}" "${IDLE_WINDOW:=3s}"
fi
args=(--tenants "${TENANTS:-100000}" --base-tenants "${BASE_TENANTS:-10}"
  --clients "${CLIENTS:-1000}" --subs-per-client "${SUBS_PER_CLIENT:-3}" --stream-window "${STREAM_WINDOW:-60s}"
  --spans "${SPANS:-1000000}" --due "${DUE:-1000}"
  --series-tenants "${SERIES_TENANTS:-100}" --series-per-tenant "${SERIES_PER_TENANT:-1000000}"
  --idle-window "${IDLE_WINDOW:-10s}" --stages "${STAGES:-all}")
echo "== $(date -u +%FT%TZ) $(nproc) cores, $(awk '{print "load average", $1, $2, $3}' /proc/loadavg), $(git rev-parse --short HEAD) =="
echo "== $bin scalebench ${args[*]} $* =="
"$bin" scalebench "${args[@]}" "$@"
echo "== done $(date -u +%FT%TZ), $(awk '{print "load average", $1, $2, $3}' /proc/loadavg) =="
