#!/usr/bin/env bash
# Tollgate's Envoy rate limit service side by side with the reference server
# (envoyproxy/ratelimit with Debian's redis-server), on loopback, driven by the
# same go-control-plane ShouldRateLimit client (`tollgate envoybench`) with
# the same descriptor file, in interleaved runs (reference, Tollgate, each
# round; the order swaps every round so a drift of the machine's speed
# weighs on both).
#
# The reference is a peer to measure against, installed from the Go module
# registry into a temporary GOBIN; none of its code is part of Tollgate.
#
# Per round it measures, for each server:
#   - a closed loop (--concurrency calls in flight): decisions per CPU-second
#     of every server-side process (the reference: ratelimit + redis-server;
#     Tollgate: the node), CPU read from /proc/<pid>/stat;
#   - open loops at each of RATES: p50/p99 from the calls' scheduled times;
#   - a burst of 2× the limit 300 ms before a 1 s window boundary and another
#     300 ms after it: admitted ÷ limit (a fixed window admits up to 2×).
#     A run whose first burst is not answered before the boundary (a loaded
#     machine) is logged and left out.
# With MINUTE=1, one more boundary test per server on a per-minute rule
# (bursts 5 s either side of a minute's boundary).
# Then it prints the medians and Tollgate ÷ reference ratios.
#
# Usage: scripts/peer-envoy-ratelimit.sh [rounds] [duration]  (default 5 rounds of 5s)
# Environment: RATES="2000 5000" (open-loop calls/s), CONC=32 (closed loop),
#   MINUTE=0|1, REF_PIPELINE_WINDOW (the reference's REDIS_PIPELINE_WINDOW,
#   default unset = its default 0: every Redis write flushed at once),
#   PEER_GOBIN (reuse an installed reference binary), TOLLGATE_BIN (reuse a
#   built tollgate), OUT (a file for the
#   raw JSON lines; default in the run's temporary directory, removed).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
dur=${2:-5s}
rates=${RATES:-"2000 5000"}
conc=${CONC:-32}
ref_version=v1.4.1-0.20260122083618-3fb702589d36
command -v jq >/dev/null || { echo "peer-envoy-ratelimit.sh needs jq" >&2; exit 1; }

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

# --- the two servers' binaries -------------------------------------------------
gobin=${PEER_GOBIN:-$dir/gobin}
mkdir -p "$gobin"
if [ ! -x "$gobin/service_cmd" ]; then
  echo "installing envoyproxy/ratelimit $ref_version into $gobin" >&2
  GOBIN=$gobin go install "github.com/envoyproxy/ratelimit/src/service_cmd@$ref_version"
fi
if ! command -v redis-server >/dev/null; then
  echo "installing Debian's redis-server" >&2
  apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
fi
tg=${TOLLGATE_BIN:-$dir/tollgate}
[ -n "${TOLLGATE_BIN:-}" ] || go build -o "$tg" ./cmd/tollgate

# Ports: loopback, below 32768, apart from the ones other scripts use.
redis_port=18446
ref_grpc=127.0.0.1:18441 ref_http=18442 ref_debug=18443
tg_grpc=127.0.0.1:18450 tg_http=127.0.0.1:18451 tg_raft=127.0.0.1:18452

# --- one descriptor file for both ------------------------------------------------
# Both read envoyproxy/ratelimit's YAML format, so the same file configures
# both: the reference reads it from RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/,
# Tollgate takes it with `limits apply-envoy`.
#   api:        far above the offered load, so every call is a decision that
#               counts and is admitted (the cost of deciding, not of refusing);
#   boundary_s: 50 a second: Tollgate enforces a rule of at most 50/s as a
#               sliding window of one second, the reference as a fixed window;
#   boundary_m: 100 a minute: a sliding window in Tollgate, fixed in the reference.
mkdir -p "$dir/runtime/ratelimit/config"
cat > "$dir/runtime/ratelimit/config/bench.yaml" <<'EOF'
domain: bench
descriptors:
  - key: api
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: boundary_s
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: boundary_m
    rate_limit: {unit: minute, requests_per_unit: 100}
EOF

