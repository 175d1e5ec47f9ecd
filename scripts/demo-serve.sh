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
PORT=${PORT:-18080}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# Each engine tokenizes with the test tokenizer and publishes its KV-cache
# events (ZeroMQ, vLLM's format) on port PORT+10+i.
tok=router/tokenizer/testdata
for i in 1 2 3; do
  "$BIN/router" mock-worker --listen "127.0.0.1:$((PORT + i))" --model mock --speedup 20 --engine-block-size 16 \
    --tokenizer "$tok/bytebpe.json" --tokenizer-config "$tok/chatml_config.json" \
    --kv-events-endpoint "tcp://127.0.0.1:$((PORT + 10 + i))" >"$work/mock$i.log" 2>&1 &
  pids+=($!)
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
  url = "http://127.0.0.1:$((PORT + i))"
  kv_events {
    endpoint = "tcp://127.0.0.1:$((PORT + 10 + i))"
  }
}
HCL
done
"$BIN/router" serve --policy "$work/policy.hcl" --listen "127.0.0.1:$PORT" --debug-listen "127.0.0.1:$((PORT + 9))" >"$work/router.log" 2>&1 &
pids+=($!)

for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
if ! curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null; then
  echo "router not ready after 10 s; /readyz says:"
  curl -s "http://127.0.0.1:$PORT/readyz" || echo "(no answer)"
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
      -d "$body" "http://127.0.0.1:$PORT/v1/chat/completions" | tr -d '\r' | awk -F': ' 'tolower($1)=="x-switchyard-worker"{print $2}' >>"$work/split" &
  done
  wait "${!}" 2>/dev/null || true
  sleep 0.2
done
wait_for=0
while [ "$(wc -l <"$work/split")" -lt 60 ] && [ $wait_for -lt 100 ]; do sleep 0.1; wait_for=$((wait_for + 1)); done

echo
echo "requests per worker:"
sort "$work/split" | uniq -c | awk '{printf "  %-4s %s\n", $2, $1}'
echo
echo "router metrics:"
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^switchyard_(requests_total|worker_ready|worker_capacity_blocks|worker_kv_events_total|prefix_belief_total|prompt_tokens_total|cached_prompt_tokens_total|time_to_first_token_seconds_count)' | sed 's/^/  /'
echo
echo "the router's view of worker a (/debug/workers on --debug-listen):"
if command -v python3 >/dev/null; then
  curl -s "http://127.0.0.1:$((PORT + 9))/debug/workers" |
    python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["workers"][0], indent=2))' | sed 's/^/  /'
else
  curl -s "http://127.0.0.1:$((PORT + 9))/debug/workers" | head -c 1500 | sed 's/^/  /'
fi
echo
