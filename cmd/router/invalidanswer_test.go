package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// TestReplayInvalidAnswerIsReported: a plugin whose scorer answers a NaN
// cost at every call is a plugin failure in a replay: every selection
// falls back, the fallback summary names the plugin with the cause
// invalid_answer and the reason, and the failure is logged. A replay has
// no circuit breaker, so every call reaches the plugin and the summary
// repeats exactly.
func TestReplayInvalidAnswerIsReported(t *testing.T) {
	file := writeFile(t, "wrong.hcl", fmt.Sprintf(`plugin "wrong" {
  command = %q
  env = {
    SY_TEST_MODE = "invalid"
    SY_INVALID   = "nan"
  }
}

policy "p" {
  scorer "s" {
    type = "t-active"
  }
  picker "pick" {
    type = "min-cost"
  }
}

worker_selection {
  aggregated = "p"
}
`, examplePlugin(t, "faulty")))
	var summaries []string
	for range 2 {
		code, _, errOut := routerRun(t, "replay", "--policy", file, "--trace", filepath.Join(traceDir, "mooncake_arxiv_trace_first1000.jsonl"),
			"--limit", "100", "--workers", "4")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
		last := lines[len(lines)-1]
		want := `router: wrong: plugin "wrong" made 100 of 100 selections fall back (100.0%): invalid_answer 100; first error: scorer "s": plugin "wrong": plugin decide: invalid answer (non_finite_cost): cost NaN for row 0`
		if last != want {
			t.Fatalf("last stderr line\n%s\nwant\n%s\nstderr:\n%s", last, want, errOut)
		}
		if w := "plugin call failed: call=decide cause=invalid_answer failures=1 "; !strings.Contains(errOut, w) {
			t.Errorf("stderr lacks the warning %q:\n%s", w, errOut)
		}
		summaries = append(summaries, last)
	}
	if summaries[0] != summaries[1] {
		t.Errorf("two replays summarise differently:\n%s\n%s", summaries[0], summaries[1])
	}
}
