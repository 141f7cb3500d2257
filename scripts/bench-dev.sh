#!/usr/bin/env bash
# End-to-end benchmark: a durable single-node dev server in a temp dir, then the
# load generator for new series and for refreshes. Prints the JSON summaries.
# Usage: scripts/bench-dev.sh [duration] (default 10s)
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-10s}
bin=./bin/tollgate
[ -x "$bin" ] || go build -o "$bin" ./cmd/tollgate
dir=$(mktemp -d)
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
$bin server --dev --data-dir "$dir" --default-max-series 0 --log-level warn \
  --grpc-addr 127.0.0.1:17300 --http-addr 127.0.0.1:17380 --raft-addr 127.0.0.1:17301 > "$dir/server.out" &
pid=$!
for _ in $(seq 100); do grep -q '^tollgate node .* ready$' "$dir/server.out" 2>/dev/null && break; sleep 0.1; done
echo "== new series (1000-hash requests, 16 tenants) =="
$bin bench --addr 127.0.0.1:17300 --tenants 16 --series-per-tenant 100000000 --new-fraction 1 \
  --request-size 1000 --concurrency 32 --duration "$dur" --json
echo "== refresh of existing series (prefilled 2M series) =="
$bin bench --addr 127.0.0.1:17300 --tenants 16 --series-per-tenant 125000 --prefill --new-fraction 0 \
  --request-size 1000 --concurrency 32 --duration "$dur" --seed 7 --json
