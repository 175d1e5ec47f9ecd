#!/usr/bin/env bash
# Replays the bundled Mooncake conversation trace (12,031 requests) through
# plugin policies RUNS times (default 3) while stress-ng saturates the CPUs
# (default: --cpu 4, twice the cores of the 2-core machines this project is
# built on), and checks that every run's --per-request file is
# byte-identical and that no decision fell back (--fail-on-fallback): a
# replay's plugin calls wait for their answer and are charged a fixed
# simulated latency (replay_decision_latency), so machine load must change
# nothing (docs/replay.md, "Plugins in replay"; issue #11 §5).
#
#   scripts/replay-repeat-under-load.sh [RUNS] [STRESS_CPUS]
#
# The policies: examples/policies/plugin-example.hcl (queue-depth scorer out
# of process, 8 aggregated workers) and examples/policies/disagg.hcl (both
# roles in one plugin, 4 prefill + 4 decode workers: two plugin calls per
# request). Installs stress-ng from Debian when it is missing (needs root
# and apt) and removes it again at the end (an installed stress-ng breaks a
# hook of this machine).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
cpus=${2:-4}

work=$(mktemp -d /tmp/replay-repeat.XXXXXX)
stress=
cleanup() {
	if [ -n "$stress" ]; then
		kill "$stress" 2>/dev/null || true
		wait "$stress" 2>/dev/null || true
	fi
	if dpkg -s stress-ng >/dev/null 2>&1; then
		apt-get remove -y -qq stress-ng >/dev/null 2>&1 || echo "warning: could not remove stress-ng" >&2
	fi
	rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/" ./cmd/router ./cmd/plugin-example ./examples/disagg-filter-score-pick
sed "s|\"bin/plugin-example\"|\"$work/plugin-example\"|" examples/policies/plugin-example.hcl >"$work/plugin-example.hcl"
sed "s|\"bin/disagg-filter-score-pick\"|\"$work/disagg-filter-score-pick\"|" examples/policies/disagg.hcl >"$work/disagg.hcl"

if ! command -v stress-ng >/dev/null 2>&1; then
	apt-get update -qq
	apt-get install -y -qq stress-ng >/dev/null
fi
stress-ng --cpu "$cpus" --timeout 0 --quiet &
stress=$!
sleep 2 # let the hog take the CPUs
echo "stress-ng --cpu $cpus running; load average: $(cut -d' ' -f1-3 /proc/loadavg)"

status=0
for policy in plugin-example disagg; do
	flags=(--workers 8)
	if [ "$policy" = disagg ]; then
		flags=(--prefill-workers 4 --decode-workers 4)
	fi
	sums=()
	for i in $(seq 1 "$runs"); do
		start=$(date +%s%N)
		if ! "$work/router" replay --policy "$work/$policy.hcl" "${flags[@]}" --fail-on-fallback \
			--per-request "$work/$policy.$i.jsonl" --report "$work/$policy.$i.json" >"$work/$policy.$i.out" 2>&1; then
			echo "$policy run $i: FAIL"
			cat "$work/$policy.$i.out"
			status=1
			continue
		fi
		sum=$(sha256sum "$work/$policy.$i.jsonl" | cut -d' ' -f1)
		sums+=("$sum")
		fallbacks=$(grep -m1 '"fallbacks"' "$work/$policy.$i.json" | tr -dc '0-9')
		decision=$(grep -c '"decision_ms"' "$work/$policy.$i.jsonl" || true)
		ms=$((($(date +%s%N) - start) / 1000000))
		printf '%s run %d: per-request sha256 %s, %d lines charged decision_ms, fallbacks %s, %d.%03d s wall, load %s\n' \
			"$policy" "$i" "$sum" "$decision" "$fallbacks" $((ms / 1000)) $((ms % 1000)) "$(cut -d' ' -f1 /proc/loadavg)"
	done
	if [ "${#sums[@]}" -eq "$runs" ] && [ "$(printf '%s\n' "${sums[@]}" | sort -u | wc -l)" -eq 1 ]; then
		echo "$policy: $runs replays byte-identical"
	else
		echo "$policy: replays DIFFER"
		status=1
	fi
done
exit $status