wait_port() { # host port what
  for _ in $(seq 300); do (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0; sleep 0.1; done
  echo "$3 did not listen on $1:$2" >&2; return 1
}

# --- start redis, the reference, Tollgate ---------------------------------------
redis-server --bind 127.0.0.1 --port $redis_port --save '' --appendonly no \
  --daemonize no --logfile "$dir/redis.log" --dir "$dir" &
redis_pid=$!; pids+=("$redis_pid")
wait_port 127.0.0.1 $redis_port redis-server

(
  cd "$dir"
  export RUNTIME_ROOT=$dir/runtime RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false
  export REDIS_SOCKET_TYPE=tcp REDIS_URL=127.0.0.1:$redis_port
  export HOST=127.0.0.1 PORT=$ref_http DEBUG_HOST=127.0.0.1 DEBUG_PORT=$ref_debug
  export GRPC_HOST=127.0.0.1 GRPC_PORT=${ref_grpc##*:}
  export USE_STATSD=false LOG_LEVEL=warn
  [ -n "${REF_PIPELINE_WINDOW:-}" ] && export REDIS_PIPELINE_WINDOW=$REF_PIPELINE_WINDOW
  exec "$gobin/service_cmd"
) > "$dir/ref.log" 2>&1 &
ref_pid=$!; pids+=("$ref_pid")
wait_port 127.0.0.1 "${ref_grpc##*:}" "envoyproxy/ratelimit" || { cat "$dir/ref.log" >&2; exit 1; }

# A durable single node (raft log fsynced), as `server --dev` runs by default.
$tg server --dev --data-dir "$dir/data" --log-level warn \
  --grpc-addr $tg_grpc --http-addr $tg_http --raft-addr $tg_raft > "$dir/tollgate.log" 2>&1 &
tg_pid=$!; pids+=("$tg_pid")
for _ in $(seq 300); do grep -q 'ready' "$dir/tollgate.log" 2>/dev/null && break; sleep 0.1; done
grep -q 'ready' "$dir/tollgate.log" || { cat "$dir/tollgate.log" >&2; exit 1; }
$tg limits apply-envoy --addr $tg_grpc -f "$dir/runtime/ratelimit/config/bench.yaml" >/dev/null
# Both must decide with the file: a boundary_s burst of 60 (limit 50) must
# see over-limit answers. The reference reads the file at start; the node
# decides with it once it has applied the change.
applied() { # addr value
  $tg envoybench --addr "$1" --descriptor "boundary_s=$2" --boundary 1s --limit 50 --burst 60 --offset 300ms --json |
    jq -e '.errors == 0 and .boundary.before_ok + .boundary.after_ok < 120' >/dev/null
}
check() { # name addr log
  for i in $(seq 10); do applied "$2" "check$i" && return 0; sleep 0.5; done
  echo "$1 does not decide with bench.yaml" >&2; cat "$3" >&2; exit 1
}
check Tollgate $tg_grpc "$dir/tollgate.log"
check "the reference" $ref_grpc "$dir/ref.log"

run() { # name addr pids args...
  local name=$1 addr=$2 p=$3; shift 3
  local res
  if ! res=$($tg envoybench --addr "$addr" --pid "$p" --json "$@" 2>"$dir/err"); then
    echo "round $round, $name, $*: $(cat "$dir/err")" >&2; return 0
  fi
  jq -c --arg s "$name" --arg r "$round" '. + {server: $s, round: ($r|tonumber)}' <<<"$res" >> "$out"
}
both() { # args... ; the order alternates by round
  if (( round % 2 )); then
    run ref $ref_grpc "$ref_pid,$redis_pid" "$@"; run tollgate $tg_grpc "$tg_pid" "$@"
  else
    run tollgate $tg_grpc "$tg_pid" "$@"; run ref $ref_grpc "$ref_pid,$redis_pid" "$@"
  fi
}

echo "$(date -u +%FT%TZ)  $(nproc) cores  $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')  load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "reference: envoyproxy/ratelimit $ref_version, redis $(redis-server --version | grep -o 'v=[^ ]*'), REDIS_PIPELINE_WINDOW=${REF_PIPELINE_WINDOW:-0 (default)}"
for round in $(seq "$rounds"); do
  both --descriptor api=ingest --concurrency "$conc" --duration "$dur"
  for rate in $rates; do
    both --descriptor api=ingest --rate "$rate" --concurrency 64 --duration "$dur" --warmup 500ms
  done
  both --descriptor "boundary_s=r$round" --boundary 1s --limit 50 --burst 100 --concurrency 16 --offset 300ms
  echo "round $round done, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
if [ "${MINUTE:-0}" = 1 ]; then
  round=$((rounds + 1))
  both --descriptor "boundary_m=m$round" --boundary 1m --limit 100 --burst 200 --concurrency 16 --offset 5s
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# --- medians and ratios ----------------------------------------------------------
med() { # jq filter selecting numbers → median
  jq -s "[.[] | $1] | sort | if length == 0 then null else (if length % 2 == 1 then .[length/2|floor] else (.[length/2-1] + .[length/2]) / 2 end) end" "$out"
}
fmt() { awk -v v="$1" -v f="$2" 'BEGIN { if (v == "null") print "-"; else printf f, v }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "null" || b == "null" || b == 0) print "-"; else printf "%.2f", a / b }'; }
echo
printf '%-34s %14s %14s %10s\n' "median over $rounds rounds" reference tollgate "tg ÷ ref"
row() { # label filter format
  local r t
  r=$(med "select(.server==\"ref\" and $2) | $3")
  t=$(med "select(.server==\"tollgate\" and $2) | $3")
  printf '%-34s %14s %14s %10s\n' "$1" "$(fmt "$r" "$4")" "$(fmt "$t" "$4")" "$(ratio "$t" "$r")"
}
count() { # label filter: how many runs of each server pass the filter
  printf '%-34s %14s %14s\n' "$1" "$(jq -s "[.[] | select(.server==\"ref\" and $2)] | length" "$out")" \
    "$(jq -s "[.[] | select(.server==\"tollgate\" and $2)] | length" "$out")"
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
  count "open $rate/s: runs sustained (of $rounds)" ".mode==\"open\" and .offered_per_s==$rate and .sustained"
done
row "1 s boundary: admitted ÷ limit" '.mode=="boundary" and .boundary.unit_s==1' .boundary.admitted_over_limit '%.2f'
[ "${MINUTE:-0}" = 1 ] && row "1 min boundary: admitted ÷ limit" '.mode=="boundary" and .boundary.unit_s==60' .boundary.admitted_over_limit '%.2f'
errs=$(jq -s '[.[] | .errors] | add' "$out")
echo "calls failed in all runs: $errs"
echo "per run (server round mode rate decisions/s per-cpu-s p50 p99 admitted):"
jq -r '[.server, .round, .mode, (.offered_per_s // "-"), (.decisions_per_s|floor), ((.decisions_per_cpu_s // 0)|floor), (.p50_us|floor), (.p99_us|floor), (.boundary.admitted_over_limit // "-"), (if .mode=="open" and (.sustained|not) then "NOT SUSTAINED" else "" end)] | @tsv' "$out"
