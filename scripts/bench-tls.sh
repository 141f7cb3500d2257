#!/usr/bin/env bash
# TLS vs plaintext on two three-node loopback clusters, same run: `tollgate bench`
# (1,000-hash requests, 16 in flight) alternates between the clusters, round
# after round, so machine load drifts hit both alike. The TLS cluster has TLS on
# every channel: gRPC with required client certificates, raft mutual TLS,
# encrypted gossip, HTTPS. Prints each run and the medians.
# Usage: scripts/bench-tls.sh [rounds] [duration] [concurrency]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
dur=${2:-5s}
conc=${3:-16}
bin=./bin/tollgate
go build -o "$bin" ./cmd/tollgate
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

$bin tls init --dir "$tmp/certs" --nodes n1,n2,n3 >/dev/null
c=$tmp/certs
waitready() { for _ in $(seq 600); do grep -q '^tollgate node .* ready$' "$1" 2>/dev/null && return 0; sleep 0.1; done; echo "not ready: $1" >&2; cat "$1" >&2; exit 1; }

cluster() { # name port-prefix extra-args-fn
  local name=$1 pre=$2 i
  for i in 1 2 3; do
    local join=() tls=()
    [ "$i" -gt 1 ] && join=(--join "127.0.0.1:${pre}12")
    [ "$name" = tls ] && tls=(--tls-cert "$c/n$i.pem" --tls-key "$c/n$i-key.pem" --tls-ca "$c/ca.pem"
      --tls-client-auth require --gossip-keyring-file "$c/gossip.key")
    $bin server --node-id "n$i" --zone "zone-$i" --data-dir "$tmp/$name-n$i" --default-max-series 0 --log-level warn \
      --grpc-addr "127.0.0.1:${pre}${i}0" --raft-addr "127.0.0.1:${pre}${i}1" --gossip-addr "127.0.0.1:${pre}${i}2" --http-addr - \
      --bootstrap-expect 3 --leader-balance-interval 2s "${join[@]}" "${tls[@]}" > "$tmp/$name-n$i.out" 2>&1 &
    pids+=($!)
  done
  for i in 1 2 3; do waitready "$tmp/$name-n$i.out"; done
}
cluster plain 175
cluster tls 176
addrs_plain=127.0.0.1:17510,127.0.0.1:17520,127.0.0.1:17530
addrs_tls=127.0.0.1:17610,127.0.0.1:17620,127.0.0.1:17630
tlsflags=(--cacert "$c/ca.pem" --cert "$c/client.pem" --key "$c/client-key.pem")
sleep 10 # leader balancing settles (checks every 2s)

bench() { # mode workload args...
  local mode=$1 work=$2; shift 2
  local addr=$addrs_plain flags=()
  [ "$mode" = tls ] && addr=$addrs_tls flags=("${tlsflags[@]}")
  $bin bench --addr "$addr" "${flags[@]}" --tenants 16 --request-size 1000 --concurrency "$conc" --json "$@" 2>/dev/null |
    jq -c --arg m "$mode" --arg w "$work" '{mode: $m, workload: $w, series_per_sec: (.series_per_sec|floor), p50_ms: .p50_ms, failed: .requests_failed}' |
    tee -a "$tmp/results.jsonl"
}
prefill() { # mode: 2M series (16 tenants × 125,000) for the refresh workload
  local addr=$addrs_plain flags=()
  [ "$1" = tls ] && addr=$addrs_tls flags=("${tlsflags[@]}")
  $bin bench --addr "$addr" "${flags[@]}" --tenants 16 --series-per-tenant 125000 --prefill --new-fraction 0 \
    --request-size 1000 --concurrency 4 --duration 1s --seed 7 >/dev/null 2>&1
}
prefill plain
prefill tls
for r in $(seq "$rounds"); do
  order="plain tls"
  [ $((r % 2)) -eq 0 ] && order="tls plain" # ABBA: drift in machine load cancels out
  for mode in $order; do
    bench "$mode" refresh --series-per-tenant 125000 --new-fraction 0 --seed 7 --duration "$dur"
    bench "$mode" new --series-per-tenant 100000000 --new-fraction 1 --seed "$((9 + r))" --duration "$dur"
  done
done
echo "== medians (series/s) =="
jq -s -r 'group_by(.workload)[] | . as $w |
  ([.[] | select(.mode=="plain") | .series_per_sec] | sort | .[length/2|floor]) as $p |
  ([.[] | select(.mode=="tls") | .series_per_sec] | sort | .[length/2|floor]) as $t |
  "\($w[0].workload): plaintext \($p)  tls \($t)  tls/plaintext \(($t/$p*1000|floor)/1000)"' "$tmp/results.jsonl"
