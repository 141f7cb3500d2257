#!/usr/bin/env bash
# Rolling restart of a local 3-node cluster under `tollgate bench` load, as a
# client (clientlib) sees it: scripts/rolling-restart.sh
#
# Starts a fresh cluster (scripts/cluster.sh, in its own directory and ports),
# runs `tollgate bench --fail-open` against it, lets it warm up for $WARMUP
# seconds (the leader balancer spreads the groups) and run steady for
# $STEADY seconds, then restarts node-1, node-2, node-3 in turn (SIGTERM, start
# again, wait for /readyz, $GAP seconds, next) and lets the load run $STEADY
# more seconds. It prints bench's per-second lines (errors by gRPC code,
# retries, NotLeader answers, fail-open decisions, p99), then:
#   steady p99   median of the per-second p99s after the warm-up, before the roll
#   roll p99     median and worst per-second p99 while nodes restarted
#   errors, fail-open decisions, retries: during the roll and in the whole run
# The bar for a roll clients never notice: 0 errors, 0 fail-open decisions,
# roll p99 ≤ 3× steady p99. The exit status is 1 when errors or fail-open
# decisions were seen (p99 is reported, not judged: it depends on the machine).
#
# Environment: TOLLGATE_BIN (default ./bin/tollgate, built if missing),
# WARMUP (5), STEADY (10), GAP (2), BENCH_ARGS (extra bench flags; default a moderate,
# uniform load: 8 requests in flight of 200 hashes, 10 % of them new series,
# tenants without limit so the mix never changes), TOLLGATE_CLUSTER_DIR (default a
# new temp dir, removed at the end unless KEEP=1), TOLLGATE_CLUSTER_PORT_BASE (64).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${TOLLGATE_BIN:-./bin/tollgate}
steady=${STEADY:-10}
warmup=${WARMUP:-5}
gap=${GAP:-2}
export TOLLGATE_BIN=$bin
export TOLLGATE_MAX_SERIES=${TOLLGATE_MAX_SERIES:-0}
export TOLLGATE_CLUSTER_PORT_BASE=${TOLLGATE_CLUSTER_PORT_BASE:-64}
export TOLLGATE_CLUSTER_DIR=${TOLLGATE_CLUSTER_DIR:-$(mktemp -d /tmp/tollgate-roll.XXXXXX)}
pb=$TOLLGATE_CLUSTER_PORT_BASE
dir=$TOLLGATE_CLUSTER_DIR
[ -x "$bin" ] || go build -o "$bin" ./cmd/tollgate

. scripts/lib-loaded-cluster.sh # cleanup on exit, cluster start, admin token, now
echo "cluster up in $dir (ports ${pb}x0..${pb}x3); load average: $(cut -d' ' -f1-3 /proc/loadavg)"

roll_len_guess=$((3 * (gap + 15)))
duration=$((warmup + 2 * steady + roll_len_guess + 60)) # bench is stopped once the roll is over
# shellcheck disable=SC2086
"$bin" bench --addr "127.0.0.1:${pb}10,127.0.0.1:${pb}20,127.0.0.1:${pb}30" --fail-open \
  --duration "${duration}s" --json ${BENCH_ARGS:---concurrency 8 --request-size 200 --new-fraction 0.1 --series-per-tenant 1000000000} \
  > "$dir/bench.json" 2> "$dir/bench.err" &
bench_pid=$!
t0=$(now)
sleep $((warmup + steady))
roll_start=$(now)
for i in 1 2 3; do
  s=$(now)
  ./scripts/cluster.sh restart-node "$i"
  printf 'node-%d restarted and ready in %.1fs\n' "$i" "$(echo "$(now) - $s" | bc)"
  sleep "$gap"
done
roll_end=$(now)
sleep "$steady"
kill -INT "$bench_pid" 2>/dev/null || true
wait "$bench_pid" || true
bench_pid=

grep '^t=' "$dir/bench.err" || true
if ! jq -e .seconds "$dir/bench.json" >/dev/null 2>&1; then
  echo "bench printed no summary; its stderr:" >&2
  cat "$dir/bench.err" >&2
  exit 1
fi
from=$(echo "($roll_start - $t0) / 1" | bc)
to=$(echo "($roll_end - $t0 + 0.999) / 1" | bc)
jq -r --argjson warm "$warmup" --argjson from "$from" --argjson to "$to" '
  def median: sort | if length == 0 then 0 else .[length / 2 | floor] end;
  def sum(f): map(f) | add // 0;
  (.seconds | map(select(.t > $warm and .t <= $from))) as $steady
  | (.seconds | map(select(.t > $from and .t <= $to + 1))) as $roll
  | "steady (\($steady | length)s): p99 median \($steady | map(.p99_ms) | median) ms",
    "roll   (\($roll | length)s, t=\($from)..\($to + 1)s): p99 median \($roll | map(.p99_ms) | median) ms, worst \($roll | map(.p99_ms) | max // 0) ms; ratio worst/steady \(if ($steady | map(.p99_ms) | median) > 0 then (($roll | map(.p99_ms) | max // 0) / ($steady | map(.p99_ms) | median) * 100 | round / 100) else "n/a" end)",
    "roll: errors \($roll | sum(.errors)) \($roll | map(.errors_by_code // {} | to_entries[]) | group_by(.key) | map({(.[0].key): (map(.value) | add)}) | add // {}), fail-open \($roll | sum(.failed_open)), retries \($roll | sum(.retries)), NotLeader \($roll | sum(.not_leader)), requests \($roll | sum(.requests))",
    "whole run (\(.duration_s | floor)s): requests \(.requests), errors \(.requests_failed) \(.errors_by_code // {}), fail-open \(.failed_open), retries \(.retries), NotLeader \(.not_leader_redirects), p99 \(.p99_ms) ms"
' "$dir/bench.json"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
bad=$(jq '.requests_failed + .failed_open' "$dir/bench.json")
[ "$bad" -eq 0 ]
