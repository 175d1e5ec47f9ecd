#!/usr/bin/env bash
# Measures what router replay's progress display costs (issue #15 §3): it
# generates a long trace (router trace generate, REQUESTS requests, default
# 100,000), then replays it on 16 workers REPS times (default 5) with
# --quiet (no progress hook at all: replay.Options.Progress is nil) and
# without (the hook every 1024 loop iterations, the printer's plain lines
# on a stderr that is a file), alternating the two so that a change in the
# machine's load hits both alike. It prints each run's wall and CPU (user +
# sys) seconds, the medians, and the overhead of the display in percent of
# the --quiet medians.
#
#   scripts/replay-progress-cost.sh [ROUTER] [REPS] [REQUESTS]
#
# ROUTER defaults to bin/router (make build).
set -euo pipefail
cd "$(dirname "$0")/.."
router=${1:-bin/router}
reps=${2:-5}
requests=${3:-100000}

work=$(mktemp -d /tmp/replay-progress-cost.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$router" trace generate --requests "$requests" --out "$work/trace.jsonl" 2>/dev/null

# run LABEL FLAGS... replays the trace once and appends "wall cpu" (seconds)
# to $work/LABEL.
run() {
	local label=$1
	shift
	/usr/bin/time -f '%e %U %S' -o "$work/time" "$router" replay --trace "$work/trace.jsonl" --workers 16 "$@" \
		>"$work/out" 2>"$work/err" || {
		cat "$work/out" "$work/err" >&2
		exit 1
	}
	read -r wall user sys <"$work/time"
	cpu=$(echo "$user + $sys" | bc)
	echo "$wall $cpu" >>"$work/$label"
	printf '%-8s wall %6.2f s  cpu %6.2f s\n' "$label" "$wall" "$cpu"
}
for ((i = 0; i < reps; i++)); do
	run quiet --quiet
	run progress
done
echo "progress lines on stderr in the last run: $(grep -c '^router: replay: run' "$work/err" || true)"

# median FILE COLUMN
median() { cut -d' ' -f"$2" "$1" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
qw=$(median "$work/quiet" 1) pw=$(median "$work/progress" 1)
qc=$(median "$work/quiet" 2) pc=$(median "$work/progress" 2)
echo "trace: $requests generated requests on 16 workers, $reps runs each"
printf 'median wall: --quiet %.2f s, with progress %.2f s: overhead %+.2f%%\n' "$qw" "$pw" "$(echo "($pw - $qw) * 100 / $qw" | bc -l)"
printf 'median cpu:  --quiet %.2f s, with progress %.2f s: overhead %+.2f%%\n' "$qc" "$pc" "$(echo "($pc - $qc) * 100 / $qc" | bc -l)"
