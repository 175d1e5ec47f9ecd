package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// faultyPolicy is a policy file whose scorer is the supervisor's test
// plugin's t-active in mode "fail", failing as fail (SY_FAIL) says, with
// the default fallback (least-loaded).
func faultyPolicy(t *testing.T, name, fail string) string {
	t.Helper()
	return writeFile(t, name+".hcl", fmt.Sprintf(`plugin "flaky" {
  command = %q
  env = {
    SY_TEST_MODE = "fail"
    SY_FAIL      = %q
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
`, examplePlugin(t, "faulty"), fail))
}

// fallbackLine matches WriteFallbacks' line for plugin "flaky" in a
// 200-request replay of one policy file named fail.hcl.
var fallbackLine = regexp.MustCompile(`^router: fail: plugin "flaky" made 200 of 200 selections fall back \(100\.0%\): ([a-z_]+ \d+(?:, [a-z_]+ \d+)*); first error: (.*)$`)

// A replay whose plugin fails every call completes every request by the
// fallback, and says so: the table's fallbacks column, the report's
// fallbacks, share and per-plugin breakdown, a warning logged for the
// failure, and a last stderr line naming the plugin, the causes and the
// first error. --fail-on-fallback then exits 1, after writing the same
// outputs.
func TestReplayFailingPluginIsReported(t *testing.T) {
	t.Setenv("COLUMNS", "1000") // every default column, one line each: the rows are read by position
	for _, tt := range []struct {
		fail, cause, first string
	}{
		{"error", "error", `scorer "s": plugin "flaky": plugin decide: scorer "aggregated/p/s": injected error on call 1`},
		{"panic", "panic", `scorer "s": plugin "flaky": plugin decide: scorer "aggregated/p/s" panicked: injected panic on call 1`},
	} {
		t.Run(tt.fail, func(t *testing.T) {
			file := faultyPolicy(t, "fail", tt.fail)
			dir := t.TempDir()
			var pers [][]byte
			var reps []map[string]any
			for i, extra := range [][]string{nil, {"--fail-on-fallback"}} {
				per, rep := filepath.Join(dir, fmt.Sprint("per-", i)), filepath.Join(dir, fmt.Sprint("rep-", i))
				args := append([]string{"replay", "--policy", file, "--trace", filepath.Join(traceDir, "mooncake_arxiv_trace_first1000.jsonl"),
					"--limit", "200", "--workers", "4", "--per-request", per, "--report", rep}, extra...)
				code, out, errOut := routerRun(t, args...)
				lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
				if extra != nil {
					// The exit status and its reason, after the usual
					// output.
					want := "router: --fail-on-fallback: 200 selections were decided by a fallback policy"
					if code != 1 || lines[len(lines)-1] != want {
						t.Fatalf("--fail-on-fallback: exit %d, last stderr line %q; want 1, %q", code, lines[len(lines)-1], want)
					}
					lines = lines[:len(lines)-1]
				} else if code != 0 {
					t.Fatalf("exit %d: %s", code, errOut)
				}
				row := strings.Fields(strings.Split(out, "\n")[2])
				if len(row) < 6 || strings.Join(row[:6], " ") != "fail 200 200 0 200 (100.0%)" {
					t.Errorf("table row %q, want 200 requests, 200 completed, 0 rejected, fallbacks 200 (100.0%%)", row)
				}
				m := fallbackLine.FindStringSubmatch(lines[len(lines)-1])
				if m == nil {
					t.Fatalf("last stderr line %q, want the plugin's fallbacks; stderr:\n%s", lines[len(lines)-1], errOut)
				}
				// Every call failed: by the plugin's own failure, the
				// first always, or refused by its circuit breaker once
				// that opened (when depends on the wall clock).
				causes := checkCauses(t, m[1], tt.cause)
				if m[2] != tt.first {
					t.Errorf("first error %q, want %q", m[2], tt.first)
				}
				if want := fmt.Sprintf(`plugin call failed: call=decide cause=%s failures=1 error=`, tt.cause); !strings.Contains(errOut, want) {
					t.Errorf("stderr lacks the warning %q:\n%s", want, errOut)
				}

				b, err := os.ReadFile(rep)
				if err != nil {
					t.Fatal(err)
				}
				var r map[string]any
				if err := json.Unmarshal(b, &r); err != nil {
					t.Fatal(err)
				}
				src := r["fallback_sources"].([]any)[0].(map[string]any)
				if r["completed"] != 200.0 || r["selections"] != 200.0 || r["fallbacks"] != 200.0 || r["fallback_share"] != 1.0 ||
					len(r["fallback_sources"].([]any)) != 1 || src["plugin"] != "flaky" || src["fallbacks"] != 200.0 || src["first_error"] != tt.first {
					t.Errorf("report:\n%s", b)
				}
				for c, n := range src["causes"].(map[string]any) {
					if causes[c] != int64(n.(float64)) {
						t.Errorf("report cause %s: %v, stderr says %d", c, n, causes[c])
					}
				}
				if len(src["causes"].(map[string]any)) != len(causes) {
					t.Errorf("report causes %v, stderr %v", src["causes"], causes)
				}
				p, err := os.ReadFile(per)
				if err != nil {
					t.Fatal(err)
				}
				if n := bytes.Count(p, []byte(`"fallback":true`)); n != 200 {
					t.Errorf("%d per-request lines fell back, want 200", n)
				}
				pers = append(pers, p)
				delete(r, "wall_s")
				delete(r, "decisions_per_s")
				delete(r, "sim_requests_per_s")
				delete(r, "fallback_sources") // the split between the plugin's failures and the breaker's refusals
				reps = append(reps, r)
			}
			// The flag changes the exit status only: the same outputs.
			if !bytes.Equal(pers[0], pers[1]) {
				t.Error("the --per-request outputs of the two runs differ")
			}
			a, _ := json.Marshal(reps[0])
			b, _ := json.Marshal(reps[1])
			if !bytes.Equal(a, b) {
				t.Errorf("the reports differ beyond wall-clock fields:\n%s\n%s", a, b)
			}
		})
	}
}

