#!/usr/bin/env bash
# Local three-zone cluster on loopback: `scripts/cluster.sh start` / `stop`.
# Node i (1..3) is in zone-{a,b,c} and listens on 127.0.0.1:
#   gRPC 74i0, raft 74i1, gossip 74i2, HTTP 74i3
# Data, logs, pid files and the admin token go under $TOLLGATE_CLUSTER_DIR
# (default: ./data/cluster in this checkout, so two checkouts or two users do
# not share state). The admin token is generated into <dir>/admin-token and
# handed to the nodes with --admin-token-file: it never appears in a command line.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${TOLLGATE_BIN:-./bin/tollgate}
dir=${TOLLGATE_CLUSTER_DIR:-$PWD/data/cluster}
zones=(zone-a zone-b zone-c)

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

start() {
  if [ -n "$(running)" ]; then
    echo "a cluster from this checkout runs already (data in $dir); run: make cluster-stop" >&2
    exit 1
  fi
  [ -x "$bin" ] || go build -o "$bin" ./cmd/tollgate
  mkdir -p "$dir"
  if [ ! -s "$dir/admin-token" ]; then
    (umask 077; od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$dir/admin-token")
  fi
  for i in 1 2 3; do
    join=()
    [ "$i" -gt 1 ] && join=(--join 127.0.0.1:7412)
    "$bin" server --node-id "node-$i" --zone "${zones[$((i-1))]}" --data-dir "$dir/node-$i" \
      --grpc-addr "127.0.0.1:74${i}0" --raft-addr "127.0.0.1:74${i}1" --gossip-addr "127.0.0.1:74${i}2" \
      --http-addr "127.0.0.1:74${i}3" --bootstrap-expect 3 "${join[@]}" --admin-token-file "$dir/admin-token" \
      --default-max-series "${TOLLGATE_MAX_SERIES:-150000}" > "$dir/node-$i.log" 2>&1 &
    echo $! > "$dir/node-$i.pid"
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
  node-1  grpc 127.0.0.1:7410  http http://127.0.0.1:7413
  node-2  grpc 127.0.0.1:7420  http http://127.0.0.1:7423
  node-3  grpc 127.0.0.1:7430  http http://127.0.0.1:7433

  export TOLLGATE_ADDR=127.0.0.1:7410,127.0.0.1:7420,127.0.0.1:7430
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
  *) echo "usage: $0 start|stop   (state in \${TOLLGATE_CLUSTER_DIR:-./data/cluster})" >&2; exit 2 ;;
esac
