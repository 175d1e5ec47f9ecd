package report

import (
	"fmt"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/router/config"
)

// SLO is a latency target per request for goodput (Report.Goodput): a
// request meets it when it completed and each set target holds. A zero
// field sets no target. The targets are vLLM's benchmark's goodput
// targets (benchmarks/benchmark_serving.py, --goodput ttft:MS tpot:MS
// e2el:MS), in the same per-request sense.
type SLO struct {
	// TTFT bounds time to first token.
	TTFT time.Duration
	// TPOT bounds time per output token after the first: (E2E − TTFT) /
	// (output_length − 1). A request of one output token has no TPOT and
	// always meets this target.
	TPOT time.Duration
	// E2E bounds arrival to last token.
	E2E time.Duration
}

// IsZero reports whether s sets no target.
func (s SLO) IsZero() bool { return s == SLO{} }

// String is s as ParseSLO reads it ("ttft=500ms,tpot=50ms"), or "" when
// s sets no target.
func (s SLO) String() string {
	var parts []string
	for _, t := range s.targets() {
		parts = append(parts, t.name+"="+t.d.String())
	}
	return strings.Join(parts, ",")
}

type sloTarget struct {
	name string
	d    time.Duration
}

// targets lists the set targets in ParseSLO's order.
func (s SLO) targets() []sloTarget {
	var ts []sloTarget
	for _, t := range []sloTarget{{"ttft", s.TTFT}, {"tpot", s.TPOT}, {"e2e", s.E2E}} {
		if t.d > 0 {
			ts = append(ts, t)
		}
	}
	return ts
}

// ParseSLO reads a comma-separated list of targets NAME=DURATION, NAME one
// of ttft, tpot and e2e, DURATION a Go duration > 0 such as 500ms or 2s
// (ttft and tpot at most config.MaxSLOTarget, one hour):
// "ttft=500ms,tpot=50ms". Each name at most once. Errors name the bad
// entry and what is wanted.
func ParseSLO(v string) (SLO, error) {
	var s SLO
	if strings.TrimSpace(v) == "" {
		return s, fmt.Errorf("slo %q: want targets such as ttft=500ms,tpot=50ms (names ttft, tpot, e2e)", v)
	}
	seen := map[string]bool{}
	for _, entry := range strings.Split(v, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(entry), "=")
		name = strings.ToLower(strings.TrimSpace(name))
		if !ok {
			return s, fmt.Errorf("slo entry %q: want NAME=DURATION such as ttft=500ms", entry)
		}
		var field *time.Duration
		switch name {
		case "ttft":
			field = &s.TTFT
		case "tpot":
			field = &s.TPOT
		case "e2e":
			field = &s.E2E
		default:
			return s, fmt.Errorf("slo entry %q: unknown target %q; want ttft, tpot or e2e", entry, name)
		}
		if seen[name] {
			return s, fmt.Errorf("slo entry %q: %s given twice", entry, name)
		}
		seen[name] = true
		d, err := time.ParseDuration(strings.TrimSpace(val))
		if err != nil || d <= 0 {
			return s, fmt.Errorf("slo entry %q: want a duration > 0 such as 500ms or 2s", entry)
		}
		if name != "e2e" && d > config.MaxSLOTarget {
			// Replay also gives ttft and tpot to every request as its
			// targets, bounded as a header's or a queue class's are.
			return s, fmt.Errorf("slo entry %q: %s is at most %v, as a request's target from a header or a queue class", entry, name, config.MaxSLOTarget)
		}
		*field = d
	}
	return s, nil
}

// Met reports whether a completed request with these latencies (ms, as
// Millis rounds them) and output length (tokens) meets s: TPOT is over
// the tokens after the first.
func (s SLO) Met(ttftMs, e2eMs float64, output int) bool {
	if s.TTFT > 0 && ttftMs > Millis(s.TTFT) {
		return false
	}
	if s.E2E > 0 && e2eMs > Millis(s.E2E) {
		return false
	}
	if s.TPOT > 0 && output > 1 && (e2eMs-ttftMs)/float64(output-1) > Millis(s.TPOT) {
		return false
	}
	return true
}

// Goodput is how many requests of a replay met its SLO.
type Goodput struct {
	// SLO is the targets, as ParseSLO reads them.
	SLO string `json:"slo"`
	// Met counts the requests that completed and met every target.
	Met int `json:"met"`
	// Share is Met over all requests replayed, rejected ones included
	// (they meet no target), rounded to 4 decimals.
	Share float64 `json:"share"`
	// PerS is Met per second of simulated time (Report.SimDurationS),
	// vLLM's "request goodput"; 0 when no simulated time passed.
	PerS float64 `json:"per_s"`
}
