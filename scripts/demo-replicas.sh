#!/usr/bin/env bash
# make demo-replicas: three `router serve` replicas behind HAProxy
# (round-robin, deploy/haproxy/replicas.cfg) sharing over Debian's
# nats-server with JetStream, three mock engines, and a multi-turn
# conversation workload (bench/replicas): it prints the KV hit ratio of one
# router, of the replicas with sync (the cluster block) and without.
# Installs nats-server and haproxy from Debian when missing (needs root and
# apt). Everything runs on 127.0.0.1 and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nats-server >/dev/null 2>&1 || ! command -v haproxy >/dev/null 2>&1; then
	scripts/apt-install.sh nats-server haproxy
fi
PATH="$PATH:/usr/sbin"
make build >/dev/null
tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
nats-server -a 127.0.0.1 -p 14222 -js -sd "$tmp/nats" >"$tmp/nats.log" 2>&1 &
pids+=($!)
haproxy -f deploy/haproxy/replicas.cfg -db >"$tmp/haproxy.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
	if (echo >/dev/tcp/127.0.0.1/14222) 2>/dev/null; then break; fi
	sleep 0.1
done
go run ./bench/replicas --router-bin bin/router --nats nats://127.0.0.1:14222 \
	--ports 18081,18082,18083 --lb http://127.0.0.1:18080 "$@"
