package plugincheck

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/shared"
)

// Latency is measured at these row counts, warmCalls calls each after the
// cold one.
var latencyRows = []int{8, 64}

const warmCalls = 200

// latencyStats are one row count's warm call times.
type latencyStats struct {
	rows          int
	p50, p99, max time.Duration
}

// checkLatency times calls through the router's client to an instance of
// t configured with params for this check: the first call after its
// Configure (cold), then warmCalls calls at each of latencyRows, one at a
// time. It fails only when a call fails; a cold call or a warm p99 or
// maximum over callTimeout is a warning, saying what the router would do.
func checkLatency(ctx context.Context, t shared.TypeInfo, params shared.Params, role shared.Role, callTimeout time.Duration) Result {
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
		slices.Sort(times)
		stats = append(stats, latencyStats{rows: n, p50: times[len(times)/2], p99: times[len(times)*99/100], max: times[len(times)-1]})
	}
	r := pass(name, latencyNote(cold, stats))
	r.Warning = latencyWarning(cold, stats, callTimeout)
	return r
}

// ms prints d in milliseconds.
func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }

func latencyNote(cold time.Duration, stats []latencyStats) string {
	parts := []string{"cold " + ms(cold)}
	for _, s := range stats {
		parts = append(parts, fmt.Sprintf("rows=%d warm p50 %s p99 %s max %s", s.rows, ms(s.p50), ms(s.p99), ms(s.max)))
	}
	return strings.Join(parts, "; ")
}

// latencyWarning says which times were over callTimeout and what the
// router does about it (docs/policy-file.md, "How a plugin is
// supervised"); "" when none was.
func latencyWarning(cold time.Duration, stats []latencyStats, callTimeout time.Duration) string {
	var over []string
	worst := cold
	if cold > callTimeout {
		over = append(over, "cold "+ms(cold))
	}
	for _, s := range stats {
		worst = max(worst, s.max)
		if s.p99 > callTimeout {
			over = append(over, fmt.Sprintf("rows=%d p99 %s", s.rows, ms(s.p99)))
		} else if s.max > callTimeout {
			over = append(over, fmt.Sprintf("rows=%d max %s", s.rows, ms(s.max)))
		}
	}
	if len(over) == 0 {
		return ""
	}
	w := fmt.Sprintf("%s over call_timeout %v: the router answers each call over call_timeout by the policy's fallback, "+
		"and 5 failed calls in a row open the plugin's circuit breaker; it kills the plugin only when frozen "+
		"(5 health checks in a row unanswered within 2s) or stuck (no Decide answer for %v)",
		strings.Join(over, ", "), callTimeout, supervisor.DefaultStallTimeout)
	if worst >= supervisor.DefaultStallTimeout {
		w += fmt.Sprintf("; a call of %s would get it killed as stuck", ms(worst))
	}
	return w
}
