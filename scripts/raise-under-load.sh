#!/usr/bin/env bash
# Raising the group count online under load, as an operator does it:
# scripts/raise-under-load.sh
#
# Starts a fresh 3-node cluster (scripts/cluster.sh, its own directory and
# ports), prefills $SERIES series (16 tenants, no limit), keeps `tollgate bench
# --fail-open` refreshing them (and $NEW_FRACTION new ones), then for each
# count in $RAISES (default "8 16"): `tollgate groups raise --to N` (every
# node serves the new groups in place; RESTART=1 adds the rolling restart the
# earlier builds needed) and waits until `tollgate status` reports no
# partition move pending. It prints, per raise, the seconds from the raise to
# the last move, the series the groups' leaders hold before and after
# (every acknowledged series must still be held: the moves lose none), and
# the load's errors and fail-open decisions over the whole run.
#
# KILLS=1: during each raise's moves, SIGKILL (then restart) the node of
# group 0's leader (the coordinator), then the leader of the group a move
# under way takes a partition from, then the leader of the group it gives
# it to, one at a time, each as soon as a move is under way and the cluster
# has all three nodes again; the moves must still finish, lose no series,
# and surface no error (clientlib retries on the other nodes). The nodes run
# with TOLLGATE_TEST_MOVE_STEP_PAUSE (default 300ms with KILLS=1) between a
# move's steps, so that the kills land mid-move.
#
# LIMITED=1: every tenant is limited to its prefill (--default-max-series
# SERIES/16, so the prefill puts each at its limit) and the load's universe is
# 5 % larger (NEW_FRACTION defaults to 0.02): throughout the raises the load
# offers series above every tenant's limit, which must all be refused. At the
# end each tenant's series (GET /api/v1/tenants, every group) must be at most
# its limit. No series expires during the run (it must end within the 20 min
# idle timeout, which the script checks) and none is lost (the held check),
# so the final count bounds the count at every earlier moment: no tenant was
# above its limit at any time.
#
# Environment: TOLLGATE_BIN (default ./bin/tollgate, built), SERIES (2000000),
# RAISES ("8 16"), NEW_FRACTION (0; 0.02 with LIMITED=1), RESTART (0), KILLS (0), LIMITED (0),
# TOLLGATE_CLUSTER_DIR (a new temp dir, removed unless KEEP=1),
# TOLLGATE_CLUSTER_PORT_BASE (63).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${TOLLGATE_BIN:-./bin/tollgate}
series=${SERIES:-2000000}
raises=${RAISES:-8 16}
export TOLLGATE_BIN=$bin
per=$((series / 16))
universe=$per
new_fraction=${NEW_FRACTION:-0}
if [ "${LIMITED:-0}" = 1 ]; then
  export TOLLGATE_MAX_SERIES=$per
  universe=$((per + per / 20))
  new_fraction=${NEW_FRACTION:-0.02}
else
  export TOLLGATE_MAX_SERIES=0
fi
export TOLLGATE_CLUSTER_PORT_BASE=${TOLLGATE_CLUSTER_PORT_BASE:-63}
export TOLLGATE_CLUSTER_DIR=${TOLLGATE_CLUSTER_DIR:-$(mktemp -d /tmp/tollgate-raise.XXXXXX)}
if [ "${KILLS:-0}" = 1 ]; then
  export TOLLGATE_TEST_MOVE_STEP_PAUSE=${TOLLGATE_TEST_MOVE_STEP_PAUSE:-300ms}
fi
pb=$TOLLGATE_CLUSTER_PORT_BASE
dir=$TOLLGATE_CLUSTER_DIR
go build -o "$bin" ./cmd/tollgate
addrs="127.0.0.1:${pb}10,127.0.0.1:${pb}20,127.0.0.1:${pb}30"

. scripts/lib-loaded-cluster.sh # cleanup on exit, cluster start, admin token, now
start=$(now)
echo "cluster up in $dir; prefilling $series series (16 tenants × $per$([ "${LIMITED:-0}" = 1 ] && echo ", each tenant's limit"))"
"$bin" bench --addr "$addrs" --tenants 16 --series-per-tenant "$per" --prefill --new-fraction 0 --request-size 1000 \
  --concurrency 4 --duration 1s --seed 7 >/dev/null 2>&1

status_json() { "$bin" status --addr "$addrs" --json 2>/dev/null; }
# Series held by each group's leader, summed.
held() {
  status_json | jq '[.nodes[]?.groups[]? | select((.raftState // .raft_state) == "Leader") | (.series // 0 | tonumber)] | add // 0'
}
# Groups led per node ("node-1=5 node-2=6 …").
leaders() {
  status_json | jq -r '[.nodes[]? | {id: (.nodeId // .node_id), n: ([.groups[]? | select((.raftState // .raft_state) == "Leader")] | length)}] | map("\(.id)=\(.n)") | join(" ")'
}
pending() {
  status_json | jq -r '(.partitionMoves // .partition_moves) as $m | if $m == null then "?" else ($m.pending // 0 | tostring) + " " + ($m.groups // 0 | tostring) end'
}

