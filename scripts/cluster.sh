#!/usr/bin/env bash
# Local three-zone cluster on loopback: `scripts/cluster.sh start` / `stop`,
# and `restart-node N` (SIGTERM node N, start it again, wait for /readyz).
# Node i (1..3) is in zone-{a,b,c} and listens on 127.0.0.1:
#   gRPC 74i0, raft 74i1, gossip 74i2, HTTP 74i3
# (the leading 74 is $TOLLGATE_CLUSTER_PORT_BASE, two digits, default 74)
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
[[ "$pb" =~ ^([1-5][0-9]|6[0-5])$ ]] || { echo "TOLLGATE_CLUSTER_PORT_BASE=$pb: want two digits, 10..65 (ports \${base}i0..\${base}i3)" >&2; exit 2; }

running() { # prints the pids of this cluster's live nodes
  local i f
  for i in 1 2 3; do
    f="$dir/node-$i.pid"
    [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && cat "$f"
  done
  return 0
}

stop_nodes() {
  local i f
  for i in 1 2 3; do
    f="$dir/node-$i.pid"
    [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true
  done
  for i in 1 2 3; do
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
launch_node() {
  local i=$1 join=()
  [ "$i" -gt 1 ] && join=(--join "127.0.0.1:${pb}12")
  "$bin" server --node-id "node-$i" --zone "${zones[$((i-1))]}" --data-dir "$dir/node-$i" \
    --grpc-addr "127.0.0.1:${pb}${i}0" --raft-addr "127.0.0.1:${pb}${i}1" --gossip-addr "127.0.0.1:${pb}${i}2" \
    --http-addr "127.0.0.1:${pb}${i}3" --bootstrap-expect 3 "${join[@]}" --admin-token-file "$dir/admin-token" \
    --gossip-keyring-file "$dir/gossip.key" \
    --default-max-series "${TOLLGATE_MAX_SERIES:-150000}" >> "$dir/node-$i.log" 2>&1 &
  echo $! > "$dir/node-$i.pid"
}

# restart_node I: graceful stop (SIGTERM: the node hands its leaderships off
# first), start again with the same flags and data, wait until /readyz is 200.
restart_node() {
  local i=$1 f="$dir/node-$1.pid" pid
  [[ "$i" =~ ^[123]$ ]] || { echo "restart-node: want 1, 2 or 3, got '$i'" >&2; exit 2; }
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null || { echo "node-$i is not running (no live pid in $f)" >&2; exit 1; }
  pid=$(cat "$f")
  kill -TERM "$pid"
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    fail "node-$i" "node-$i did not stop within 30s of SIGTERM"
  fi
  launch_node "$i"
  for _ in $(seq 600); do
    kill -0 "$(cat "$f")" 2>/dev/null || fail "node-$i" "node-$i exited during restart"
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${pb}${i}3/readyz")" = 200 ]; then
      return 0
    fi
    sleep 0.1
  done
  fail "node-$i" "node-$i not ready (/readyz) after 60s"
}

start() {
  if [ -n "$(running)" ]; then
    echo "a cluster from this checkout runs already (data in $dir); run: make cluster-stop" >&2
    exit 1
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
  restart-node) restart_node "${2:-}" ;;
  *) echo "usage: $0 start|stop|restart-node N   (state in \${TOLLGATE_CLUSTER_DIR:-./data/cluster})" >&2; exit 2 ;;
esac
