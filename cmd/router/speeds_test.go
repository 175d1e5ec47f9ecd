package main

import (
	"encoding/json"
	"html"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/replay"
	"github.com/switchyard-router/switchyard/router/replay/report"
)

// TestReplaySpeedsErrors: every bad --speeds is a usage error naming the
// entry.
func TestReplaySpeedsErrors(t *testing.T) {
	for _, tt := range []struct {
		name, speeds, want string
	}{
		{"zero", "2,0", `--speeds 2,0: entry 2 of 2, "0", is not a speed; want numbers from 0.01 to 100`},
		{"negative", "-1", `--speeds -1: entry 1 of 1, "-1", is not a speed`},
		{"NaN", "1,NaN", `entry 2 of 2, "NaN", is not a speed`},
		{"infinite", "Inf", `entry 1 of 1, "Inf", is not a speed`},
		{"too fast", "2,1000", `entry 2 of 2, "1000", is not a speed`},
		{"not a number", "2,fast", `entry 2 of 2, "fast", is not a speed`},
		{"empty entry", "2,,1", "--speeds 2,,1: entry 2 of 3 is empty"},
		{"trailing comma", "2,", "--speeds 2,: entry 2 of 2 is empty"},
		{"empty", "", "--speeds '': want numbers from 0.01 to 100"},
		{"too many", strings.Repeat("1,", replay.MaxWorkers) + "2", "--speeds: 4097 entries; want at most 4096"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wantExit(t, 2, []string{"replay", "--limit", "10", "--speeds", tt.speeds}, tt.want)
		})
	}
}

// TestReplaySpeedsOneIsDefault: --speeds 1 (and 1,1) replays byte for
// byte as no flag: the per-request lines, the table and the report.
func TestReplaySpeedsOneIsDefault(t *testing.T) {
	run := func(extra ...string) (lines, table string, rep map[string]any) {
		t.Helper()
		dir := t.TempDir()
		reqs, js := filepath.Join(dir, "r.jsonl"), filepath.Join(dir, "rep.json")
		args := append([]string{"replay", "--trace", arxivTrace, "--limit", "200", "--workers", "4", "--quiet",
			"--per-request", reqs, "--report", js}, extra...)
		code, out, errOut := routerRun(t, args...)
		if code != 0 {
			t.Fatalf("%q: exit %d: %s", args, code, errOut)
		}
		l, err := os.ReadFile(reqs)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(js)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &rep); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"wall_s", "decisions_per_s", "sim_requests_per_s"} {
			delete(rep, k) // measured on the wall clock
		}
		return string(l), out, rep
	}
	l0, t0, r0 := run()
	for _, s := range []string{"1", "1,1"} {
		l1, t1, r1 := run("--speeds", s)
		if l1 != l0 {
			t.Errorf("--speeds %s: per-request lines differ from no flag", s)
		}
		if t1 != t0 {
			t.Errorf("--speeds %s: table\n%s\nwant\n%s", s, t1, t0)
		}
		b0, _ := json.Marshal(r0)
		b1, _ := json.Marshal(r1)
		if string(b0) != string(b1) {
			t.Errorf("--speeds %s: report differs from no flag:\n%s\n%s", s, b1, b0)
		}
	}
}

// TestReplaySpeedsFastFinishSooner: with --speeds 2,1 on 4 workers and
// round-robin, each class serves half the requests and the speed-2
// workers finish theirs sooner (mean TTFT and E2E from the per-request
// lines); the header line names the speeds.
func TestReplaySpeedsFastFinishSooner(t *testing.T) {
	t.Setenv("COLUMNS", "1000") // the header line unwrapped
	code, out, errOut := routerRun(t, "replay", "--trace", arxivTrace, "--limit", "300", "--workers", "4", "--quiet",
		"--policy", rrPolicy, "--speeds", "2,1", "--per-request", "-")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(errOut, "on 4 simulated workers; worker speeds 2,1, repeating over each pool's workers") {
		t.Errorf("header line lacks the speeds: %q", strings.SplitN(errOut, "\n", 2)[0])
	}
	var sumE2E, sumTTFT [2]float64
	var n [2]int
	for line := range strings.Lines(out) {
		var oc replay.Outcome
		if err := json.Unmarshal([]byte(line), &oc); err != nil {
			t.Fatal(err)
		}
		c := oc.Worker % 2 // 0: speed 2, 1: speed 1
		sumE2E[c] += oc.E2EMs
		sumTTFT[c] += oc.TTFTMs
		n[c]++
	}
	if n != [2]int{150, 150} {
		t.Fatalf("requests per class %v, want 150 each", n)
	}
	fastE2E, slowE2E := sumE2E[0]/150, sumE2E[1]/150
	fastTTFT, slowTTFT := sumTTFT[0]/150, sumTTFT[1]/150
	if !(fastE2E < 0.75*slowE2E && fastTTFT < 0.75*slowTTFT) {
		t.Errorf("mean E2E %.1f ms fast, %.1f slow; TTFT %.1f fast, %.1f slow; want the fast class under 3/4 of the slow",
			fastE2E, slowE2E, fastTTFT, slowTTFT)
	}
}

// TestReplaySpeedsSweep: --speeds cycles over every fleet of a --workers
// list, with --compare; each report lists its fleet's speeds, and the
// HTML report's fleet headings name the mix.
func TestReplaySpeedsSweep(t *testing.T) {
	dir := t.TempDir()
	js, htmlFile := filepath.Join(dir, "rep.json"), filepath.Join(dir, "r.html")
	code, _, errOut := routerRun(t, "replay", "--trace", arxivTrace, "--limit", "60", "--workers", "2,3", "--quiet",
		"--compare", rrPolicy+","+kvPolicy, "--speeds", "2,1", "--report", js, "--html", htmlFile)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var reps []report.Report
	if err := json.Unmarshal(b, &reps); err != nil {
		t.Fatal(err)
	}
	if len(reps) != 4 {
		t.Fatalf("%d reports, want 4 (2 policies × 2 fleets)", len(reps))
	}
	for _, r := range reps {
		want := []float64{2, 1}
		if r.Workers == 3 {
			want = []float64{2, 1, 2}
		}
		if !slices.Equal(r.Speeds, want) {
			t.Errorf("%s on %d workers: speeds %v, want %v", r.Policy, r.Workers, r.Speeds, want)
		}
	}
	page, err := os.ReadFile(htmlFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 workers (1 × speed 2 + 1 × speed 1)", "3 workers (2 × speed 2 + 1 × speed 1)"} {
		if !strings.Contains(html.UnescapeString(string(page)), want) {
			t.Errorf("HTML report lacks %q", want)
		}
	}
}

// TestReplaySpeedsHelp: the flag is documented.
func TestReplaySpeedsHelp(t *testing.T) {
	code, out, _ := routerRun(t, "replay", "--help")
	if code != 0 || !strings.Contains(out, "--speeds string") || !strings.Contains(out, "2,1: half the workers twice as fast") {
		t.Errorf("exit %d; help lacks --speeds:\n%s", code, out)
	}
}
