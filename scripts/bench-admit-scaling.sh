#!/usr/bin/env bash
# How whole-request admission scales from 1 to 2 CPUs (issue #11: at least
# 1.6x). Builds the router/admission benchmark binary once, then runs
# BenchmarkAdmitParallel ROUNDS times (default 9), each round at -cpu 1
# and right after at -cpu 2, so that both sides of a round see the same
# machine (on a shared VM the speed drifts between minutes). Prints each
# round, then per policy the median ns/op at 1 and 2 CPUs and the median
# of the rounds' ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-9}
BENCHTIME=${BENCHTIME:-1s}
bin=$(mktemp)
trap 'rm -f "$bin"' EXIT
go test -c -o "$bin" ./router/admission/
runs=""
for r in $(seq "$ROUNDS"); do
  for c in 1 2; do
    line=$("$bin" -test.run='^$' -test.bench='AdmitParallel' -test.benchmem -test.cpu "$c" -test.benchtime "$BENCHTIME" | grep '^BenchmarkAdmitParallel/')
    echo "$line"
    runs+=$(echo "$line" | awk -v r="$r" -v c="$c" '{n=$1; sub(/^BenchmarkAdmitParallel\//,"",n); sub(/-[0-9]+$/,"",n); print r, c, n, $3}')$'\n'
  done
done
echo "$runs" | awk '
  NF == 4 { v[$3, $2, $1] = $4; names[$3] = 1; rounds = ($1 > rounds ? $1 : rounds) }
  function med(a, m,   i, j, t) {
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
  }
  END {
    printf "\n%-12s %13s %13s %15s\n", "policy", "1 CPU ns/op", "2 CPUs ns/op", "scaling (median of rounds)"
    for (n in names) {
      delete one; delete two; delete ratio
      for (r = 1; r <= rounds; r++) { one[r] = v[n, 1, r]; two[r] = v[n, 2, r]; ratio[r] = v[n, 1, r] / v[n, 2, r] }
      printf "%-12s %13.0f %13.0f %14.2fx\n", n, med(one, rounds), med(two, rounds), med(ratio, rounds)
    }
  }'
