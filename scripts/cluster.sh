#!/usr/bin/env bash
# Local three-zone cluster on loopback: `scripts/cluster.sh start` / `stop` / `status`.
# Node i (1..3) is in zone-{a,b,c} and listens on 127.0.0.1:
#   gRPC 74i0, raft 74i1, gossip 74i2, HTTP 74i3
# Data and logs go under $TOLLGATE_CLUSTER_DIR (default: a temp dir whose path is
# kept in /tmp/tollgate-cluster.dir). The admin token is "local-dev-token".
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${TOLLGATE_BIN:-./bin/tollgate}
state=/tmp/tollgate-cluster.dir
token=local-dev-token
zones=(zone-a zone-b zone-c)

start() {
  if [ -f "$state" ] && [ -d "$(cat "$state")" ]; then
    echo "a cluster seems to run already (data in $(cat "$state")); run: make cluster-stop" >&2
    exit 1
  fi
  [ -x "$bin" ] || go build -o "$bin" ./cmd/tollgate
  dir=${TOLLGATE_CLUSTER_DIR:-$(mktemp -d /tmp/tollgate-cluster.XXXXXX)}
  mkdir -p "$dir"
  echo "$dir" > "$state"
  for i in 1 2 3; do
    join=()
    [ "$i" -gt 1 ] && join=(--join 127.0.0.1:7412)
    "$bin" server --node-id "node-$i" --zone "${zones[$((i-1))]}" --data-dir "$dir/node-$i" \
      --grpc-addr "127.0.0.1:74${i}0" --raft-addr "127.0.0.1:74${i}1" --gossip-addr "127.0.0.1:74${i}2" \
      --http-addr "127.0.0.1:74${i}3" --bootstrap-expect 3 "${join[@]}" --admin-token "$token" \
      --default-max-series "${TOLLGATE_MAX_SERIES:-150000}" > "$dir/node-$i.log" 2>&1 &
    echo $! > "$dir/node-$i.pid"
  done
  for _ in $(seq 300); do
    n=0
    for i in 1 2 3; do grep -q "ready" "$dir/node-$i.log" 2>/dev/null && n=$((n+1)); done
    [ "$n" -eq 3 ] && break
    sleep 0.1
  done
  if [ "$n" -ne 3 ]; then
    echo "cluster did not become ready in 30s; logs in $dir" >&2
    exit 1
  fi
  cat <<MSG
Tollgate cluster running (3 nodes, zones a/b/c); data and logs in $dir
  node-1  grpc 127.0.0.1:7410  http http://127.0.0.1:7413
  node-2  grpc 127.0.0.1:7420  http http://127.0.0.1:7423
  node-3  grpc 127.0.0.1:7430  http http://127.0.0.1:7433

  export TOLLGATE_ADDR=127.0.0.1:7410,127.0.0.1:7420,127.0.0.1:7430 TOLLGATE_ADMIN_TOKEN=$token
  $bin status
  $bin bench --addr \$TOLLGATE_ADDR --new-fraction 1 --duration 10s
  kill -9 \$(cat $dir/node-2.pid)      # tracking goes on with two zones
  make cluster-stop
MSG
}

stop() {
  [ -f "$state" ] || { echo "no local cluster recorded"; return 0; }
  dir=$(cat "$state")
  for i in 1 2 3; do
    f="$dir/node-$i.pid"
    [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true
  done
  for i in 1 2 3; do
    f="$dir/node-$i.pid"
    [ -f "$f" ] || continue
    for _ in $(seq 100); do kill -0 "$(cat "$f")" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$(cat "$f")" 2>/dev/null || true
  done
  rm -f "$state"
  echo "stopped; data kept in $dir (rm -rf it when done)"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
