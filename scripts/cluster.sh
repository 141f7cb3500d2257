#!/usr/bin/env bash
# Local three-zone cluster on loopback: `scripts/cluster.sh start` / `stop`,
# and `restart-node N` (alias `restart N`: SIGTERM node N if it runs, start it
# again from its data, wait for /readyz) — also how a node that was killed
# (kill -9) comes back. `start` while some nodes run starts the missing ones.
# Node i (1..3) is in zone-{a,b,c} and listens on 127.0.0.1:
#   gRPC 74i0, raft 74i1, gossip 74i2, HTTP 74i3
# (the leading 74 is $TOLLGATE_CLUSTER_PORT_BASE, two digits 10..99, default
# 74: every port stays a four-digit one, below the kernel's ephemeral range)
# `add-node N` (N = 4..30) starts one more node that joins the running
# cluster: zone-{a,b,c} in turn (node 4 in zone-a), ports base×100 + 10N + k
# (node 12 of base 74: gRPC 7520 … HTTP 7523; so clusters on this machine
# keep bases at least 3 apart). stop, start and restart-node cover added
# nodes too.
# Data, logs, pid files and the admin token go under $TOLLGATE_CLUSTER_DIR
# (default: ./data/cluster in this checkout, so two checkouts or two users do
# not share state). The admin token is generated into <dir>/admin-token and
# handed to the nodes with --admin-token-file: it never appears in a command line.
# A gossip key is generated the same way into <dir>/gossip.key (--gossip-keyring-file):
# it encrypts gossip and is the cluster key nodes authenticate to each other with,
# so a process on this machine cannot join the cluster and pose as a node.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${TOLLGATE_BIN:-./bin/tollgate}
dir=${TOLLGATE_CLUSTER_DIR:-$PWD/data/cluster}
zones=(zone-a zone-b zone-c)
pb=${TOLLGATE_CLUSTER_PORT_BASE:-74}
[[ "$pb" =~ ^[1-9][0-9]$ ]] || { echo "TOLLGATE_CLUSTER_PORT_BASE=$pb: want two digits, 10..99 (ports \${base}i0..\${base}i3)" >&2; exit 2; }

