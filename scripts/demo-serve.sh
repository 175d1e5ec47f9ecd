#!/usr/bin/env bash
# make demo-serve: three mock engines that tokenize and publish their
# KV-cache events, and `router serve` on loopback with a policy file whose
# workers give only a URL and an events endpoint; a short burst of chat
# requests (shared system prompt, a few conversations), then the
# per-worker split, the router's metrics (among them how its belief of each
# request's cached prefix compared with what the engine served) and its
# view of a worker. Everything it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
# Every server listens on port 0 and the script reads the address it bound
# from its own output (scripts/lib/procs.sh), so two runs at once never
# share a port and the figures below are this run's.
. scripts/lib/procs.sh
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# Each engine tokenizes with the test tokenizer and publishes its KV-cache
# events (ZeroMQ, vLLM's format) on a port of its own.
tok=router/tokenizer/testdata
mocks=() events=() mock_pids=()
for i in 1 2 3; do
  start_listening "mock-worker $i" "$work/mock$i.log" 'rank 0 KV events on (tcp://[^ ]+)' \
    "$BIN/router" mock-worker --listen 127.0.0.1:0 --model mock --speedup 20 --engine-block-size 16 \
    --tokenizer "$tok/bytebpe.json" --tokenizer-config "$tok/chatml_config.json" \
    --kv-events-endpoint tcp://127.0.0.1:0
  events+=("$started_addr")
  mocks+=("$(sed -nE 's|^mock-worker listening on (http://[^ ]+).*|\1|p' "$work/mock$i.log" | head -1)")
  mock_pids+=("$started_pid")
done
# Workers need only a URL (models and capacity come from the engines) and,
# to follow what the engines hold, their KV events endpoint.
cat >"$work/policy.hcl" <<HCL
router {
  block_size = 16
}

tokenizer "mock" {
  source = "file"
  path   = "$PWD/$tok/bytebpe.json"
  config = "$PWD/$tok/chatml_config.json"
}
HCL
for i in 1 2 3; do
  name=$(printf '%b' "\\x$(printf %x $((96 + i)))")
  cat >>"$work/policy.hcl" <<HCL

worker "$name" {
  url = "${mocks[i - 1]}"
  kv_events {
    endpoint = "${events[i - 1]}"
  }
}
HCL
done
start_listening "router serve" "$work/router.log" '^router serve listening on (http://[^ ]+)' \
  "$BIN/router" serve --policy "$work/policy.hcl" --listen 127.0.0.1:0 --debug-listen 127.0.0.1:0
router=$started_addr router_pid=$started_pid
debug=$(sed -nE 's|^router serve profiler on (http://[^/ ]+)/.*|\1|p' "$work/router.log" | head -1)
echo "router serve (pid $router_pid) on $router, engines on ${mocks[*]}"

for _ in $(seq 100); do
  curl -sf "$router/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
if ! curl -sf "$router/readyz" >/dev/null; then
  echo "router not ready after 10 s; /readyz says:"
  curl -s "$router/readyz" || echo "(no answer)"
  echo
  echo "router log:"
  cat "$work/router.log"
  exit 1
fi

system=$(printf 'You are a helpful assistant. %.0s' $(seq 40))
echo "sending 60 chat requests (10 conversations x 6 turns; the 10 turns of a round at once)..."
for turn in 1 2 3 4 5 6; do
  for conv in $(seq 10); do
    history=$(printf "turn %s of conversation %s. " $(for t in $(seq "$turn"); do echo "$t $conv"; done))
    body=$(printf '{"model":"mock","max_tokens":8,"messages":[{"role":"system","content":"%s"},{"role":"user","content":"%s"}]}' "$system" "$history")
    curl -s -o /dev/null -D - -H 'content-type: application/json' -H "x-session-id: conv-$conv" \
      -d "$body" "$router/v1/chat/completions" | tr -d '\r' | awk -F': ' 'tolower($1)=="x-switchyard-worker"{print $2}' >>"$work/split" &
  done
  wait "${!}" 2>/dev/null || true
  sleep 0.2
done
wait_for=0
while [ "$(wc -l <"$work/split")" -lt 60 ] && [ $wait_for -lt 100 ]; do sleep 0.1; wait_for=$((wait_for + 1)); done

alive_or_fail "router serve" "$router_pid"
alive_or_fail "mock-worker" "${mock_pids[@]}"
metrics=$(curl -s "$router/metrics")
served=$(echo "$metrics" | awk '/^switchyard_requests_total[{ ]/ { n += $NF } END { print n + 0 }')
if [ "$served" != 60 ]; then
  echo "the router (pid $router_pid, $router) counts $served requests, this run sent 60" >&2
  exit 1
fi
echo
echo "requests per worker:"
sort "$work/split" | uniq -c | awk '{printf "  %-4s %s\n", $2, $1}'
echo
echo "router metrics:"
# The requests above are not streamed: switchyard_time_to_first_token_seconds
# (router/live/metrics.go) counts streamed ones only, so the request duration
# histogram's count is the one with this run's requests (docs/serve.md, metrics).
echo "$metrics" | grep -E '^switchyard_(requests_total|worker_ready|worker_capacity_blocks|worker_kv_events_total|prefix_belief_total|prompt_tokens_total|cached_prompt_tokens_total|request_duration_seconds_count)' | sed 's/^/  /'
echo
echo "the router's view of worker a (/debug/workers on --debug-listen):"
if command -v python3 >/dev/null; then
  curl -s "$debug/debug/workers" |
    python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["workers"][0], indent=2))' | sed 's/^/  /'
else
  curl -s "$debug/debug/workers" | head -c 1500 | sed 's/^/  /'
fi
echo
