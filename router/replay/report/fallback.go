package report

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// FallbackSource is one cause of a replay's fallbacks: a plugin whose
// calls failed (an answer that does not fit its task, such as a
// non-finite cost or a row out of range, is such a failure: cause
// "invalid_answer"), or a policy whose own (in-process) component failed.
// Exactly one of Plugin and Policy is set.
type FallbackSource struct {
	// Plugin names the plugin block whose failed calls made selections
	// fall back; for a placeholder of plugins that failed to start
	// (on_start_failure = "fallback"), the plugins any of which may
	// provide its type, joined by ", ".
	Plugin string `json:"plugin,omitempty"`
	// Policy names the policy whose failure was not a plugin call.
	Policy string `json:"policy,omitempty"`
	// Fallbacks is how many selections the source made fall back.
	Fallbacks int64 `json:"fallbacks"`
	// Causes counts Fallbacks by cause: a plugin call's
	// supervisor.CallError.Cause ("error", "panic", "timeout",
	// "invalid_answer", "restarting", "failed", "breaker_open", "closed",
	// "too_large", "shutdown"), "unavailable" for a plugin that failed to start, and
	// "error" for a policy's own failure.
	Causes map[string]int64 `json:"causes"`
	// FirstError is the text of the first failure, in simulated-time
	// order, as the router saw it (the component or fused run of the
	// policy, then the plugin's error).
	FirstError string `json:"first_error"`
}

// WriteFallbacks writes one line per source of r's fallbacks, in
// r.FallbackSources' order: the row label, the plugin (or policy), how many
// selections it made fall back and their share of all selections, the
// count of each cause (most first, then by name), and the first error's
// text. For example:
//
//	router: pd: plugin "scorer" made 200 of 200 selections fall back (100.0%): error 134, panic 66; first error: scorer "s": plugin "scorer": plugin decide: scorer "aggregated/pd/s": injected error on call 2
func WriteFallbacks(w io.Writer, r *Report) error {
	for i := range r.FallbackSources {
		s := &r.FallbackSources[i]
		who := fmt.Sprintf("plugin %q", s.Plugin)
		if s.Plugin == "" {
			who = fmt.Sprintf("policy %q", s.Policy)
		}
		causes := make([]string, 0, len(s.Causes))
		for c := range s.Causes {
			causes = append(causes, c)
		}
		slices.SortFunc(causes, func(a, b string) int {
			if s.Causes[a] != s.Causes[b] {
				return cmp.Compare(s.Causes[b], s.Causes[a])
			}
			return strings.Compare(a, b)
		})
		for k, c := range causes {
			causes[k] = fmt.Sprintf("%s %d", c, s.Causes[c])
		}
		if _, err := fmt.Fprintf(w, "router: %s: %s made %d of %d selections fall back (%s): %s; first error: %s\n",
			r.Label(), who, s.Fallbacks, r.Selections, share(s.Fallbacks, r.Selections), strings.Join(causes, ", "), s.FirstError); err != nil {
			return err
		}
	}
	return nil
}

// WriteShadowFailures writes one stderr line when r's shadow decisions
// failed (errors, panics, plugin calls that got no answer): how many of
// the shadow's decisions, and the first error. A shadow never changes a
// live decision, so this is the only place a failing shadow shows besides
// the report's shadow counts and the table's lower agreement.
func WriteShadowFailures(w io.Writer, r *Report) error {
	s := r.Shadow
	if s == nil || s.Failed == 0 {
		return nil
	}
	names := make([]string, 0, len(s.Shadows))
	for _, role := range slices.Sorted(maps.Keys(s.Shadows)) {
		names = append(names, fmt.Sprintf("%q (%s)", s.Shadows[role], role))
	}
	_, err := fmt.Fprintf(w, "router: %s: shadow policy %s failed %d of %d decisions (%s); first error: %s\n",
		r.Label(), strings.Join(names, ", "), s.Failed, s.Decisions, share(s.Failed, s.Decisions), s.FirstError)
	return err
}

// share renders n of total as a percentage with one decimal, "<0.1%" for
// a share that would round to 0.0% although n > 0.
func share(n, total int64) string {
	if total == 0 {
		return "0.0%"
	}
	p := 100 * float64(n) / float64(total)
	if n > 0 && p < 0.05 {
		return "<0.1%"
	}
	return fmt.Sprintf("%.1f%%", p)
}