// checkCauses parses "error 3, breaker_open 197" and checks that the
// counts add up to 200, that the plugin's own cause is among them (its
// first failure is never refused) and that any other is the breaker's.
func checkCauses(t *testing.T, s, own string) map[string]int64 {
	t.Helper()
	causes := make(map[string]int64)
	var sum int64
	for _, part := range strings.Split(s, ", ") {
		name, count, _ := strings.Cut(part, " ")
		n, err := strconv.ParseInt(count, 10, 64)
		if err != nil {
			t.Fatalf("causes %q: %v", s, err)
		}
		causes[name] = n
		sum += n
		if name != own && name != "breaker_open" {
			t.Errorf("cause %q in %q, want only %s and breaker_open", name, s, own)
		}
	}
	if sum != 200 || causes[own] < 1 {
		t.Errorf("causes %q: %d in all, want 200 with at least one %s", s, sum, own)
	}
	return causes
}

// A replay whose plugin answers every call: no fallback, a 0 in the
// table, no fallback line, and exit 0 with --fail-on-fallback.
func TestReplayHealthyPluginPassesFailOnFallback(t *testing.T) {
	t.Setenv("COLUMNS", "1000") // every default column, one line each: the rows are read by position
	file := faultyPolicy(t, "fine", "ok")
	rep := filepath.Join(t.TempDir(), "rep.json")
	code, out, errOut := routerRun(t, "replay", "--policy", file, "--trace", filepath.Join(traceDir, "mooncake_arxiv_trace_first1000.jsonl"),
		"--limit", "200", "--workers", "4", "--report", rep, "--fail-on-fallback")
	if code != 0 || strings.Contains(errOut, "fall back") || strings.Contains(errOut, "plugin call failed") {
		t.Fatalf("exit %d, stderr %q; want 0 and no fallback", code, errOut)
	}
	if row := strings.Fields(strings.Split(out, "\n")[2]); len(row) < 5 || strings.Join(row[:5], " ") != "fine 200 200 0 0" {
		t.Errorf("table row %q, want fallbacks 0", row)
	}
	b, err := os.ReadFile(rep)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"selections": 200`, `"fallbacks": 0`, `"fallback_share": 0`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("report lacks %s:\n%s", want, b)
		}
	}
	if bytes.Contains(b, []byte("fallback_sources")) {
		t.Errorf("report has fallback_sources:\n%s", b)
	}
}

// With --compare every row has its fallbacks cell, and the stderr line
// names the row whose plugin failed.
func TestReplayCompareShowsFallbacks(t *testing.T) {
	t.Setenv("COLUMNS", "1000") // every default column, one line each: the rows are read by position
	healthy := policyWith(t, "plugin-example.hcl", "plugin-example")
	failing := faultyPolicy(t, "fail", "error")
	rep := filepath.Join(t.TempDir(), "rep.json")
	code, out, errOut := routerRun(t, "replay", "--compare", healthy+","+failing, "--trace", filepath.Join(traceDir, "mooncake_arxiv_trace_first1000.jsonl"),
		"--limit", "200", "--workers", "4", "--report", rep)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	rows := strings.Split(out, "\n")
	if r := strings.Fields(rows[2]); len(r) < 5 || strings.Join(r[:5], " ") != "plugin-example 200 200 0 0" {
		t.Errorf("healthy row %q, want fallbacks 0", r)
	}
	if r := strings.Fields(rows[3]); len(r) < 6 || strings.Join(r[:6], " ") != "fail 200 200 0 200 (100.0%)" {
		t.Errorf("failing row %q, want fallbacks 200 (100.0%%)", r)
	}
	lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
	if m := fallbackLine.FindStringSubmatch(lines[len(lines)-1]); m == nil {
		t.Errorf("last stderr line %q, want the failing plugin's", lines[len(lines)-1])
	}
	if strings.Count(errOut, "selections fall back") != 1 {
		t.Errorf("want one fallback line:\n%s", errOut)
	}
	b, err := os.ReadFile(rep)
	if err != nil {
		t.Fatal(err)
	}
	var reps []struct {
		Policy     string `json:"policy"`
		Selections int64  `json:"selections"`
		Fallbacks  int64  `json:"fallbacks"`
		Sources    []any  `json:"fallback_sources"`
	}
	if err := json.Unmarshal(b, &reps); err != nil {
		t.Fatal(err)
	}
	if len(reps) != 2 || reps[0].Fallbacks != 0 || reps[0].Sources != nil || reps[0].Selections != 200 ||
		reps[1].Fallbacks != 200 || len(reps[1].Sources) != 1 || reps[1].Selections != 200 {
		t.Errorf("reports %+v", reps)
	}
}
