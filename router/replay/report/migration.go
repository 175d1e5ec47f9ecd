package report

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// MigrationReport is a replay's engine failures and the migrations of the
// requests they cut (router replay --fail, --fail-rate; package replay's
// Failures). Latencies in ms of simulated time.
type MigrationReport struct {
	// Limit is the migration limit (migrate.Policy.Limit; 0: none
	// migrate); RestartAfterMs how long a failed engine stayed out;
	// RatePerWorkerHour the random failure rate (0: none).
	Limit             int     `json:"limit"`
	RestartAfterMs    float64 `json:"restart_after_ms"`
	RatePerWorkerHour float64 `json:"rate_per_worker_hour"`
	// Failures and Restarts count engine failures and rejoins; Cut the
	// cuts of requests (a request cut twice counts twice).
	Failures int `json:"failures"`
	Restarts int `json:"restarts"`
	Cut      int `json:"cut"`
	// NotReached counts the --fail failures timed after the run's end
	// (its last request ended first): they did nothing.
	NotReached int `json:"not_reached"`
	// WhileDown counts the --fail failures timed while their worker was
	// already down (failed before and not yet restarted): they did
	// nothing either.
	WhileDown int `json:"while_down"`
	// Causes counts the cuts by cause and Outcomes by outcome, keyed as
	// router/migrate's Cause and Outcome (every outcome present, 0
	// included). Outcomes other than "migrated" are requests that failed
	// (they are in Report.Rejected).
	Causes   map[string]int `json:"causes"`
	Outcomes map[string]int `json:"outcomes"`
	// Requests is the requests migrated at least once, Completed those of
	// them that completed; TTFT (the first token the client saw, from its
	// arrival) and E2E (to its continuation's last token) are over those.
	Requests  int     `json:"requests"`
	Completed int     `json:"completed"`
	TTFT      Summary `json:"ttft_ms"`
	E2E       Summary `json:"e2e_ms"`
	// ExtraPrefillTokens is the prompt plus generated tokens the
	// continuations' engines had to prefill again; ExtraPrefillCachedTokens
	// those of them served from their prefix cache (the prompt's blocks
	// only: generated tokens are cached nowhere).
	ExtraPrefillTokens       int64 `json:"extra_prefill_tokens"`
	ExtraPrefillCachedTokens int64 `json:"extra_prefill_cached_tokens"`
	// Gap is the client's gap: from a cut to the next token it receives
	// (its continuation's first token).
	Gap Summary `json:"gap_ms"`
}

// failed is the cut requests that did not migrate.
func (m *MigrationReport) failed() (n int, parts []string) {
	keys := make([]string, 0, len(m.Outcomes))
	for k, v := range m.Outcomes {
		if k != "migrated" && v > 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		n += m.Outcomes[k]
		parts = append(parts, fmt.Sprintf("%s %d", k, m.Outcomes[k]))
	}
	return n, parts
}

// MigrationLines are the engine failure section's lines, unwrapped: per
// run with engine failures, its failures, restarts and cuts by outcome,
// and, when some requests migrated, their TTFT, E2E, the client's gap and
// the extra prefill; each second line starts with two spaces. None when
// no run has failures. The text table's section (under WriteComparison's
// table) and the HTML page show them.
func MigrationLines(cells []Cell) []string {
	var out []string
	for _, c := range cells {
		for k, r := range c.Runs {
			m := r.Migration
			if m == nil {
				continue
			}
			name := r.Label() + " on " + c.Fleet() + " workers"
			if r.PrefillWorkers > 0 {
				name = r.Label() + " on " + c.Fleet()
			}
			if len(c.Runs) > 1 {
				name += fmt.Sprintf(" (seed run %d)", k+1)
			}
			failed, parts := m.failed()
			line := fmt.Sprintf("%s: %s, %s; %s: %d migrated, %d failed", name,
				plural(m.Failures, "failure"), plural(m.Restarts, "restart"), plural(m.Cut, "cut"), m.Outcomes["migrated"], failed)
			if len(parts) > 0 {
				line += " (" + strings.Join(parts, ", ") + ")"
			}
			out = append(out, line)
			if m.NotReached > 0 {
				out = append(out, fmt.Sprintf("  %s timed after the run's last request ended: not applied", plural(m.NotReached, "--fail failure")))
			}
			if m.WhileDown > 0 {
				out = append(out, fmt.Sprintf("  %s timed while its worker was down (failed, not yet restarted): not applied", plural(m.WhileDown, "--fail failure")))
			}
			if m.Requests > 0 {
				pct := 0.0
				if m.ExtraPrefillTokens > 0 {
					pct = 100 * float64(m.ExtraPrefillCachedTokens) / float64(m.ExtraPrefillTokens)
				}
				out = append(out, fmt.Sprintf("  %d migrated requests, %d completed: TTFT p50 %s p90 %s, E2E p50 %s p90 %s; cut to next token p50 %s p90 %s; extra prefill %d tokens (%.0f%% from cache)",
					m.Requests, m.Completed, ms(m.TTFT.P50), ms(m.TTFT.P90), ms(m.E2E.P50), ms(m.E2E.P90),
					ms(m.Gap.P50), ms(m.Gap.P90), m.ExtraPrefillTokens, pct))
			}
		}
	}
	return out
}

// MigrationHeading is the engine failure section's heading.
const MigrationHeading = "engine failures (latencies in ms of simulated time):"

// writeMigrations writes, under the table, the MigrationLines, each
// wrapped to width (0: no wrapping): a section of its own rather than
// more columns; nothing when no run has failures.
func writeMigrations(w io.Writer, cells []Cell, width int) error {
	lines := MigrationLines(cells)
	if len(lines) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("\n" + MigrationHeading + "\n")
	for _, l := range lines {
		if rest, ok := strings.CutPrefix(l, "  "); ok {
			b.WriteString("  " + Wrap(rest, width-2) + "\n")
		} else {
			b.WriteString(Wrap(l, width) + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// plural is "1 noun" or "N nouns".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
