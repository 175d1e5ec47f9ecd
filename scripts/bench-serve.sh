#!/usr/bin/env bash
# make bench-serve: the loopback load generator of issue 6 (bench/serve).
# One run measures (a) direct to one mock worker, (f) the floor of a hop (a
# minimal HTTP/1.1 forwarder), (s) net/http's server with the floor's
# client and (t) the floor's server with net/http's Transport (which half
# of net/http a hop pays for), (b) a bare httputil.ReverseProxy
# round-robin, (x) the same bare proxy on fasthttp, server and client,
# (c) `router serve` round-robin and
# (d) `router serve` with the default KV policy, (g) the same with the
# template plugin as its shadow (shadow mode's cost), (e) `router serve` with an
# out-of-process scorer (the template plugin) under 64 clients against one
# client, with the plugin's Decide tasks per message; then, with one client,
# (a), (f) and (c) on POST /v1/responses and POST /v1/embeddings (issue 28;
# --apis chooses), the router's added latency on each against the floor;
# then prints PASS/MISS for the targets. The bench starts every process it measures; whatever it
# started is killed on exit, even if it is itself interrupted or killed.
# Ports: every process it starts listens on port 0 and the bench reads the
# bound address from that process's own "listening on http://ADDR" line
# (children.start in bench/serve), so runs at once never share a server.
# Extra arguments go to the bench (e.g. --concurrency 64 --duration 8s).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
GO=${GO:-go}
work=$(mktemp -d)
bench_pid=
cleanup() {
  if [ -n "$bench_pid" ]; then kill "$bench_pid" 2>/dev/null || true; fi
  if [ -f "$work/pids" ]; then
    while read -r p; do kill "$p" 2>/dev/null || true; done <"$work/pids"
  fi
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$GO" build -o "$BIN/router" ./cmd/router
"$GO" build -o "$BIN/plugin-example" ./cmd/plugin-example
"$GO" build -o "$work/bench-serve" ./bench/serve
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//'), $("$GO" env GOVERSION) $("$GO" env GOOS)/$("$GO" env GOARCH)"
echo "date:    $(date -u +%Y-%m-%dT%H:%M:%SZ); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$work/bench-serve" --router-bin "$BIN/router" --plugin-bin "$BIN/plugin-example" --pid-file "$work/pids" "$@" &
bench_pid=$!
set +e
wait "$bench_pid"
rc=$?
set -e
bench_pid=
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$rc"
