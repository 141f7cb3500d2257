# Sourced (not run) by the scripts that measure one throwaway durable dev
# node (fsync on): cost-ratio.sh, open-loop-half.sh. Needs $dir, $bin, $grpc,
# $http and $raft. start_node starts a node on a fresh data dir ($dir/data)
# and waits until it is ready; stop_node stops it (SIGTERM) and waits. On
# exit the node is stopped and $dir removed.
# shellcheck shell=bash
pid=
trap '[ -n "$pid" ] && kill -TERM $pid 2>/dev/null && wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
start_node() {
  rm -rf "$dir/data"
  $bin server --dev --data-dir "$dir/data" --default-max-series 0 --log-level warn \
    --grpc-addr "$grpc" --http-addr "$http" --raft-addr "$raft" > "$dir/server.out" 2>&1 &
  pid=$!
  for _ in $(seq 300); do grep -q 'ready' "$dir/server.out" 2>/dev/null && break; sleep 0.1; done
  grep -q 'ready' "$dir/server.out" || { cat "$dir/server.out" >&2; exit 1; }
}
stop_node() { kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; pid=; }
