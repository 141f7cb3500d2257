#!/usr/bin/env bash
# Single node vs three-node cluster, same machine, same run: refresh and new-series
# throughput with `tollgate bench` (1,000-hash requests). Prints one JSON summary
# per run, labelled; its "cost" is the nodes' CPU per series (summed and per node).
# Usage: [TOLLGATE_BIN=path] scripts/bench-cluster.sh [duration] [concurrency]
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-10s}
conc=${2:-16}
# TOLLGATE_BIN: a built binary to run instead of building this tree (A/B runs).
bin=${TOLLGATE_BIN:-./bin/tollgate}
[ -n "${TOLLGATE_BIN:-}" ] || go build -o "$bin" ./cmd/tollgate
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

waitready() { for _ in $(seq 300); do grep -q '^tollgate node .* ready$' "$1" 2>/dev/null && return 0; sleep 0.1; done; echo "not ready: $1" >&2; exit 1; }

run() { # label addr metrics args...
  local label=$1 addr=$2 metrics=$3; shift 3
  echo "== $label =="
  $bin bench --addr "$addr" --metrics-url "$metrics" --tenants 16 --request-size 1000 --concurrency "$conc" --duration "$dur" --json "$@" 2>/dev/null
}

runpair() { # label addr metrics
  $bin bench --addr "$2" --tenants 16 --series-per-tenant 125000 --prefill --new-fraction 0 --request-size 1000 \
    --concurrency 4 --duration 1s --seed 7 >/dev/null 2>&1
  run "$1 refresh (2M prefilled)" "$2" "$3" --series-per-tenant 125000 --new-fraction 0 --seed 7
  run "$1 new series" "$2" "$3" --series-per-tenant 100000000 --new-fraction 1 --seed 9
}

# Single node (durable, fsync on).
$bin server --dev --data-dir "$tmp/single" --default-max-series 0 --log-level warn \
  --grpc-addr 127.0.0.1:17300 --http-addr 127.0.0.1:17302 --raft-addr 127.0.0.1:17301 > "$tmp/single.out" 2>&1 &
pids+=($!)
waitready "$tmp/single.out"
runpair "single node" 127.0.0.1:17300 127.0.0.1:17302
kill -TERM "${pids[0]}"; wait "${pids[0]}" || true; pids=()

# Three nodes, three zones.
for i in 1 2 3; do
  join=(); [ "$i" -gt 1 ] && join=(--join 127.0.0.1:17412)
  $bin server --node-id "n$i" --zone "zone-$i" --data-dir "$tmp/n$i" --default-max-series 0 --log-level warn \
    --grpc-addr "127.0.0.1:174${i}0" --raft-addr "127.0.0.1:174${i}1" --gossip-addr "127.0.0.1:174${i}2" --http-addr "127.0.0.1:174${i}3" \
    --bootstrap-expect 3 "${join[@]}" > "$tmp/n$i.out" 2>&1 &
  pids+=($!)
done
for i in 1 2 3; do waitready "$tmp/n$i.out"; done
sleep 25 # let leader balancing settle (first check after 2 intervals)
runpair "three nodes" 127.0.0.1:17410,127.0.0.1:17420,127.0.0.1:17430 127.0.0.1:17413,127.0.0.1:17423,127.0.0.1:17433
