#!/usr/bin/env bash
# with-cpu-hog.sh N CMD...: runs CMD beside N spinning processes (a busy
# shell loop each), so that tests meet a busy host as production does: on
# 2 cores, N=6 holds the load average near 8. The spinners are killed by
# their own pids when CMD ends (or this script is interrupted). The exit
# status is CMD's.
set -uo pipefail
n=$1
shift
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait "${pids[@]}" 2>/dev/null
}
trap cleanup EXIT INT TERM
for ((i = 0; i < n; i++)); do
  sh -c 'while :; do :; done' &
  pids+=($!)
done
echo "with-cpu-hog: $n spinning processes (pids ${pids[*]}), load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$@"
rc=$?
echo "with-cpu-hog: done, load average $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$rc"
