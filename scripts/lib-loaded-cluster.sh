# Sourced (not run) by the scripts that measure a throwaway local cluster
# under `tollgate bench` load: raise-under-load.sh, grow-nodes.sh,
# rolling-restart.sh. Needs $dir (TOLLGATE_CLUSTER_DIR) and $bin. On exit it
# stops the load (bench_pid, set by the caller once bench runs) and the
# cluster, and removes $dir unless KEEP=1. Then it starts the cluster
# (scripts/cluster.sh) and exports its admin token.
# shellcheck shell=bash
bench_pid=
cleanup() {
  [ -n "$bench_pid" ] && kill "$bench_pid" 2>/dev/null || true
  ./scripts/cluster.sh stop >/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "data and logs kept in $dir" >&2; else rm -rf "$dir"; fi
}
trap cleanup EXIT

./scripts/cluster.sh start >/dev/null
export TOLLGATE_ADMIN_TOKEN
TOLLGATE_ADMIN_TOKEN=$(cat "$dir/admin-token")

now() { date +%s.%N; }
