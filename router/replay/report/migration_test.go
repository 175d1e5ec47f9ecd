package report

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestWriteMigrations(t *testing.T) {
	m := &MigrationReport{Limit: 3, Failures: 1, Restarts: 1, Cut: 3,
		Outcomes: map[string]int{"migrated": 2, "over_limit": 0, "no_worker": 1}, Requests: 2, Completed: 2,
		TTFT: Summary{P50: 392.4, P90: 1200}, E2E: Summary{P50: 5015.5, P90: 9951.5}, Gap: Summary{P50: 46.25, P90: 4604},
		ExtraPrefillTokens: 2000, ExtraPrefillCachedTokens: 500}
	cells := []Cell{{Runs: []*Report{{Policy: "default", Workers: 8}}}, {Runs: []*Report{{Policy: "kv", Workers: 8, Migration: m}}}}
	var b strings.Builder
	if err := writeMigrations(&b, cells, 60); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, l := range strings.Split(got, "\n") {
		if utf8.RuneCountInString(l) > 60 {
			t.Errorf("line of %d runes: %q", utf8.RuneCountInString(l), l)
		}
	}
	for _, w := range []string{"kv on 8 workers: 1 failure, 1 restart; 3 cuts: 2 migrated, 1", "failed (no_worker 1)",
		"TTFT p50 392 p90 1200", "E2E p50 5016 p90 9952", "p50 46.2 p90", "4604", "2000 tokens (25% from cache)"} {
		if !strings.Contains(strings.Join(strings.Fields(got), " "), w) {
			t.Errorf("missing %q in\n%s", w, got)
		}
	}
	if strings.Contains(got, "default") {
		t.Errorf("a run without failures has a section:\n%s", got)
	}
	b.Reset()
	if err := writeMigrations(&b, cells[:1], 60); err != nil || b.Len() != 0 {
		t.Errorf("no failures: %q, %v", b.String(), err)
	}
}
