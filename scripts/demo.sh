#!/usr/bin/env bash
# Three-zone docker-compose demo: `scripts/demo.sh up | down | status`.
# up: builds the static binary and a FROM-scratch image, makes a development
# PKI (deployments/.build/certs: CA, node and client certificates, gossip key),
# starts three nodes in three zones with TLS on, waits until every node is
# ready, starts the load generator and prints where to look. down: removes containers, network, volumes and image.
set -euo pipefail
cd "$(dirname "$0")/.."
project=${TOLLGATE_DEMO_PROJECT:-tollgate-demo}
compose=(docker-compose -p "$project" -f deployments/docker-compose.yml)
token=${TOLLGATE_DEMO_TOKEN:-demo-token}
export TOLLGATE_DEMO_TOKEN=$token
# Scoped tokens (docs/access-control.md): the load generator tracks, the dashboard
# and curl read; only their SHA-256 goes into the nodes' credentials file.
loadgen_token=${TOLLGATE_DEMO_LOADGEN_TOKEN:-demo-loadgen-token}
read_token=${TOLLGATE_DEMO_READ_TOKEN:-demo-read-token}
export TOLLGATE_DEMO_LOADGEN_TOKEN=$loadgen_token
certs=deployments/.build/certs
bin=deployments/.build/tollgate
# Client side of TLS for the commands run from the host.
tls_env=(TOLLGATE_CACERT="$certs/ca.pem" TOLLGATE_CERT="$certs/client.pem" TOLLGATE_KEY="$certs/client-key.pem")

need() {
  command -v "$1" >/dev/null || { echo "demo: $1 is required ($2)" >&2; exit 1; }
}

up() {
  need docker "Docker Engine"
  need docker-compose "docker-compose v1"
  docker info >/dev/null 2>&1 || { echo "demo: no Docker engine answers (docker info failed)" >&2; exit 1; }
  mkdir -p deployments/.build
  echo "building the static binary (CGO_ENABLED=0)…"
  CGO_ENABLED=0 go build -buildvcs=auto -trimpath -o "$bin" ./cmd/tollgate
  if [ ! -f "$certs/ca.pem" ]; then
    echo "making development certificates in $certs…"
    # Every SAN a node is dialled by: its compose name, its fixed address
    # (advertised for gRPC and raft), and 127.0.0.1 for the published ports.
    "$bin" tls init --dir "$certs" --nodes node-1,node-2,node-3 \
      --hosts 172.29.74.11,172.29.74.12,172.29.74.13 >/dev/null
  else
    # Reissue the node certificates from the kept CA: certificates of
    # earlier builds lack the node URI SAN the raft port now requires.
    "$bin" tls node-cert --dir "$certs" --nodes node-1,node-2,node-3 \
      --hosts 172.29.74.11,172.29.74.12,172.29.74.13 >/dev/null
  fi
  sha() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
  {
    echo "# written by scripts/demo.sh: name, sha256 of the token, scopes"
    echo "loadgen sha256:$(sha "$loadgen_token") track"
    echo "dashboard sha256:$(sha "$read_token") read"
  } > "$certs/credentials"
  "${compose[@]}" build --quiet node-1
  "${compose[@]}" up -d node-1 node-2 node-3
  echo "waiting for three ready nodes (up to 120 s)…"
  deadline=$((SECONDS + 120))
  while :; do
    ready=0
    for i in 1 2 3; do
      env "${tls_env[@]}" "$bin" health --http-addr "127.0.0.1:758$i" >/dev/null 2>&1 && ready=$((ready + 1))
    done
    [ "$ready" -eq 3 ] && break
    for i in 1 2 3; do
      state=$(docker inspect -f '{{.State.Status}}' "${project}_node-${i}_1" 2>/dev/null || echo missing)
      if [ "$state" != running ]; then
        echo "demo: node-$i is $state; its log:" >&2
        "${compose[@]}" logs --tail 30 "node-$i" >&2 || true
        "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
        exit 1
      fi
    done
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "demo: only $ready of 3 nodes ready after 120 s; readiness of each:" >&2
      for i in 1 2 3; do echo "node-$i: $(env "${tls_env[@]}" "$bin" health --http-addr "127.0.0.1:758$i" 2>&1)" >&2; done
      exit 1
    fi
    sleep 1
  done
  "${compose[@]}" up -d loadgen rwsink gateway rwgen
  cat <<MSG

Tollgate demo is up: three nodes in zones a/b/c, load generator running.
TLS is on (gRPC with client certificates, raft mTLS, encrypted gossip, HTTPS);
the development CA is $certs/ca.pem (import it in a browser, or accept the warning).
  node-1 (zone-a)  https://127.0.0.1:7581   grpc 127.0.0.1:7510
  node-2 (zone-b)  https://127.0.0.1:7582   grpc 127.0.0.1:7520
  node-3 (zone-c)  https://127.0.0.1:7583   grpc 127.0.0.1:7530
  remote-write gateway  http://127.0.0.1:7590/api/v1/push (metrics on /metrics), its receiver http://127.0.0.1:7592/metrics

  docker exec ${project}_node-1_1 /tollgate status          # members, groups, leaders (TLS + token from the container's env)
  ${tls_env[*]} TOLLGATE_ADMIN_TOKEN=$token $bin status --addr 127.0.0.1:7510   # the same from this host
  curl -s --cacert $certs/ca.pem -H "Authorization: Bearer $read_token" https://127.0.0.1:7581/api/v1/status | jq .   # as JSON (read token)
  dashboard token (read scope): $read_token
  docker-compose -p $project -f deployments/docker-compose.yml logs -f loadgen
  docker kill ${project}_node-2_1                            # lose a zone: writes go on
  make demo-down                                             # remove everything

A guided tour is in deployments/README.md.
MSG
}

down() {
  need docker-compose "docker-compose v1"
  "${compose[@]}" down -v --remove-orphans --rmi all
  rm -rf deployments/.build
}

status() {
  "${compose[@]}" ps
  docker exec "${project}_node-1_1" /tollgate status
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
