package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReplayFailFlagErrors(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"no at", []string{"--fail", "sim-3"}, `--fail "sim-3": want WORKER@TIME`},
		{"bad time", []string{"--fail", "sim-3@soon"}, `time "soon"`},
		{"out of fleet", []string{"--workers", "4,8", "--fail", "sim-5@1s"}, "--fail sim-5@1s: the smallest fleet has sim-0 to sim-3"},
		{"rate", []string{"--fail-rate", "-1"}, "--fail-rate -1: want failures per worker-hour from 0 to 3600"},
		{"restart alone", []string{"--restart-after", "10s"}, "--restart-after applies to engine failures"},
		{"limit alone", []string{"--migration-limit", "1"}, "--migration-limit applies to engine failures"},
		{"limit", []string{"--fail", "1@1s", "--migration-limit", "-1"}, "--migration-limit -1: want a whole number >= 0"},
		{"restart zero", []string{"--fail", "1@1s", "--restart-after", "0s"}, "--restart-after 0s: want a duration above 0"},
		{"precise", []string{"--fail", "1@1s", "--prefix", "precise"}, "approximate prefix mode only"},
		{"disaggregated", []string{"--fail", "1@1s", "--prefill-workers", "2", "--decode-workers", "2"}, "aggregated workers only"},
		// An entry listed twice is refused, as --workers 8,8 is; the same
		// failure written two ways too.
		{"twice in one value", []string{"--fail", "3@1768s,3@1768s"}, "--fail: 3@1768s is listed twice"},
		{"twice in two values", []string{"--fail", "3@1768s", "--fail", "1@1s", "--fail", "3@1768s"}, "--fail: 3@1768s is listed twice"},
		{"twice, written two ways", []string{"--fail", "3@1768s", "--fail", "sim-3@29m28s"},
			"--fail: sim-3@29m28s is listed twice (as 3@1768s and sim-3@29m28s)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wantExit(t, 2, append([]string{"replay", "--limit", "10"}, tt.args...), tt.want)
		})
	}
}

// router replay --fail on the arXiv sample: the failed worker's requests
// migrate (JSON report), the text table is followed by the failures'
// section, within the table's width.
func TestReplayFailReport(t *testing.T) {
	report := filepath.Join(t.TempDir(), "r.json")
	code, out, errOut := routerRun(t, "replay", "--trace", arxivTrace, "--limit", "300", "--workers", "2",
		"--fail", "sim-1@20s", "--fail", "1@40s", "--restart-after", "5s", "--report", report)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var rep struct {
		Requests, Completed, Rejected int
		Migration                     *struct {
			Limit, Failures, Restarts, Cut int
			Outcomes                       map[string]int
			RestartAfterMs                 float64 `json:"restart_after_ms"`
		}
	}
	b, err := os.ReadFile(report)
	if err != nil || json.Unmarshal(b, &rep) != nil {
		t.Fatalf("report %q: %v", b, err)
	}
	m := rep.Migration
	if m == nil || m.Failures != 2 || m.Restarts != 2 || m.Limit != 3 || m.RestartAfterMs != 5000 || m.Cut == 0 || m.Outcomes["migrated"] != m.Cut {
		t.Fatalf("migration %+v", m)
	}
	if rep.Completed != 300 || rep.Rejected != 0 {
		t.Errorf("completed %d rejected %d, want 300 and 0", rep.Completed, rep.Rejected)
	}
	if !strings.Contains(out, "engine failures (latencies in ms of simulated time):\ndefault on 2 workers: 2 failures, 2 restarts;") {
		t.Errorf("no failures section in\n%s", out)
	}
	for _, l := range strings.Split(out, "\n") {
		if n := len([]rune(l)); n > defaultTableWidth {
			t.Errorf("line of %d runes, want at most %d: %q", n, defaultTableWidth, l)
		}
	}
}

// TestReplayFailWhileDown: a --fail failure timed while its worker is
// still down from an earlier one does nothing, and the text section and
// the JSON report (while_down, next to not_reached) say so.
func TestReplayFailWhileDown(t *testing.T) {
	report := filepath.Join(t.TempDir(), "r.json")
	code, out, errOut := routerRun(t, "replay", "--trace", arxivTrace, "--limit", "300", "--workers", "2",
		"--fail", "sim-1@20s", "--fail", "1@22s", "--restart-after", "5s", "--report", report)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var rep struct {
		Migration *struct {
			Failures, Restarts int
			NotReached         int `json:"not_reached"`
			WhileDown          int `json:"while_down"`
		}
	}
	b, err := os.ReadFile(report)
	if err != nil || json.Unmarshal(b, &rep) != nil {
		t.Fatalf("report %q: %v", b, err)
	}
	if m := rep.Migration; m == nil || m.Failures != 1 || m.Restarts != 1 || m.WhileDown != 1 || m.NotReached != 0 {
		t.Fatalf("migration %+v, want 1 failure, 1 restart, 1 while down, 0 not reached", m)
	}
	if !strings.Contains(out, "default on 2 workers: 1 failure, 1 restart;") ||
		!strings.Contains(out, "\n  1 --fail failure timed while its worker was down (failed, not yet restarted): not applied\n") {
		t.Errorf("no while-down line in\n%s", out)
	}
}
