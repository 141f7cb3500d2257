#!/usr/bin/env bash
# Latency at half the closed-loop capacity, measured in the same run: per
# round, against one durable dev node (fsync on),
#   1. new series: `tollgate bench` closed loop (1,000-hash requests,
#      concurrency 8) gives the capacity C in series/s; then an open loop
#      offering C/2 (requests on a fixed schedule, latency from each one's
#      scheduled time) gives the p50/p99;
#   2. Envoy decisions: `tollgate envoybench` closed loop (32 in flight)
#      gives the capacity in decisions/s; then an open loop at half of it.
# Each round starts a fresh node (new series insert into empty tables). The
# load generator shares the machine's cores with the node: on a 2-core VM the
# tails partly measure that.
# Usage: scripts/open-loop-half.sh [rounds] [duration]   (default 3 rounds of 5s)
# Env: TOLLGATE_BIN (reuse a built binary).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
dur=${2:-5s}
command -v jq >/dev/null || { echo "open-loop-half.sh needs jq" >&2; exit 1; }
dir=$(mktemp -d)
bin=${TOLLGATE_BIN:-$dir/tollgate}
[ -n "${TOLLGATE_BIN:-}" ] || go build -o "$bin" ./cmd/tollgate
grpc=127.0.0.1:17620 http=127.0.0.1:17690 raft=127.0.0.1:17621
. scripts/lib-dev-node.sh
cat > "$dir/bench.yaml" <<'EOF'
domain: bench
descriptors:
  - key: api
    rate_limit: {unit: second, requests_per_unit: 1000000}
EOF
track() { $bin bench --addr $grpc --tenants 16 --request-size 1000 --concurrency 8 --duration "$dur" \
  --new-fraction 1 --series-per-tenant 100000000 --json "$@" 2>/dev/null; }
envoy() { $bin envoybench --addr $grpc --domain bench --descriptor api=ingest --duration "$dur" --json "$@" 2>/dev/null; }
ms() { awk -v v="$1" 'BEGIN { printf "%.2f", v / 1000 }'; }

echo "$(date -u +%FT%TZ)  $(nproc) cores  load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-5s | %12s %12s %8s %8s | %12s %12s %8s %8s\n' round "series/s" "offered" "p50 ms" "p99 ms" \
  "decisions/s" "offered" "p50 ms" "p99 ms"
for r in $(seq "$rounds"); do
  start_node
  cap=$(track --seed $((200 + r)) | jq -r '.series_per_sec')
  half=$(awk -v c="$cap" 'BEGIN { printf "%d", c / 2 }')
  open=$(track --seed $((300 + r)) --rate "$half" --concurrency 64)
  np50=$(jq -r '.p50_ms' <<<"$open") np99=$(jq -r '.p99_ms' <<<"$open")
  $bin limits apply-envoy --addr $grpc -f "$dir/bench.yaml" >/dev/null
  ecap=$(envoy | jq -r '.decisions_per_s')
  ehalf=$(awk -v c="$ecap" 'BEGIN { printf "%d", c / 2 }')
  eopen=$(envoy --rate "$ehalf" --concurrency 64)
  stop_node
  [[ $(jq -r '.sustained' <<<"$eopen") == true ]] || echo "round $r: the Envoy open loop did not sustain $ehalf/s" >&2
  printf '%-5s | %12.0f %12d %8.2f %8.2f | %12.0f %12d %8s %8s\n' "$r" "$cap" "$half" "$np50" "$np99" \
    "$ecap" "$ehalf" "$(ms "$(jq -r '.p50_us' <<<"$eopen")")" "$(ms "$(jq -r '.p99_us' <<<"$eopen")")"
done
echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"
