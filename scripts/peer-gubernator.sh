#!/usr/bin/env bash
# Tollgate's Envoy rate limit service side by side with Gubernator (one
# instance, and a cluster of three), on loopback, in interleaved runs (the
# order rotates every round so a drift of the machine's speed weighs on all).
#
# Gubernator is a peer to measure against, installed from the Go module
# registry into a temporary GOBIN; none of its code is part of Tollgate. It is
# driven by scripts/gubernator-bench, a separate Go module that uses
# Gubernator's own gRPC client (GetRateLimits, token bucket), so Gubernator
# never enters Tollgate's go.mod. Tollgate is driven by `tollgate envoybench`.
# Both load generators print the same JSON fields.
#
# The workload is the one of scripts/peer-envoy-ratelimit.sh: one key under a
# limit far above the offered load (every call a decision that is admitted),
# and a limit of 50 a second for the boundary test.
#
# Per round, for Tollgate (one durable dev node), Gubernator ×1 and
# Gubernator ×3 (calls round-robin over the three; CPU of all three counted):
#   - a closed loop (--concurrency calls in flight): decisions per CPU-second
#     of the server processes, from /proc/<pid>/stat;
#   - open loops at each of RATES: p50/p99 from the calls' scheduled times;
#   - a burst of 2× the limit 300 ms before a 1 s wall-clock boundary and
#     another 300 ms after it: admitted ÷ limit. (Gubernator's token bucket
#     starts at a key's first hit, not at the wall clock's boundary, so for it
#     this says what two bursts 600 ms apart get through.)
# Then it prints medians and Tollgate ÷ Gubernator ratios.
#
# Gubernator's member-list discovery keys peers by IP and names a member by
# the host name, so the three instances listen on 127.0.0.2–127.0.0.4 (all
# loopback on Linux, same ports) and each runs in its own UTS namespace with
# its own host name (`unshare --uts`, as root); without that, the three never
# join (memberlist: "Conflicting address") and each decides alone.
#
# Usage: scripts/peer-gubernator.sh [rounds] [duration]  (default 3 rounds of 5s)
# Environment: RATES="300 800", CONC=32, PEER_GOBIN (reuse an installed
#   gubernator), TOLLGATE_BIN (reuse a built tollgate), OUT (raw JSON lines).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
dur=${2:-5s}
rates=${RATES:-"300 800"}
conc=${CONC:-32}
guber_version=v2.13.0
command -v jq >/dev/null || { echo "peer-gubernator.sh needs jq" >&2; exit 1; }

dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
out=${OUT:-$dir/results.jsonl}
: > "$out"

# --- binaries --------------------------------------------------------------------
gobin=${PEER_GOBIN:-$dir/gobin}
mkdir -p "$gobin"
if [ ! -x "$gobin/gubernator" ]; then
  echo "installing gubernator $guber_version into $gobin" >&2
  GOBIN=$gobin go install "github.com/gubernator-io/gubernator/v2/cmd/gubernator@$guber_version"
fi
gb=$dir/gubernator-bench
(cd scripts/gubernator-bench && go build -o "$gb" .)
tg=${TOLLGATE_BIN:-$dir/tollgate}
[ -n "${TOLLGATE_BIN:-}" ] || go build -o "$tg" ./cmd/tollgate

tg_grpc=127.0.0.1:18470 tg_http=127.0.0.1:18471 tg_raft=127.0.0.1:18472
g_grpc=18460 g_http=18461 g_ml=18462

