package report

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// CanaryReport is how a replay's canaries split the requests
// (policy.Policy.Canary: the policy file's canary blocks, or
// `router replay --canary`): each side's figures, and the rollbacks
// that fired, in simulated time. A request's side is its first hop's
// whose role's policy has a canary.
type CanaryReport struct {
	// Canaries describes each routed role's canary, by role.
	Canaries map[string]CanaryConfig `json:"canaries"`
	// Live and Candidate are the requests each side decided.
	Live      CanarySide `json:"live"`
	Candidate CanarySide `json:"candidate"`
	// Rollbacks are the canaries that rolled back, in the order they
	// did (one per role and router replica at most); empty when no
	// rollback would have fired.
	Rollbacks []CanaryRollback `json:"rollbacks"`
}

// CanaryConfig is one role's canary as the replay ran it.
type CanaryConfig struct {
	Policy    string  `json:"policy"`
	Candidate string  `json:"candidate"`
	Weight    float64 `json:"weight"`
	Key       string  `json:"key"`
	// MaxFallbackShare, MaxTTFTP90Ms, WindowS and MinRequests are its
	// rollback thresholds.
	MaxFallbackShare float64 `json:"max_fallback_share"`
	MaxTTFTP90Ms     float64 `json:"max_ttft_p90_ms"`
	WindowS          float64 `json:"window_s"`
	MinRequests      int     `json:"min_requests"`
}

// CanarySide are the figures of one side of a canary.
type CanarySide struct {
	// Requests is how many requests the side decided; Completed and
	// Rejected split them; Fallbacks counts those a fallback decided.
	Requests  int     `json:"requests"`
	Completed int     `json:"completed"`
	Rejected  int     `json:"rejected"`
	Fallbacks int     `json:"fallbacks"`
	TTFT      Summary `json:"ttft_ms"`
	E2E       Summary `json:"e2e_ms"`
}

// CanaryRollback is one canary rolling back during a replay.
type CanaryRollback struct {
	Role      string `json:"role"`
	Candidate string `json:"candidate"`
	// Reason is "fallback_share" or "ttft_p90".
	Reason string `json:"reason"`
	// AtS is the simulated time of the rollback, in seconds from the
	// replay's start.
	AtS float64 `json:"at_s"`
	// CandidateDecisions is the candidate's decisions up to it.
	CandidateDecisions int64 `json:"candidate_decisions"`
	// WindowDecisions, WindowFallbacks, WindowTTFTs and WindowTTFTP90Ms
	// are the window it was judged over.
	WindowDecisions int64   `json:"window_decisions"`
	WindowFallbacks int64   `json:"window_fallbacks"`
	WindowTTFTs     int64   `json:"window_ttfts"`
	WindowTTFTP90Ms float64 `json:"window_ttft_p90_ms"`
}

// WriteCanary writes r's canary figures, one line per side and one for
// the rollback verdict, when the replay ran a canary:
//
//	router: conv: canary "trial" for "live" (aggregated, weight 10.0%, key session)
//	router: conv: canary live: 900 requests, TTFT p50/p90 120.5/300.2 ms, E2E p50/p90 ..., fallbacks 0.0%
//	router: conv: canary candidate: 100 requests, ...
//	router: conv: canary rollback would not fire (fallback share > 5.0% or TTFT p90 > 2000 ms over 60 s)
//
// A side's latencies without a value (no request of it completed: null
// in the JSON report) read "n/a (none completed)", not 0 ms.
func WriteCanary(w io.Writer, r *Report) error {
	c := r.Canary
	if c == nil {
		return nil
	}
	label := r.Label()
	var b strings.Builder
	for _, role := range slices.Sorted(maps.Keys(c.Canaries)) {
		cf := c.Canaries[role]
		fmt.Fprintf(&b, "router: %s: canary %q for %q (%s, weight %.1f%%, key %s)\n", label, cf.Candidate, cf.Policy, role, 100*cf.Weight, cf.Key)
	}
	side := func(name string, s CanarySide) {
		fmt.Fprintf(&b, "router: %s: canary %s: %d requests (%d rejected), TTFT p50/p90 %s, E2E p50/p90 %s, fallbacks %s\n",
			label, name, s.Requests, s.Rejected, p50p90(s.TTFT), p50p90(s.E2E), share(int64(s.Fallbacks), int64(s.Requests)))
	}
	side("live", c.Live)
	side("candidate", c.Candidate)
	if len(c.Rollbacks) == 0 {
		fmt.Fprintf(&b, "router: %s: canary rollback would not fire\n", label)
	}
	for _, rb := range c.Rollbacks {
		fmt.Fprintf(&b, "router: %s: canary %q (%s) would roll back at %.3f s on %s: %d of %d decisions fell back, TTFT p90 %.1f ms over %d first tokens, after %d candidate decisions\n",
			label, rb.Candidate, rb.Role, rb.AtS, rb.Reason, rb.WindowFallbacks, rb.WindowDecisions, rb.WindowTTFTP90Ms, rb.WindowTTFTs, rb.CandidateDecisions)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// p50p90 is "P50/P90 ms" of s, one decimal, or "n/a (none completed)"
// for a Summary without values (Summary.MarshalJSON's null).
func p50p90(s Summary) string {
	if s == (Summary{}) {
		return "n/a (none completed)"
	}
	return fmt.Sprintf("%.1f/%.1f ms", s.P50, s.P90)
}
