package plugincheck

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/shared"
)

// Latency is measured at these row counts, warmCalls calls each after the
// cold one.
var latencyRows = []int{8, 64}

const warmCalls = 200

// Under load, loadCallers callers make loadCalls calls each at once, of
// loadRows rows: as a router serving many requests calls a plugin, whose
// answers then wait on one another (a Python plugin's interpreter lock, a
// plugin's own worker pool).
const (
	loadCallers = 16
	loadCalls   = 25
	loadRows    = 64
)

// latencyStats are one row count's warm call times.
type latencyStats struct {
	rows          int
	p50, p99, max time.Duration
	// load: the times of calls made loadCallers at once.
	load bool
}

// statsOf sorts times and returns their percentiles.
func statsOf(rows int, load bool, times []time.Duration) latencyStats {
	slices.Sort(times)
	return latencyStats{rows: rows, load: load, p50: times[len(times)/2], p99: times[len(times)*99/100], max: times[len(times)-1]}
}

// checkLatency times decisions through the router's pipeline and client
// (decision) of an instance of t configured with params for this check:
// the first call after its Configure (cold), then warmCalls calls at each
// of latencyRows, one at a time, then loadCallers x loadCalls calls of
// loadRows rows, loadCallers at once (under load). It fails only when the
// router would not accept an answer; a time over callTimeout, or a
// declared p99 (DescribeResponse.expected_decide_p99_nanos, 0 for none)
// over it, is a warning saying what the router would do.
func checkLatency(ctx context.Context, t shared.TypeInfo, params shared.Params, role shared.Role, callTimeout, declared time.Duration) Result {
	name := fmt.Sprintf("latency %q", t.Name)
	comp, err := t.New(checkInfo(instanceName(t.Name)+"-latency", role), params)
	if err != nil {
		return fail(name, "an instance configured as for the decide checks", err.Error())
	}
	d, err := newDecision(t.Kind, t.Name, comp)
	if err != nil {
		return fail(name, "a component the router's pipeline can run", err.Error())
	}
	req := request(role)
	start := time.Now()
	if expected, got := d.decide(ctx, req, candidates(latencyRows[0], comp.Inputs())); expected != "" {
		return fail(name, expected, got)
	}
	cold := time.Since(start)
	var stats []latencyStats
	for _, n := range latencyRows {
		times := make([]time.Duration, warmCalls)
		for i := range times {
			// A filter compacts the rows in place, as routing does: each
			// call gets a set of its own, made before it is timed.
			c := candidates(n, comp.Inputs())
			start := time.Now()
			if expected, got := d.decide(ctx, req, c); expected != "" {
				return fail(name, expected+fmt.Sprintf(" (warm call %d of %d rows)", i+1, n), got)
			}
			times[i] = time.Since(start)
		}
		stats = append(stats, statsOf(n, false, times))
	}
	load, bad := underLoad(ctx, d, comp.Inputs(), req)
	if bad != nil {
		return fail(name, bad.Expected, bad.Got)
	}
	stats = append(stats, load)
	r := pass(name, latencyNote(cold, stats, declared))
	r.Warning = latencyWarning(cold, stats, callTimeout, declared)
	return r
}

// underLoad makes loadCallers x loadCalls decisions of loadRows rows,
// loadCallers at once, and returns their times' stats; a Result (not
// passed) for the first answer the router would not accept.
func underLoad(ctx context.Context, d *decision, in shared.Inputs, req *shared.Request) (latencyStats, *Result) {
	times := make([]time.Duration, loadCallers*loadCalls)
	bad := make([]*Result, loadCallers)
	var wg sync.WaitGroup
	for g := range loadCallers {
		wg.Go(func() {
			for i := range loadCalls {
				c := candidates(loadRows, in)
				start := time.Now()
				if expected, got := d.decide(ctx, req, c); expected != "" {
					bad[g] = &Result{Expected: expected + fmt.Sprintf(" (a call of %d rows, %d at once)", loadRows, loadCallers), Got: got}
					return
				}
				times[g*loadCalls+i] = time.Since(start)
			}
		})
	}
	wg.Wait()
	for _, b := range bad {
		if b != nil {
			return latencyStats{}, b
		}
	}
	return statsOf(loadRows, true, times), nil
}

// ms prints d in milliseconds.
func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }

// label names s in a note or warning: "rows=8", or "rows=64 x16 at once".
func (s latencyStats) label() string {
	if s.load {
		return fmt.Sprintf("rows=%d x%d at once", s.rows, loadCallers)
	}
	return fmt.Sprintf("rows=%d", s.rows)
}

func latencyNote(cold time.Duration, stats []latencyStats, declared time.Duration) string {
	parts := []string{"cold " + ms(cold)}
	for _, s := range stats {
		parts = append(parts, fmt.Sprintf("%s warm p50 %s p99 %s max %s", s.label(), ms(s.p50), ms(s.p99), ms(s.max)))
	}
	if declared > 0 {
		parts = append(parts, "declared p99 "+ms(declared))
	}
	return strings.Join(parts, "; ")
}

// latencyWarning says which times were over callTimeout, and whether the
// declared p99 is, and what the router does about it
// (docs/policy-file.md, "How a plugin is supervised"); "" when none was.
func latencyWarning(cold time.Duration, stats []latencyStats, callTimeout, declared time.Duration) string {
	var over []string
	worst := cold
	if cold > callTimeout {
		over = append(over, "cold "+ms(cold))
	}
	for _, s := range stats {
		worst = max(worst, s.max)
		if s.p99 > callTimeout {
			over = append(over, fmt.Sprintf("%s p99 %s", s.label(), ms(s.p99)))
		} else if s.max > callTimeout {
			over = append(over, fmt.Sprintf("%s max %s", s.label(), ms(s.max)))
		}
	}
	if declared > callTimeout {
		over = append(over, "the declared p99 (expected_decide_p99_nanos) "+ms(declared))
	}
	if len(over) == 0 {
		return ""
	}
	w := fmt.Sprintf("%s over call_timeout %v: the router answers each call over call_timeout by the policy's fallback, "+
		"and 5 failed calls in a row open the plugin's circuit breaker; it kills the plugin only when frozen "+
		"(5 health checks in a row unanswered within 2s) or stuck (no Decide answer for %v); "+
		"raise the plugin block's call_timeout above the p99 under load (docs/plugin-protocol.md, \"Deadlines by language\")",
		strings.Join(over, ", "), callTimeout, supervisor.DefaultStallTimeout)
	if worst >= supervisor.DefaultStallTimeout {
		w += fmt.Sprintf("; a call of %s would get it killed as stuck", ms(worst))
	}
	return w
}