wait_port() { # host port what
  for _ in $(seq 300); do (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0; sleep 0.1; done
  echo "$3 did not listen on $1:$2" >&2; return 1
}

start_guber() { # ip known-node-ip log
  (
    name=guber-${1//./-}
    export GUBER_GRPC_ADDRESS=$1:$g_grpc GUBER_HTTP_ADDRESS=$1:$g_http GUBER_ADVERTISE_ADDRESS=$1:$g_grpc
    export GUBER_MEMBERLIST_ADDRESS=$1:$g_ml GUBER_MEMBERLIST_BIND_ADDRESS=$1:$g_ml
    export GUBER_MEMBERLIST_KNOWN_NODES=$2:$g_ml GUBER_LOG_LEVEL=warn
    # No trace collector runs here: export no spans.
    export OTEL_TRACES_EXPORTER=none OTEL_SDK_DISABLED=true
    exec unshare --uts sh -c "hostname $name && exec $gobin/gubernator"
  ) > "$3" 2>&1 &
  pids+=("$!")
  wait_port "$1" $g_grpc "gubernator on $1" || { cat "$3" >&2; exit 1; }
}

# --- start Gubernator ×1, Gubernator ×3, Tollgate --------------------------------
start_guber 127.0.0.1 127.0.0.1 "$dir/g1.log"; g1_pid=${pids[-1]}
start_guber 127.0.0.2 127.0.0.2 "$dir/g3a.log"; g3a=${pids[-1]}
start_guber 127.0.0.3 127.0.0.2 "$dir/g3b.log"; g3b=${pids[-1]}
start_guber 127.0.0.4 127.0.0.2 "$dir/g3c.log"; g3c=${pids[-1]}
g1_addr=127.0.0.1:$g_grpc
g3_addr=127.0.0.2:$g_grpc,127.0.0.3:$g_grpc,127.0.0.4:$g_grpc

$tg server --dev --data-dir "$dir/data" --log-level warn \
  --grpc-addr $tg_grpc --http-addr $tg_http --raft-addr $tg_raft > "$dir/tollgate.log" 2>&1 &
tg_pid=$!; pids+=("$tg_pid")
for _ in $(seq 300); do grep -q 'ready' "$dir/tollgate.log" 2>/dev/null && break; sleep 0.1; done
grep -q 'ready' "$dir/tollgate.log" || { cat "$dir/tollgate.log" >&2; exit 1; }
cat > "$dir/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: api
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: boundary_s
    rate_limit: {unit: second, requests_per_unit: 50}
YAML
$tg limits apply-envoy --addr $tg_grpc -f "$dir/bench.yaml" >/dev/null

# Every server must decide before the rounds: Tollgate once it has applied the
# file (a burst of 60 under 50/s sees refusals), Gubernator ×3 once its
# member list has all three peers (no call fails).
for i in $(seq 20); do
  $tg envoybench --addr $tg_grpc --descriptor "boundary_s=check$i" --boundary 1s --limit 50 --burst 60 --offset 300ms --json |
    jq -e '.errors == 0 and .boundary.before_ok + .boundary.after_ok < 120' >/dev/null && break
  [ "$i" = 20 ] && { echo "Tollgate does not decide with bench.yaml" >&2; cat "$dir/tollgate.log" >&2; exit 1; }
  sleep 0.5
done
command -v unshare >/dev/null || { echo "peer-gubernator.sh needs unshare (util-linux)" >&2; exit 1; }
for i in $(seq 40); do
  [ "$(curl -s http://127.0.0.2:$g_http/v1/HealthCheck | jq .peer_count)" = 3 ] &&
  $gb --addr "$g3_addr" --key "check$i" --rate 50 --duration 1s | jq -e '.errors == 0' >/dev/null &&
    $gb --addr "$g1_addr" --key "check$i" --rate 50 --duration 1s | jq -e '.errors == 0' >/dev/null && break
  [ "$i" = 40 ] && { echo "Gubernator ×3 has not 3 peers or fails calls" >&2; tail "$dir"/g*.log >&2; exit 1; }
  sleep 0.5
done

run() { # name args...
  local name=$1; shift
  local res
  case $name in
    tollgate) res=$($tg envoybench --addr $tg_grpc --pid "$tg_pid" --json "${tgargs[@]}" 2>"$dir/err") ;;
    guber1) res=$($gb --addr "$g1_addr" --pid "$g1_pid" "${gbargs[@]}" 2>"$dir/err") ;;
    guber3) res=$($gb --addr "$g3_addr" --pid "$g3a,$g3b,$g3c" "${gbargs[@]}" 2>"$dir/err") ;;
  esac || { echo "round $round, $name, ${gbargs[*]}: $(cat "$dir/err")" >&2; return 0; }
  jq -c --arg s "$name" --arg r "$round" '. + {server: $s, round: ($r|tonumber)}' <<<"$res" >> "$out"
}
all() { # the order rotates by round
  local order=(tollgate guber1 guber3) k
  for k in 0 1 2; do run "${order[$(( (k + round) % 3 ))]}"; done
}

