#!/usr/bin/env bash
# make demo-serve: three mock engines and `router serve` on loopback, a short
# burst of chat requests (shared system prompt, a few conversations), then
# the per-worker split and the router's metrics. Everything it starts is
# stopped on exit.
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

for i in 1 2 3; do
  "$BIN/router" mock-worker --listen "127.0.0.1:$((PORT + i))" --model mock --speedup 20 --block-size 16 >"$work/mock$i.log" 2>&1 &
  pids+=($!)
done
cat >"$work/policy.hcl" <<HCL
router {
  block_size = 16
}

worker "a" {
  url             = "http://127.0.0.1:$((PORT + 1))"
  models          = ["mock"]
  total_kv_blocks = 27500
}
worker "b" {
  url             = "http://127.0.0.1:$((PORT + 2))"
  models          = ["mock"]
  total_kv_blocks = 27500
}
worker "c" {
  url             = "http://127.0.0.1:$((PORT + 3))"
  models          = ["mock"]
  total_kv_blocks = 27500
}
HCL
"$BIN/router" serve --policy "$work/policy.hcl" --listen "127.0.0.1:$PORT" >"$work/router.log" 2>&1 &
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
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^switchyard_(requests_total|worker_active_requests|worker_ready|queue_depth|time_to_first_token_seconds_count|request_duration_seconds_count)' | sed 's/^/  /'
