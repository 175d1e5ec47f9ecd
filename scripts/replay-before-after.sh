#!/usr/bin/env bash
# Times `router replay` of the bundled Mooncake conversation trace (12,031
# requests, the built-in default policy, 8 simulated workers) built at a
# git revision (default e4e6865, before issue #11) and at HEAD, on the same
# machine in the same run: the two builds run alternately, RUNS times each
# (default 3), and the script prints each run and the medians of
#   wall  the whole command (decompress and parse the trace, replay, print)
#   cpu   its user + system CPU time, which other load on a shared machine
#         disturbs less than wall time
#   loop  the report's wall_s (building the router and the replay loop)
# It also checks that both builds write the same --per-request bytes (the
# default policy's replay must not change).
#
#   scripts/replay-before-after.sh [REV] [RUNS]
#
# Only committed code is compared: both trees come from `git archive`.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-e4e6865}
runs=${2:-3}

work=$(mktemp -d /tmp/replay-before-after.XXXXXX)
trap 'rm -rf "$work"' EXIT

for side in before after; do
	commit=$rev
	if [ "$side" = after ]; then
		commit=HEAD
	fi
	mkdir -p "$work/$side/src"
	git archive "$commit" | tar -x -C "$work/$side/src"
	(cd "$work/$side/src" && go build -o "$work/$side/router" ./cmd/router)
	echo "$side: $(git rev-parse --short "$commit") $(git log -1 --format=%s "$commit" | cut -c1-70)"
done

# median prints the middle of its arguments, sorted as numbers.
median() { printf '%s\n' "$@" | sort -g | sed -n "$((($# + 1) / 2))p"; }

declare -A wall cpu loop
for i in $(seq 1 "$runs"); do
	for side in before after; do
		/usr/bin/time -o "$work/time" -f '%e %U %S' \
			"$work/$side/router" replay --per-request "$work/$side.$i.jsonl" --report "$work/$side.$i.json" >/dev/null
		read -r w u s <"$work/time"
		c=$(awk -v u="$u" -v s="$s" 'BEGIN { printf "%.2f", u + s }')
		l=$(sed -n 's/^ *"wall_s": \([0-9.]*\),*$/\1/p' "$work/$side.$i.json")
		wall[$side]+="$w "
		cpu[$side]+="$c "
		loop[$side]+="$l "
		printf 'run %d %-6s wall %s s  cpu %s s  loop %s s  load %s\n' "$i" "$side" "$w" "$c" "$l" "$(cut -d' ' -f1 /proc/loadavg)"
	done
done

for side in before after; do
	# shellcheck disable=SC2086 # the lists are space-separated numbers
	printf '%-6s median of %d: wall %s s, cpu %s s, loop %s s\n' "$side" "$runs" \
		"$(median ${wall[$side]})" "$(median ${cpu[$side]})" "$(median ${loop[$side]})"
done
if cmp -s "$work/before.1.jsonl" "$work/after.1.jsonl"; then
	echo "per-request output: identical ($(sha256sum <"$work/after.1.jsonl" | cut -c1-16))"
else
	echo "per-request output: DIFFERS between $rev and HEAD"
	exit 1
fi
