#!/usr/bin/env bash
# Measures what router replay's progress display costs (issue #15 §3): it
# generates a long trace (router trace generate, REQUESTS requests, default
# 100,000), then replays it on 16 workers REPS times (default 5) with
# --quiet (no progress hook at all: replay.Options.Progress is nil) and
# without (the hook every 1024 loop iterations, the printer's plain lines
# on a stderr that is a file), alternating the two, each first in every
# other pair, so that a change in the machine's load hits both alike. It prints each run's wall and CPU (user +
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
		>"$work/out" 2>"$work/$label.err" || {
		cat "$work/out" "$work/$label.err" >&2
		exit 1
	}
	read -r wall user sys <"$work/time"
	cpu=$(echo "$user + $sys" | bc)
	echo "$wall $cpu" >>"$work/$label"
	printf '%-8s wall %6.2f s  cpu %6.2f s\n' "$label" "$wall" "$cpu"
}
for ((i = 0; i < reps; i++)); do
	if ((i % 2 == 0)); then # each goes first in every other pair
		run quiet --quiet
		run progress
	else
		run progress
		run quiet --quiet
	fi
done
echo "progress lines on stderr in the last run with progress: $(grep -c '^router: replay: run' "$work/progress.err" || true)"

# stats FILE COLUMN prints the median, min and max of a column.
stats() { cut -d' ' -f"$2" "$1" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2), a[1], a[NR]}'; }
echo "trace: $requests generated requests on 16 workers, $reps runs each"
for col in 1 2; do
	read -r q qmin qmax < <(stats "$work/quiet" $col)
	read -r p pmin pmax < <(stats "$work/progress" $col)
	what=wall
	[ $col = 2 ] && what=cpu
	printf 'median %-4s --quiet %.2f s (%.2f-%.2f), with progress %.2f s (%.2f-%.2f): overhead %+.2f%%\n' \
		"$what" "$q" "$qmin" "$qmax" "$p" "$pmin" "$pmax" "$(echo "($p - $q) * 100 / $q" | bc -l)"
done
