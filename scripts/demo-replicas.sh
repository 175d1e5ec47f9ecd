#!/usr/bin/env bash
# make demo-replicas: three `router serve` replicas behind HAProxy
# (round-robin, deploy/haproxy/replicas.cfg) sharing over Debian's
# nats-server with JetStream, three mock engines, and a multi-turn
# conversation workload (bench/replicas): it prints the KV hit ratio of one
# router, of the replicas with sync (the cluster block) and without.
# Installs nats-server and haproxy from Debian when missing (as root or
# through sudo: scripts/apt-install.sh). Everything runs on 127.0.0.1 and is
# stopped on exit.
#
# Ports: nats-server takes a free port (-p -1) and the script reads it from
# its log; HAProxy and the replicas get ports from free_port
# (scripts/lib/procs.sh), written into a copy of HAProxy's configuration, and
# the script checks that the process listening on the load balancer's port is
# the HAProxy it started. A port taken meanwhile fails naming it and its
# owner. bench/replicas starts the engines on ports of their own.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/procs.sh
scripts/apt-install.sh nats-server haproxy
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
start_listening nats-server "$tmp/nats.log" 'Listening for client connections on ([0-9.]+:[0-9]+)' \
	nats-server -a 127.0.0.1 -p -1 -js -sd "$tmp/nats"
nats=nats://$started_addr

lb=$(free_port)
ports=()
for _ in 1 2 3; do
	p=$(free_port)
	while [ "$p" = "$lb" ] || [[ " ${ports[*]} " == *" $p "* ]]; do p=$(free_port); done
	ports+=("$p")
done
sed -e "s/127.0.0.1:18080/127.0.0.1:$lb/" -e "s/127.0.0.1:18081/127.0.0.1:${ports[0]}/" \
	-e "s/127.0.0.1:18082/127.0.0.1:${ports[1]}/" -e "s/127.0.0.1:18083/127.0.0.1:${ports[2]}/" \
	deploy/haproxy/replicas.cfg >"$tmp/haproxy.cfg"
haproxy -f "$tmp/haproxy.cfg" -db >"$tmp/haproxy.log" 2>&1 &
haproxy_pid=$!
pids+=("$haproxy_pid")
for _ in $(seq 100); do
	port_in_use "$lb" && break
	kill -0 "$haproxy_pid" 2>/dev/null || break
	sleep 0.1
done
owner=$(port_owner "$lb")
if ! kill -0 "$haproxy_pid" 2>/dev/null || [[ $owner != *"(pid $haproxy_pid)" ]]; then
	echo "HAProxy (pid $haproxy_pid) does not hold the load balancer's port 127.0.0.1:$lb; it is held by $owner. HAProxy's log:" >&2
	sed 's/^/  /' "$tmp/haproxy.log" >&2
	exit 1
fi
echo "nats-server on $nats, HAProxy (pid $haproxy_pid) on 127.0.0.1:$lb, replicas on ${ports[*]}"
go run ./bench/replicas --router-bin bin/router --nats "$nats" \
	--ports "$(IFS=,; echo "${ports[*]}")" --lb "http://127.0.0.1:$lb" "$@"
alive_or_fail nats-server "${pids[0]}"
alive_or_fail HAProxy "$haproxy_pid"
