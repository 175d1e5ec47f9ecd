#!/usr/bin/env bash
# Measures the peak resident memory of `router replay --per-request` on a
# long trace (issue #14 §3): the bundled Mooncake conversation trace
# (testdata/traces/mooncake_conversation_trace.jsonl, 12,031 requests)
# repeated REPS times (default 84: 1,010,604 requests), each repetition's
# timestamps shifted forward by the trace's span (3,536,999 ms) and its hash
# ids by the trace's largest id + 1, so that repetitions share no prefix
# block. It replays the first 100,000 requests and then the whole trace,
# each under /usr/bin/time -v, and prints their maximum resident set sizes
# and the growth per request between them.
#
#   scripts/replay-memory.sh [ROUTER] [REPS]
#
# ROUTER defaults to bin/router (make build). Extra router flags can be
# given in REPLAY_FLAGS, e.g. REPLAY_FLAGS='--prefill-workers 2 --decode-workers 4'.
set -euo pipefail
cd "$(dirname "$0")/.."
router=${1:-bin/router}
reps=${2:-84}
src=testdata/traces/mooncake_conversation_trace.jsonl

work=$(mktemp -d /tmp/replay-memory.XXXXXX)
trap 'rm -rf "$work"' EXIT

python3 - "$src" "$reps" "$work/long.jsonl" <<'PY'
import json, sys
src, reps, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
recs = [json.loads(l) for l in open(src) if l.strip()]
span = recs[-1]["timestamp"] - recs[0]["timestamp"]
idshift = max(i for r in recs for i in r["hash_ids"]) + 1
with open(dst, "w") as f:
    for k in range(reps):
        for r in recs:
            f.write(json.dumps({"timestamp": r["timestamp"] + k * span,
                                "input_length": r["input_length"],
                                "output_length": r["output_length"],
                                "hash_ids": [i + k * idshift for i in r["hash_ids"]]}) + "\n")
PY
total=$(wc -l <"$work/long.jsonl")
echo "trace: $total requests ($reps repetitions of $src)"

# rss N runs the replay of the first N requests (0: all) and prints its
# maximum resident set size in kB.
rss() {
	/usr/bin/time -v "$router" replay --trace "$work/long.jsonl" --limit "$1" \
		--per-request "$work/per-request.jsonl" ${REPLAY_FLAGS:-} >"$work/out" 2>"$work/time" || {
		cat "$work/out" "$work/time" >&2
		exit 1
	}
	sed -n 's/.*Maximum resident set size (kbytes): //p' "$work/time"
}
short=100000
a=$(rss "$short")
echo "first $short requests: max RSS $((a / 1024)) MiB"
b=$(rss 0)
echo "all $total requests: max RSS $((b / 1024)) MiB"
echo "growth: $(((b - a) * 1024 / (total - short))) bytes per request"
