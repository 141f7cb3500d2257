#!/usr/bin/env bash
# One node's cost at several raft group counts G, for choosing the default:
# for each G, a durable single-node dev server in a temp dir (P = 256
# partitions), then RSS and idle CPU over 10 s, new-series throughput with
# `tollgate bench` (1000-hash requests, 16 tenants, concurrency 8), RSS after
# it, and the time from start to ready after a SIGTERM restart with the data.
# Usage: scripts/group-count.sh [duration] [groups...] (default 10s, 4 16 64)
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-10s}
shift || true
groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(4 16 64)
bin=./bin/tollgate
[ -x "$bin" ] || go build -o "$bin" ./cmd/tollgate
hz=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
rss_mb() { awk '/VmRSS/ {printf "%.0f", $2/1024}' "/proc/$1/status"; }
start() { # dir G → sets pid and ready_s (seconds from start to ready)
  local t0
  t0=$(date +%s.%N)
  $bin server --dev --data-dir "$1" --groups "$2" --partitions 256 --default-max-series 0 --log-level warn \
    --grpc-addr 127.0.0.1:17300 --http-addr 127.0.0.1:17380 --raft-addr 127.0.0.1:17301 > "$1.out" 2>&1 &
  pid=$!
  for _ in $(seq 1200); do
    grep -q '^tollgate node .* ready$' "$1.out" 2>/dev/null && break
    kill -0 $pid 2>/dev/null || { echo "server exited:" >&2; cat "$1.out" >&2; exit 1; }
    sleep 0.05
  done
  ready_s=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.2f", a - b }')
}
printf '%-4s %10s %12s %14s %10s %12s %12s\n' G "rss_MB" "idle_%core" "new_series/s" "p99_ms" "rss_after_MB" "restart_s"
for g in "${groups[@]}"; do
  dir=$(mktemp -d)/data
  start "$dir" "$g"
  sleep 3
  c0=$(cpu_ticks $pid); sleep 10; c1=$(cpu_ticks $pid)
  idle=$(awk -v a="$c0" -v b="$c1" -v hz="$hz" 'BEGIN { printf "%.2f", 100 * (b - a) / hz / 10 }')
  rss0=$(rss_mb $pid)
  out=$($bin bench --addr 127.0.0.1:17300 --tenants 16 --series-per-tenant 100000000 --new-fraction 1 \
    --request-size 1000 --concurrency 8 --duration "$dur" --json 2>/dev/null)
  rate=$(echo "$out" | tr ',' '\n' | sed -n 's/.*"new_accepted_per_sec": *\([0-9.e+]*\).*/\1/p' | head -1)
  rate=$(awk -v r="$rate" 'BEGIN { printf "%.0f", r }')
  p99=$(echo "$out" | tr ',' '\n' | sed -n 's/.*"p99_ms": *\([0-9.e+]*\).*/\1/p' | head -1)
  rss1=$(rss_mb $pid)
  kill -TERM $pid; wait $pid 2>/dev/null || true
  start "$dir" "$g"
  restart=$ready_s
  kill -TERM $pid; wait $pid 2>/dev/null || true
  printf '%-4s %10s %12s %14s %10s %12s %12s\n' "$g" "$rss0" "$idle" "$rate" "$p99" "$rss1" "$restart"
  rm -rf "$(dirname "$dir")"
done
