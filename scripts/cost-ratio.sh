#!/usr/bin/env bash
# Server CPU per series end to end against the in-process admission path, in
# the same run, interleaved: each round runs the admission benchmark
# (BenchmarkLeaderPath: session, lookup, Decide, reservation, encoding and an
# FSM apply; no gRPC, raft or fsync) and then `tollgate bench --metrics-url`
# against one durable dev node (a fresh data dir each round), for new series
# and for refreshes, and prints
# end-to-end ns of server CPU per series ÷ in-process ns per series, and
# the in-process path ÷ the series map's own miss + insert of the same
# hashes (BenchmarkLeaderPath/map-floor), and beside them the floor of
# "replicated and durable": raw hashicorp/raft on the same log, one 8 KB
# entry per request (raftnode BenchmarkRaftFloor/nodes=1).
# Both sides are process CPU per series (the in-process benchmarks report
# cpu-ns/series from getrusage, collector included, as the node's
# process_cpu_seconds_total is), and both new-series runs insert the same
# number of series into empty tables. Compare rounds, not runs on different
# days: these machines change speed over minutes.
# Usage: scripts/cost-ratio.sh [rounds] [duration]   (default 3 rounds of 5s)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
dur=${2:-5s}
command -v jq >/dev/null || { echo "cost-ratio.sh needs jq" >&2; exit 1; }
dir=$(mktemp -d)
bin=$dir/tollgate
go build -o "$bin" ./cmd/tollgate
go test -c -o "$dir/admission.test" ./admission/
go test -c -o "$dir/raftnode.test" ./raftnode/
grpc=127.0.0.1:17320 http=127.0.0.1:17390 raft=127.0.0.1:17321
. scripts/lib-dev-node.sh
bench() { $bin bench --addr $grpc --metrics-url $http --tenants 16 --request-size 1000 --concurrency 8 \
  --duration "$dur" --json "$@" 2>/dev/null; }
# cpuns NAME prints BenchmarkLeaderPath/NAME's process CPU per series (a NAME
# with a slash: BenchmarkNAME's).
cpuns() { awk -v n="$([[ $1 == */* ]] || echo LeaderPath/)$1-" 'index($1, n) { for (i = 2; i <= NF; i++) if ($i == "cpu-ns/series") print $(i-1) }'; }
echo "$(date -u +%FT%TZ)  $(nproc) cores  load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-5s %9s %12s %12s %7s   %12s %12s %7s   %10s %9s   %10s\n' round "series" "new e2e ns" "in-proc ns" ratio "refresh e2e" "in-proc ns" ratio "map ns" "in÷map" "raft ns"
for r in $(seq "$rounds"); do
  start_node
  jn=$(bench --new-fraction 1 --series-per-tenant 100000000 --seed $((100 + r)))
  en=$(jq -r '.cost.ns_per_series' <<<"$jn")
  created=$(jq -r '.new_accepted' <<<"$jn")
  er=$(bench --new-fraction 0 --series-per-tenant 125000 --prefill --seed 7 | jq -r '.cost.ns_per_series')
  stop_node
  [[ $created =~ ^[0-9]+$ ]] && ((created >= 1000)) || { echo "round $r: the new-series run created no series ($created)" >&2; exit 1; }
  # new and map-floor insert as many series as the end-to-end run created
  # (1,000 per request), so all three average over tables growing from empty
  # to the same size: a lookup's and an insert's cost grows with the table.
  reqs=$((created / 1000))
  adm=$("$dir/admission.test" -test.run '^$' -test.bench 'BenchmarkLeaderPath/(new|map-floor)' -test.benchtime ${reqs}x
    "$dir/admission.test" -test.run '^$' -test.bench 'BenchmarkLeaderPath/refresh' -test.benchtime 2s)
  # The floor of replicated and durable: raw raft on the same log, one
  # 8 KB entry per request (BenchmarkRaftFloor, nodes=1).
  rf=$("$dir/raftnode.test" -test.run '^$' -test.bench 'BenchmarkRaftFloor/nodes=1' -test.benchtime ${reqs}x 2>/dev/null |
    cpuns RaftFloor/nodes=1)
  an=$(cpuns new <<<"$adm")
  ar=$(cpuns refresh <<<"$adm")
  am=$(cpuns map-floor <<<"$adm")
  for v in "$an" "$ar" "$am" "$en" "$er" "$rf"; do
    [[ $v =~ ^[0-9.e+]+$ ]] || { echo "round $r: no figure (admission: $an $ar, bench: $en $er)" >&2; exit 1; }
  done
  awk -v r="$r" -v n="$created" -v en="$en" -v an="$an" -v er="$er" -v ar="$ar" -v am="$am" -v rf="$rf" \
    'BEGIN { printf "%-5s %9d %12.0f %12.0f %7.2f   %12.0f %12.0f %7.2f   %10.0f %9.2f   %10.0f\n", r, n, en, an, en/an, er, ar, er/ar, am, an/am, rf }'
done
echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"
