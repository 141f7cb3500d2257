#!/usr/bin/env bash
# Growing a loaded cluster's nodes after raising its group count, as an
# operator does it: scripts/grow-nodes.sh
#
# Starts a fresh 3-node cluster (scripts/cluster.sh, its own directory and
# ports), prefills $SERIES series (16 tenants, no limit), keeps `tollgate
# bench --fail-open` refreshing them, raises the group count to $RAISE_TO
# (the partition moves follow, as in scripts/raise-under-load.sh; no restart),
# then for each size in $SIZES (default "6 12"): adds nodes up to that size
# (`cluster.sh add-node`, zones a/b/c in turn), waits until they run every
# group, waits until every group's voters are placement's target
# (`tollgate status`: no move left, no learner), lets the leader balancer
# run $SETTLE seconds,
# and prints per node: voters, groups led, series in its replicas, series in
# the groups it leads, CPU % over $WINDOW seconds, RSS; then the busiest
# node's leaders against the mean. It fails if series were lost, if the load
# saw a failed request or a fail-open decision, or if a node holds no voter.
#
# Environment: TOLLGATE_BIN (default ./bin/tollgate, built), SERIES (1000000),
# RAISE_TO (16), SIZES ("6 12"), SETTLE (60), WINDOW (20), TOLLGATE_CLUSTER_DIR
# (a new temp dir, removed unless KEEP=1), TOLLGATE_CLUSTER_PORT_BASE (24).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${TOLLGATE_BIN:-./bin/tollgate}
series=${SERIES:-1000000}
groups=${RAISE_TO:-16}
sizes=${SIZES:-6 12}
settle=${SETTLE:-60}
window=${WINDOW:-20}
export TOLLGATE_BIN=$bin
export TOLLGATE_MAX_SERIES=0
export TOLLGATE_CLUSTER_PORT_BASE=${TOLLGATE_CLUSTER_PORT_BASE:-24}
export TOLLGATE_CLUSTER_DIR=${TOLLGATE_CLUSTER_DIR:-$(mktemp -d /tmp/tollgate-grow.XXXXXX)}
pb=$TOLLGATE_CLUSTER_PORT_BASE
dir=$TOLLGATE_CLUSTER_DIR
go build -o "$bin" ./cmd/tollgate
port() { echo $((10#$pb * 100 + $1 * 10 + $2)); }
addrs="127.0.0.1:$(port 1 0),127.0.0.1:$(port 2 0),127.0.0.1:$(port 3 0)"

echo "== $(date -u +%FT%TZ) $(nproc) cores, $(git rev-parse --short HEAD), SERIES=$series RAISE_TO=$groups SIZES=\"$sizes\" =="
. scripts/lib-loaded-cluster.sh # cleanup on exit, cluster start, admin token, now
per=$((series / 16))
"$bin" bench --addr "$addrs" --tenants 16 --series-per-tenant "$per" --prefill --new-fraction 0 --request-size 1000 \
  --concurrency 4 --duration 1s --seed 7 >/dev/null 2>&1

# (status exits non-zero while a replica is down or a node unreachable: the
# JSON is what counts here)
status_json() { "$bin" status --addr "$addrs" --json 2>/dev/null || true; }
held() { # series held by the groups' leaders, summed
  status_json | jq '[.nodes[]?.groups[]? | select((.raftState // .raft_state) == "Leader") | (.series // 0 | tonumber)] | add // 0'
}
# wait_until WHAT SECONDS CMD...: poll CMD every second until it succeeds.
wait_until() {
  local what=$1 limit=$2 t0
  shift 2
  t0=$(now)
  until "$@"; do
    if [ "$(echo "$(now) - $t0 > $limit" | bc)" = 1 ]; then echo "$what: not after $limit s" >&2; exit 1; fi
    sleep 1
  done
}
moves_done() {
  status_json | jq -e --argjson g "$groups" '(.partitionMoves // .partition_moves) as $m | $m != null and ($m.pending // 0) == 0 and ($m.groups // 0) == $g' >/dev/null
}
# Every group's leader answered, its voters are placement's target and it
# has no learner.
placed() {
  status_json | jq -e --argjson g "$groups" '(.placement // []) as $p | ($p | length) == $g and
    all($p[]; ((.voters // []) | sort) == ((.target // []) | sort) and ((.learners // []) | length) == 0)' >/dev/null
}
# created FIRST LAST: nodes FIRST..LAST run every group (raft).
created() {
  status_json | jq -e --argjson g "$groups" --argjson a "$1" --argjson b "$2" '
    [range($a; $b + 1) | "node-\(.)"] as $want |
    [.nodes[] | select(((.nodeId // .node_id) as $id | $want | index($id)) != null) | (.groups // [] | length)] |
    length == ($want | length) and all(. == $g)' >/dev/null
}
pid_of() { cat "$dir/node-$1.pid"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

"$bin" bench --addr "$addrs" --fail-open --tenants 16 --series-per-tenant "$per" --new-fraction 0 \
  --request-size 1000 --concurrency 4 --duration 7200s --seed 7 --json > "$dir/bench.json" 2> "$dir/bench.err" &
bench_pid=$!
sleep 5
before=$(held)
echo "3 nodes, 4 groups: series held $before; raising to $groups"
t0=$(now)
"$bin" groups raise --addr "$addrs" --to "$groups" >/dev/null
wait_until "moves to $groups groups" 600 moves_done
printf 'raise to %d groups: moves done after %.0f s; series held %s\n' "$groups" "$(echo "$(now) - $t0" | bc)" "$(held)"

report() { # report SIZE: the per-node table and the leaders' spread
  local n=$1 i pid hz c0 c1 js t0 t1 secs
  hz=$(getconf CLK_TCK)
  declare -A start end
  t0=$(now)
  for i in $(seq "$n"); do start[$i]=$(cpu_ticks "$(pid_of "$i")"); done
  sleep "$window"
  for i in $(seq "$n"); do end[$i]=$(cpu_ticks "$(pid_of "$i")"); done
  t1=$(now)
  secs=$(echo "$t1 - $t0" | bc)
  js=$(status_json)
  printf '%-8s %-7s %6s %6s %16s %12s %6s %8s\n' NODE ZONE VOTERS LEADS "SERIES(replicas)" "SERIES(led)" "CPU%" "RSS MB"
  for i in $(seq "$n"); do
    pid=$(pid_of "$i")
    c1=${end[$i]}
    c0=${start[$i]}
    echo "$js" | jq -r --arg id "node-$i" --arg cpu "$(echo "scale=1; ($c1 - $c0) * 100 / $hz / $secs" | bc)" \
      --arg rss "$(($(awk '/^VmRSS/ {print $2}' "/proc/$pid/status") / 1024))" '
      .nodes[] | select((.nodeId // .node_id) == $id) |
      [.groups[]? | select((.raftState // .raft_state) == "Leader" or (.raftState // .raft_state) == "Follower")] as $v |
      [$v[] | select((.raftState // .raft_state) == "Leader")] as $l |
      "\($id | .[0:8] | . + (" " * (8 - length))) \(.zone) \($v | length | tostring | (" " * (6 - length)) + .) \($l | length | tostring | (" " * (6 - length)) + .) \([$v[] | (.series // 0 | tonumber)] | add // 0 | tostring | (" " * (16 - length)) + .) \([$l[] | (.series // 0 | tonumber)] | add // 0 | tostring | (" " * (12 - length)) + .) \($cpu | (" " * (6 - length)) + .) \($rss | (" " * (8 - length)) + .)"'
  done
  printf 'all nodes: %.0f %% CPU (of %d cores × 100 %%) over %.1f s\n' \
    "$(echo "scale=1; ($(for i in $(seq "$n"); do printf '%s + ' "$((end[$i] - start[$i]))"; done) 0) * 100 / $hz / $secs" | bc)" "$(nproc)" "$secs"
  echo "$js" | jq -r --argjson n "$n" '
    [.nodes[] | [.groups[]? | select((.raftState // .raft_state) == "Leader")] | length] as $l |
    [.nodes[] | [.groups[]? | select((.raftState // .raft_state) == "Leader" or (.raftState // .raft_state) == "Follower")] | length] as $v |
    (($l | add) / $n) as $mean |
    "leaders: mean \($mean * 100 | round / 100), busiest \($l | max) (\(($l | max) / $mean * 100 | round / 100)x the mean); nodes without a voter: \([$v[] | select(. == 0)] | length)"'
  echo "$js" | jq -e '[.nodes[] | [.groups[]? | select((.raftState // .raft_state) == "Leader" or (.raftState // .raft_state) == "Follower")] | length] | all(. > 0)' >/dev/null ||
    { echo "a node holds no voter" >&2; exit 1; }
}

echo
echo "size 3, $groups groups (after ${settle} s of leader balancing):"
sleep "$settle"
report 3
have=3
for size in $sizes; do
  t0=$(now)
  for i in $(seq $((have + 1)) "$size"); do ./scripts/cluster.sh add-node "$i" >/dev/null; done
  # A node that joins after a raise learns the table from group 0's leader
  # and creates (and serves) the raised groups.
  wait_until "the added nodes running $groups groups" 120 created $((have + 1)) "$size"
  t1=$(now)
  wait_until "placement on $size nodes" 900 placed
  t2=$(now)
  have=$size
  sleep "$settle"
  echo
  printf 'size %d, %d groups: nodes added and running every group in %.0f s, placement done %.0f s later, then %d s of leader balancing\n' \
    "$size" "$groups" "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)" "$settle"
  report "$size"
done

kill -INT "$bench_pid" 2>/dev/null || true
wait "$bench_pid" || true
bench_pid=
after=$(held)
echo
jq -r '"load: \(.requests) requests, \(.requests_failed) failed, \(.failed_open) fail-open decisions, \(.retries) retries; p99 \(.p99_ms) ms"' "$dir/bench.json"
bad=$(jq '.requests_failed + .failed_open' "$dir/bench.json")
echo "series held: before $before, after $after"
[ "$after" -ge "$before" ] || { echo "series lost: $before before, $after after" >&2; exit 1; }
[ "$bad" = 0 ] || { echo "the load saw $bad failed requests or fail-open decisions" >&2; exit 1; }
echo "== done $(date -u +%FT%TZ) =="