echo "$(date -u +%FT%TZ)  $(nproc) cores  $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')  load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "peer: gubernator $guber_version (token bucket), ×1 and ×3 (member-list)"
for round in $(seq "$rounds"); do
  tgargs=(--descriptor api=ingest --concurrency "$conc" --duration "$dur")
  gbargs=(--key ingest --limit 1000000 --concurrency "$conc" --duration "$dur")
  all
  for rate in $rates; do
    tgargs=(--descriptor api=ingest --rate "$rate" --concurrency 64 --duration "$dur" --warmup 500ms)
    gbargs=(--key ingest --limit 1000000 --rate "$rate" --concurrency 64 --duration "$dur" --warmup 500ms)
    all
  done
  tgargs=(--descriptor "boundary_s=r$round" --boundary 1s --limit 50 --burst 100 --concurrency 16 --offset 300ms)
  gbargs=(--key "boundary_r$round" --limit 50 --boundary 1s --burst 100 --concurrency 16 --offset 300ms)
  all
  echo "round $round done, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
if grep -q 'traces export' "$dir"/g*.log; then echo "note: Gubernator tried to export traces" >&2; fi

# --- medians and ratios ----------------------------------------------------------
med() { # jq filter selecting numbers → median
  jq -s "[.[] | $1] | sort | if length == 0 then null else (if length % 2 == 1 then .[length/2|floor] else (.[length/2-1] + .[length/2]) / 2 end) end" "$out"
}
fmt() { awk -v v="$1" -v f="$2" 'BEGIN { if (v == "null") print "-"; else printf f, v }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "null" || b == "null" || b == 0) print "-"; else printf "%.2f", a / b }'; }
echo
printf '%-36s %11s %11s %11s %9s %9s\n' "median over $rounds rounds" tollgate guber×1 guber×3 "tg÷g1" "tg÷g3"
row() { # label filter field format
  local t a b
  t=$(med "select(.server==\"tollgate\" and $2) | $3")
  a=$(med "select(.server==\"guber1\" and $2) | $3")
  b=$(med "select(.server==\"guber3\" and $2) | $3")
  printf '%-36s %11s %11s %11s %9s %9s\n' "$1" "$(fmt "$t" "$4")" "$(fmt "$a" "$4")" "$(fmt "$b" "$4")" "$(ratio "$t" "$a")" "$(ratio "$t" "$b")"
}
row "closed: decisions per CPU-second" '.mode=="closed"' .decisions_per_cpu_s '%.0f'
row "closed: ns of server CPU/decision" '.mode=="closed"' .ns_per_decision '%.0f'
row "closed: decisions/s" '.mode=="closed"' .decisions_per_s '%.0f'
row "closed: p50 µs" '.mode=="closed"' .p50_us '%.0f'
row "closed: p99 µs" '.mode=="closed"' .p99_us '%.0f'
for rate in $rates; do
  row "open $rate/s: p50 µs" ".mode==\"open\" and .offered_per_s==$rate" .p50_us '%.0f'
  row "open $rate/s: p99 µs" ".mode==\"open\" and .offered_per_s==$rate" .p99_us '%.0f'
  row "open $rate/s: decisions per CPU-s" ".mode==\"open\" and .offered_per_s==$rate" .decisions_per_cpu_s '%.0f'
  row "open $rate/s: runs sustained" ".mode==\"open\" and .offered_per_s==$rate" '(if .sustained then 1 else 0 end)' '%.1f'
done
row "1 s boundary: admitted ÷ limit" '.mode=="boundary"' .boundary.admitted_over_limit '%.2f'
echo "calls failed in all runs: $(jq -s '[.[] | .errors] | add' "$out")"
echo "per run (server round mode rate decisions/s per-cpu-s p50 p99 admitted):"
jq -r '[.server, .round, .mode, (.offered_per_s // "-"), (.decisions_per_s|floor), ((.decisions_per_cpu_s // 0)|floor), (.p50_us|floor), (.p99_us|floor), (.boundary.admitted_over_limit // "-"), (if .mode=="open" and (.sustained|not) then "NOT SUSTAINED" else "" end)] | @tsv' "$out"