# The node number leading group $1 (empty when none is known, or no node
# answered: a status call can fail while a node restarts).
leader_of() {
  status_json | jq -r --argjson g "$1" '[.nodes[]? | (.nodeId // .node_id) as $id | .groups[]? | select((.group // 0) == $g and (.raftState // .raft_state) == "Leader") | $id] | first // "" | ltrimstr("node-")' || true
}
# The move under way, "FROM TO" (empty when none).
current_move() {
  status_json | jq -r '((.partitionMoves // .partition_moves).current // "")' | sed -n 's/^partition [0-9]*: group \([0-9]*\) → \([0-9]*\)$/\1 \2/p' || true
}
# kill_during_moves TO: the three kills of KILLS=1 during the raise to TO.
kill_during_moves() {
  local what n mv from dest
  for what in coordinator source destination; do
    n=
    for _ in $(seq 600); do
      mv=$(current_move)
      if [ -n "$mv" ]; then
        read -r from dest <<< "$mv"
        case $what in
          coordinator) n=$(leader_of 0) ;;
          source) n=$(leader_of "$from") ;;
          destination) n=$(leader_of "$dest") ;;
        esac
        [ -n "$n" ] && break
      fi
      read -r p g < <(pending)
      if [ "$p" = 0 ] && [ "$g" = "$1" ]; then
        echo "  raise to $1: the moves finished before the $what could be killed" >&2
        return 0
      fi
      sleep 0.1
    done
    [ -n "$n" ] || { echo "raise to $1: no move under way to kill the $what of" >&2; exit 1; }
    printf '  %s SIGKILL node-%s (the %s; move: group %s → %s)\n' "$(date +%T.%3N)" "$n" "$what" "$from" "$dest"
    kill -KILL "$(cat "$dir/node-$n.pid")"
    sleep 1
    ./scripts/cluster.sh restart-node "$n" >/dev/null
    printf '  %s node-%s ready again\n' "$(date +%T.%3N)" "$n"
  done
}
"$bin" bench --addr "$addrs" --fail-open --tenants 16 --series-per-tenant "$universe" --new-fraction "$new_fraction" \
  --request-size 1000 --concurrency 4 --duration 3600s --seed 7 --json > "$dir/bench.json" 2> "$dir/bench.err" &
bench_pid=$!
sleep 5
before=$(held)
echo "series held before: $before"
for to in $raises; do
  t0=$(now)
  out=$("$bin" groups raise --addr "$addrs" --to "$to"); echo "${out%%$'\n'*}"
  if [ "${RESTART:-0}" = 1 ]; then
    for i in 1 2 3; do ./scripts/cluster.sh restart-node "$i" >/dev/null; done
  fi
  if [ "${KILLS:-0}" = 1 ]; then
    kill_during_moves "$to"
  fi
  t1=$(now)
  while :; do
    read -r p g < <(pending)
    [ "$p" = 0 ] && [ "$g" = "$to" ] && break
    if [ "$(echo "$(now) - $t0 > 600" | bc)" = 1 ]; then echo "raise to $to: moves not done after 600 s (pending $p)" >&2; exit 1; fi
    sleep 0.5
  done
  t2=$(now)
  printf 'raise to %d: moves done %.1f s after the raise (%.1f s after the raise command returned%s); series held: %s\n' \
    "$to" "$(echo "$t2 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)" "$([ "${RESTART:-0}" = 1 ] && echo ' and the rolling restart')" "$(held)"
  # The leader balancer moves one leadership per node every ~10 s
  # (--leader-balance-interval): counts after 10, 30 and 60 s.
  sleep 10; l10=$(leaders); sleep 20; l30=$(leaders); sleep 30
  echo "  groups led per node after 10 s: $l10; 30 s: $l30; 60 s: $(leaders)"
done
sleep 3
kill -INT "$bench_pid" 2>/dev/null || true
wait "$bench_pid" || true
bench_pid=
after=$(held)
jq -r '"load: \(.requests) requests, \(.requests_failed) failed, \(.failed_open) fail-open decisions, \(.retries) retries; p99 \(.p99_ms) ms; worst second: p99 \([.seconds[]?.p99_ms] | max) ms, max \([.seconds[]?.max_ms] | max) ms"' "$dir/bench.json"
bad=$(jq '.requests_failed + .failed_open' "$dir/bench.json")
echo "series held: before $before, after $after"
[ "$after" -ge "$before" ] || { echo "series lost: $before before, $after after" >&2; exit 1; }
[ "$bad" = 0 ] || { echo "the load saw $bad failed requests or fail-open decisions" >&2; exit 1; }
if [ "${LIMITED:-0}" = 1 ]; then
  took=$(echo "$(now) - $start" | bc)
  [ "$(echo "$took < 1200" | bc)" = 1 ] || { echo "the run took ${took} s, past the 20 min idle timeout: the final count no longer bounds the earlier ones" >&2; exit 1; }
  tenants=$(curl -fsS -H "Authorization: Bearer $TOLLGATE_ADMIN_TOKEN" "http://127.0.0.1:${pb}13/api/v1/tenants?limit=100")
  jq -r --argjson lim "$per" '"tenants at the end (limit \($lim) each): series min \([.tenants[].series] | min), max \([.tenants[].series] | max), above the limit: \([.tenants[] | select(.series > $lim)] | length)"' <<< "$tenants"
  jq -r '"  the load sent \(.new) series it had not sent before (the prefill'"'"'s among them): \(.new_rejected) refused, the tenant at its limit; \(.rejected) refusals in all, re-sends of refused series included"' "$dir/bench.json"
  over=$(jq --argjson lim "$per" '[.tenants[] | select(.series > $lim)] | length' <<< "$tenants")
  [ "$over" = 0 ] || { echo "$over tenants above their limit" >&2; exit 1; }
  [ "$(jq '.new_rejected' "$dir/bench.json")" -gt 0 ] || { echo "the load never offered a series above a limit" >&2; exit 1; }
fi