# port I K: node I's port K (0 gRPC, 1 raft, 2 gossip, 3 HTTP).
port() { echo $((10#$pb * 100 + $1 * 10 + $2)); }

# nodes: the numbers of this cluster's nodes: 1, 2, 3 and every added one.
nodes() {
  local d
  {
    echo 1; echo 2; echo 3
    for d in "$dir"/node-*; do
      [ -d "$d" ] && [[ "${d##*/node-}" =~ ^[0-9]+$ ]] && echo "${d##*/node-}"
    done
  } | sort -nu
}

running() { # prints the pids of this cluster's live nodes
  local i f
  for i in $(nodes); do
    f="$dir/node-$i.pid"
    [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && cat "$f"
  done
  return 0
}

stop_nodes() {
  local i f
  for i in $(nodes); do
    f="$dir/node-$i.pid"
    [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true
  done
  for i in $(nodes); do
    f="$dir/node-$i.pid"
    [ -f "$f" ] || continue
    for _ in $(seq 100); do kill -0 "$(cat "$f")" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
}

# fail NODE MESSAGE: print the node's log tail, stop the others, exit non-zero.
fail() {
  echo "$2" >&2
  if [ -f "$dir/$1.log" ]; then
    echo "--- last lines of $dir/$1.log ---" >&2
    tail -n 20 "$dir/$1.log" >&2
  fi
  stop_nodes
  echo "stopped the other nodes; data and logs kept in $dir" >&2
  exit 1
}

# launch_node I: start node I in the background (its log is appended to).
# A first start of node 2 or 3 joins node-1's gossip (node-1 joins nobody);
# an added node, and any restart, joins nodes 1-3 (but itself), so a
# restarted node-1 finds the cluster again too. Only nodes 1-3 form the
# cluster (--bootstrap-expect 3); an added node is added by the leaders.
launch_node() {
  local i=$1 j join=() expect=()
  if [ -d "$dir/node-$i" ] || [ "$i" -gt 3 ]; then
    for j in 1 2 3; do [ "$j" -ne "$i" ] && join+=(--join "127.0.0.1:$(port "$j" 2)"); done
  elif [ "$i" -gt 1 ]; then
    join=(--join "127.0.0.1:$(port 1 2)")
  fi
  [ "$i" -le 3 ] && expect=(--bootstrap-expect 3)
  "$bin" server --node-id "node-$i" --zone "${zones[$(((i-1) % 3))]}" --data-dir "$dir/node-$i" \
    --grpc-addr "127.0.0.1:$(port "$i" 0)" --raft-addr "127.0.0.1:$(port "$i" 1)" --gossip-addr "127.0.0.1:$(port "$i" 2)" \
    --http-addr "127.0.0.1:$(port "$i" 3)" "${expect[@]}" "${join[@]}" --admin-token-file "$dir/admin-token" \
    --gossip-keyring-file "$dir/gossip.key" \
    --default-max-series "${TOLLGATE_MAX_SERIES:-150000}" >> "$dir/node-$i.log" 2>&1 &
  echo $! > "$dir/node-$i.pid"
}

# restart_node I: graceful stop when node I runs (SIGTERM: the node hands its
# leaderships off first), then start it again with the same flags and data and
# wait until /readyz is 200. A node that is not running (killed, crashed) is
# just started again.
restart_node() {
  local i=$1 f="$dir/node-$1.pid" pid
  [[ "$i" =~ ^[1-9][0-9]?$ ]] || { echo "restart-node: want a node number (1, 2, 3 or an added one), got '$i'" >&2; exit 2; }
  [ -d "$dir/node-$i" ] || { echo "node-$i has no data in $dir/node-$i: start the cluster first (make cluster)" >&2; exit 1; }
  if [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null; then
    pid=$(cat "$f")
    kill -TERM "$pid"
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      fail "node-$i" "node-$i did not stop within 30s of SIGTERM"
    fi
  else
    echo "node-$i is not running; starting it again from $dir/node-$i"
  fi
  launch_node "$i"
  wait_ready "$i"
}

# wait_ready I: until node I's /readyz is 200 (fails after 60 s, or at once
# when the node exits).
wait_ready() {
  local i=$1 f="$dir/node-$1.pid"
  for _ in $(seq 600); do
    kill -0 "$(cat "$f")" 2>/dev/null || fail "node-$i" "node-$i exited while starting"
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$(port "$i" 3)/readyz")" = 200 ]; then
      echo "node-$i ready (grpc 127.0.0.1:$(port "$i" 0))"
      return 0
    fi
    sleep 0.1
  done
  fail "node-$i" "node-$i not ready (/readyz) after 60s"
}

# add_node N: start node N (4..30), new, joining the running cluster; wait
# until it is ready (it is ready once it knows every group's leader; the
# leaders add it to groups as placement wants, learner first).
add_node() {
  local i=${1:-}
  [[ "$i" =~ ^[0-9]+$ ]] && [ "$i" -ge 4 ] && [ "$i" -le 30 ] || { echo "add-node: want a node number 4..30, got '$i'" >&2; exit 2; }
  [ -d "$dir/node-$i" ] && { echo "node-$i exists in $dir/node-$i: use restart-node $i" >&2; exit 1; }
  [ -n "$(running)" ] || { echo "no cluster from this checkout runs: start it first" >&2; exit 1; }
  : > "$dir/node-$i.log"
  launch_node "$i"
  wait_ready "$i"
}

# node_running I: whether node I has a live pid.
node_running() {
  local f="$dir/node-$1.pid"
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

start() {
  if [ -n "$(running)" ]; then
    local i missing=0
    for i in $(nodes); do
      node_running "$i" && continue
      missing=1
      restart_node "$i"
    done
    if [ "$missing" -eq 0 ]; then
      echo "a cluster from this checkout runs already (data in $dir); run: make cluster-stop" >&2
      exit 1
    fi
    return 0
  fi
  [ -x "$bin" ] || go build -o "$bin" ./cmd/tollgate
  mkdir -p "$dir"
  if [ ! -s "$dir/gossip.key" ]; then
    (umask 077; "$bin" tls gossip-key > "$dir/gossip.key")
  fi
  if [ ! -s "$dir/admin-token" ]; then
    (umask 077; od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$dir/admin-token")
  fi
  for i in 1 2 3; do
    : > "$dir/node-$i.log" # the ready check below must not see an earlier run's banner
    launch_node "$i"
  done
  # Wait for the three "ready" banners (printed only once a node serves);
  # a node that exits meanwhile fails the start at once.
  for _ in $(seq 600); do
    n=0
    for i in 1 2 3; do
      kill -0 "$(cat "$dir/node-$i.pid")" 2>/dev/null || fail "node-$i" "node-$i exited during start"
      grep -q '^tollgate node .* ready$' "$dir/node-$i.log" 2>/dev/null && n=$((n+1))
    done
    [ "$n" -eq 3 ] && break
    sleep 0.1
  done
  if [ "$n" -ne 3 ]; then
    for i in 1 2 3; do
      grep -q '^tollgate node .* ready$' "$dir/node-$i.log" || fail "node-$i" "node-$i not ready after 60s"
    done
  fi
  # Nodes added to this cluster before it was stopped come back too.
  for i in $(nodes); do
    if [ "$i" -gt 3 ]; then restart_node "$i"; fi
  done
  cat <<MSG
Tollgate cluster running (3 nodes, zones a/b/c); data and logs in $dir
  node-1  grpc 127.0.0.1:${pb}10  http http://127.0.0.1:${pb}13
  node-2  grpc 127.0.0.1:${pb}20  http http://127.0.0.1:${pb}23
  node-3  grpc 127.0.0.1:${pb}30  http http://127.0.0.1:${pb}33

  export TOLLGATE_ADDR=127.0.0.1:${pb}10,127.0.0.1:${pb}20,127.0.0.1:${pb}30
  export TOLLGATE_ADMIN_TOKEN=\$(cat $dir/admin-token)
  $bin status
  $bin bench --duration 10s
  kill -9 \$(cat $dir/node-2.pid)      # tracking goes on with two zones
  scripts/cluster.sh restart 2                 # node-2 again, from its data
  make cluster-stop
MSG
}

stop() {
  if [ -z "$(running)" ]; then
    echo "no local cluster from this checkout is running (looked in $dir)"
    return 0
  fi
  stop_nodes
  echo "stopped; data kept in $dir (rm -rf it when done)"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  restart-node|restart) restart_node "${2:-}" ;;
  add-node) add_node "${2:-}" ;;
  *) echo "usage: $0 start|stop|restart N|add-node N   (state in \${TOLLGATE_CLUSTER_DIR:-./data/cluster})" >&2; exit 2 ;;
esac
