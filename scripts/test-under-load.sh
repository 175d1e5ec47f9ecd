#!/usr/bin/env bash
# Runs `make test` N times (default 3) while stress-ng saturates the CPUs
# (default: --cpu 4, twice the cores of the 2-core machines this project is
# built on), and stops at the first failure. Tests must assert behaviour,
# not speed: this is how that is checked (docs/status.md, issue #10 §3).
#
#   scripts/test-under-load.sh [RUNS] [STRESS_CPUS]
#
# Installs stress-ng from Debian when it is missing (needs root and apt).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
cpus=${2:-4}

if ! command -v stress-ng >/dev/null 2>&1; then
	apt-get update -qq
	apt-get install -y -qq stress-ng >/dev/null
fi

stress-ng --cpu "$cpus" --timeout 0 --quiet &
stress=$!
trap 'kill "$stress" 2>/dev/null; wait "$stress" 2>/dev/null || true' EXIT

for i in $(seq 1 "$runs"); do
	start=$(date +%s)
	if make test >"/tmp/test-under-load.$i.log" 2>&1; then
		echo "run $i/$runs: pass ($(($(date +%s) - start)) s, stress-ng --cpu $cpus)"
	else
		echo "run $i/$runs: FAIL ($(($(date +%s) - start)) s); the log is /tmp/test-under-load.$i.log:"
		grep -E '^(--- FAIL|FAIL|panic:)|_test.go:[0-9]+:' "/tmp/test-under-load.$i.log" | head -40
		exit 1
	fi
done
