#!/usr/bin/env bash
# The remote-write gateway's added latency at half the receiver's rate
# (docs/gateway.md, BENCHMARKS.md "gateway's added latency").
#
# Starts, on loopback: Debian's Prometheus as the receiver (remote-write
# receiver on, its own TSDB in a temp dir), a durable `tollgate server
# --dev`, and `tollgate gateway` in front of the receiver. Then:
#   1. a closed-loop rwbench, gateway and receiver rounds alternating: the
#      rate the generator reaches writing straight to the receiver;
#   2. open loop at half that rate, rounds alternating, with the gateway's
#      own-time histogram (tollgate_gateway_own_duration_seconds: each
#      request's time in the gateway minus its forward) read before and
#      after: the share of requests within 1, 2 and 3 ms and the p99 (to the
#      bucket) of what the gateway added.
#
# Usage: scripts/gateway-latency.sh [rounds] [duration]   (default 3 10s)
# GATEWAY_CPU=N runs the gateway alone on CPU N and the rest on the others
# (taskset), as a gateway deployed on its own cores is; unset, everything
# shares every CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
dur=${2:-10s}
command -v prometheus >/dev/null || { echo "needs Debian's prometheus (apt-get install prometheus)" >&2; exit 1; }
dir=$(mktemp -d)
bin=${TOLLGATE_BIN:-$dir/tollgate}
[ -x "$bin" ] || go build -o "$bin" ./cmd/tollgate
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

gw_pin=() rest_pin=()
if [ -n "${GATEWAY_CPU:-}" ]; then
  others=$(seq 0 $(($(nproc) - 1)) | grep -vx "$GATEWAY_CPU" | paste -sd,)
  gw_pin=(taskset -c "$GATEWAY_CPU") rest_pin=(taskset -c "$others")
fi

mkdir -p "$dir/prom"
printf 'global:\n  scrape_interval: 1m\n' > "$dir/prom.yml"
"${rest_pin[@]}" prometheus --config.file="$dir/prom.yml" --storage.tsdb.path="$dir/prom" \
  --web.listen-address=127.0.0.1:17390 --web.enable-remote-write-receiver --log.level=warn > "$dir/prom.out" 2>&1 &
pids+=($!)
"${rest_pin[@]}" "$bin" server --dev --data-dir "$dir/data" --default-max-series 0 --log-level warn \
  --grpc-addr 127.0.0.1:17300 --http-addr 127.0.0.1:17380 --raft-addr 127.0.0.1:17301 > "$dir/server.out" 2>&1 &
pids+=($!)
for _ in $(seq 300); do grep -q '^tollgate node .* ready$' "$dir/server.out" 2>/dev/null && break; sleep 0.1; done
"${gw_pin[@]}" "$bin" gateway --listen 127.0.0.1:17391 --addr 127.0.0.1:17300 \
  --upstream http://127.0.0.1:17390/api/v1/write --log-level warn > "$dir/gateway.out" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
  curl -sf -o /dev/null http://127.0.0.1:17391/readyz && curl -sf -o /dev/null http://127.0.0.1:17390/-/ready && break
  sleep 0.1
done

B=(--concurrency 8 --tenants 4 --series-per-tenant 10000 --series-per-request 500)
rw() { "${rest_pin[@]}" "$bin" rwbench --url http://127.0.0.1:17391/api/v1/push --baseline-url http://127.0.0.1:17390/api/v1/write "${B[@]}" "$@"; }

echo "== warm-up (every series tracked once) =="
rw --rounds 1 --duration 5s | tail -2
echo "== closed loop: $rounds rounds of $dur each =="
closed=$(rw --rounds "$rounds" --duration "$dur" --json)
straight=$(echo "$closed" | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["summary"]["baseline_samples_per_sec"]))')
through=$(echo "$closed" | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["summary"]["url_samples_per_sec"]))')
echo "straight to the receiver $straight samples/s, through the gateway $through (ratio $(python3 -c "print(round($through/$straight,2))"))"
half=$((straight / 2))

hist() { curl -sf http://127.0.0.1:17391/metrics | grep -E '^tollgate_gateway_(own_duration_seconds_bucket|track_duration_seconds_count|background_refreshes_total)'; }
hist > "$dir/before"
echo "== open loop at $half samples/s (half the straight rate): $rounds rounds of $dur each =="
rw --rounds "$rounds" --duration "$dur" --rate "$half" | tail -2
hist > "$dir/after"
python3 - "$dir/before" "$dir/after" <<'EOF'
import re, sys
def read(p):
    out, other = {}, {}
    for line in open(p):
        m = re.match(r'.*le="([^"]+)"\} (\S+)', line)
        if m:
            out[float(m.group(1))] = float(m.group(2))
        else:
            k, v = line.rsplit(' ', 1)
            other[k] = float(v)
    return out, other
(a, ao), (b, bo) = read(sys.argv[1]), read(sys.argv[2])
for k in sorted(bo):
    print(f"  {k}: +{int(bo[k] - ao.get(k, 0))}")
d = {le: b[le] - a.get(le, 0) for le in b}
total = d[float("inf")]
print(f"gateway's own time over {int(total)} requests of the open-loop rounds (gateway rounds only):")
for le in (0.001, 0.002, 0.003, 0.005):
    print(f"  within {le*1000:g} ms: {100*d[le]/total:.1f} %")
p99 = min(le for le in d if d[le] >= 0.99 * total)
print(f"  p99 at or under the {p99*1000:g} ms bucket")
EOF
