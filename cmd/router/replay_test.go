package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// arxivTrace is the 1,000-request Mooncake sample; tests replay a prefix.
var arxivTrace = filepath.Join(traceDir, "mooncake_arxiv_trace_first1000.jsonl")

// wantExit runs the CLI and checks it exits with code and every want in
// stderr; it returns stderr.
func wantExit(t *testing.T, code int, args []string, want ...string) string {
	t.Helper()
	got, _, errOut := routerRun(t, args...)
	if got != code {
		t.Errorf("%q: exit %d, want %d; stderr %q", args, got, code, errOut)
	}
	for _, w := range want {
		if !strings.Contains(errOut, w) {
			t.Errorf("%q: stderr %q lacks %q", args, errOut, w)
		}
	}
	return errOut
}

func TestReplayWorkerLimit(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"workers", []string{"--workers", "4097"}, "--workers 4097: want a whole number from 1 to 4096"},
		{"no workers", []string{"--workers", "0"}, "--workers 0: want a whole number from 1 to 4096"},
		{"no decode workers", []string{"--prefill-workers", "2", "--decode-workers", "0"}, "--decode-workers 0: want a whole number from 1 to 4096 (prefill and decode workers together)"},
		{"workers huge", []string{"--workers", "100000"}, "--workers 100000: want a whole number from 1 to 4096"},
		{"pools together", []string{"--prefill-workers", "4000", "--decode-workers", "97"},
			"--prefill-workers 4000 + --decode-workers 97 = 4097 simulated workers: want at most 4096 in all"},
		{"prefill alone", []string{"--prefill-workers", "5000", "--decode-workers", "1"}, "--prefill-workers 5000: want at most 4096"},
		// The sum of these would overflow int; each is refused alone.
		{"decode alone", []string{"--prefill-workers", "1", "--decode-workers", "9223372036854775807"},
			"--decode-workers 9223372036854775807: want at most 4096"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wantExit(t, 2, append([]string{"replay", "--limit", "10"}, tt.args...), tt.want)
		})
	}
}

func TestReplayEmptyValues(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"trailing comma", []string{"--compare", rrPolicy + ","}, "entry 2 of 2 is empty"},
		{"only commas", []string{"--compare", ",,"}, "--compare ,,: entry 1 of 3 is empty"},
		{"empty compare", []string{"--compare", ""}, "--compare '': want a comma-separated list of policy files"},
		{"empty trace", []string{"--trace", ""}, "--trace '': want a file name"},
		{"empty policy", []string{"--policy", ""}, "--policy '': want a file name"},
		{"empty report", []string{"--report", ""}, "--report '': want a file name"},
		{"empty per-request", []string{"--per-request", ""}, "--per-request '': want a file name"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wantExit(t, 2, append([]string{"replay", "--limit", "10"}, tt.args...), tt.want)
		})
	}
}

func TestReplayNoArgs(t *testing.T) {
	errOut := wantExit(t, 2, []string{"replay", "foo"}, `router: replay takes no arguments, got ["foo"]`)
	if strings.Contains(errOut, "unknown command") {
		t.Errorf("stderr %q calls the argument a command", errOut)
	}
}

func TestReplaySeedHelp(t *testing.T) {
	code, out, _ := routerRun(t, "replay", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	i := strings.Index(out, "--seed int")
	if i < 0 {
		t.Fatalf("help lacks --seed:\n%s", out)
	}
	line, _, _ := strings.Cut(out[i:], "\n")
	if want := "seed for seeded components that set none (default: the file's router.seed, else 1)"; !strings.HasSuffix(line, want) {
		t.Errorf("--seed help %q, want it to end in %q", line, want)
	}
}

// TestReplayOutputIsInput checks that no output may name an input or the
// other output, however the path is spelt.
func TestReplayOutputIsInput(t *testing.T) {
	dir := t.TempDir()
	policy := filepath.Join(dir, "p.hcl")
	src, err := os.ReadFile(rrPolicy)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(policy, src, 0o644); err != nil {
		t.Fatal(err)
	}
	hard := filepath.Join(dir, "hard.hcl")
	if err := os.Link(policy, hard); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.hcl")
	if err := os.Symlink("p.hcl", link); err != nil {
		t.Fatal(err)
	}
	absTrace, err := filepath.Abs(arxivTrace)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.json")
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"report is trace", []string{"--trace", arxivTrace, "--report", absTrace}, "--report " + absTrace + " is the --trace input"},
		{"per-request is trace", []string{"--trace", arxivTrace, "--per-request", filepath.Join(traceDir, ".", "x", "..", filepath.Base(arxivTrace))},
			"is the --trace input"},
		{"report is policy", []string{"--policy", policy, "--report", policy}, "--report " + policy + " is the --policy input"},
		{"hard link to policy", []string{"--policy", policy, "--report", hard}, "is the --policy input"},
		{"symlink to policy", []string{"--policy", policy, "--per-request", link}, "--per-request " + link + " is the --policy input"},
		{"report is compare entry", []string{"--compare", rrPolicy + "," + policy, "--report", dir + "/./p.hcl"}, "is the --compare input " + policy},
		{"both outputs", []string{"--per-request", out, "--report", filepath.Join(dir, "..", filepath.Base(dir), "out.json")}, "are the same file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wantExit(t, 2, append([]string{"replay", "--limit", "10"}, tt.args...), tt.want)
		})
	}
	if got, err := os.ReadFile(policy); err != nil || string(got) != string(src) {
		t.Fatalf("policy file changed: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 3 {
		t.Fatalf("directory holds %d entries, want the 3 inputs", len(ents))
	}
}

// dirNames lists a directory, failing the test on error.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestReplayUnwritableOutput(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "no", "such", "dir", "x.json")
	wantExit(t, 1, []string{"replay", "--report", missing},
		"--report "+missing+": cannot create a file in "+filepath.Dir(missing)+": ", "no such file or directory")
	wantExit(t, 1, []string{"replay", "--per-request", dir}, "--per-request "+dir+": is a directory")
	// The first output's temporary is removed when the second fails.
	wantExit(t, 1, []string{"replay", "--per-request", filepath.Join(dir, "r.jsonl"), "--report", missing}, "--report")
	if names := dirNames(t, dir); len(names) != 0 {
		t.Fatalf("directory holds %q, want nothing", names)
	}
}

// TestReplayFailureKeepsTargets checks that a replay failing after it
// started, for three reasons, leaves existing outputs untouched and no
// temporary file behind.
func TestReplayFailureKeepsTargets(t *testing.T) {
	bs16 := writeFile(t, "bs16.hcl", "router {\n  block_size = 16\n}\n")
	for _, tt := range []struct {
		name     string
		ctx      context.Context
		args     []string
		wantErr  string
		reqFlags bool // pass --per-request too
	}{
		// Mooncake hashes need block_size 512: the replay itself fails.
		{"replay error", context.Background(), []string{"--policy", bs16}, "block_size = 512", true},
		// The first policy replays, the second fails.
		{"second of two", context.Background(), []string{"--compare", rrPolicy + "," + bs16}, "block_size = 512", false},
		{"interrupted", canceled(), []string{"--policy", rrPolicy}, "router: interrupted\n", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			report, perReq := filepath.Join(dir, "report.json"), filepath.Join(dir, "requests.jsonl")
			// Earlier outputs of these flags: a file of another kind is
			// refused before the run (TestOutputRule).
			old := map[string]string{report: ownReport, perReq: ownPerRequest}
			for _, p := range []string{report, perReq} {
				if err := os.WriteFile(p, []byte(old[p]), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			args := append([]string{"replay", "--trace", arxivTrace, "--limit", "50", "--report", report}, tt.args...)
			if tt.reqFlags {
				args = append(args, "--per-request", perReq)
			}
			var out, errb strings.Builder
			if code := runContext(tt.ctx, args, &out, &errb); code != 1 || !strings.Contains(errb.String(), tt.wantErr) {
				t.Fatalf("exit %d, stderr %q; want 1 and %q", code, errb.String(), tt.wantErr)
			}
			for _, p := range []string{report, perReq} {
				if b, err := os.ReadFile(p); err != nil || string(b) != old[p] {
					t.Errorf("%s: %q, %v; want it unchanged", p, b, err)
				}
			}
			if names := dirNames(t, dir); !slices.Equal(names, []string{"report.json", "requests.jsonl"}) {
				t.Errorf("directory holds %q, want only the two targets", names)
			}
		})
	}
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// TestReplayReplacesTargets checks a successful run replaces both outputs,
// keeps an existing file's mode and leaves no temporary file.
func TestReplayReplacesTargets(t *testing.T) {
	dir := t.TempDir()
	report, perReq := filepath.Join(dir, "report.json"), filepath.Join(dir, "requests.jsonl")
	if err := os.WriteFile(report, []byte(`[`+ownReport+`]`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := routerRun(t, "replay", "--trace", arxivTrace, "--limit", "20", "--workers", "2",
		"--report", report, "--per-request", perReq)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var rep struct{ Requests int }
	if b, err := os.ReadFile(report); err != nil || json.Unmarshal(b, &rep) != nil || rep.Requests != 20 {
		t.Fatalf("report %q, %v", b, err)
	}
	if fi, err := os.Stat(report); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("report mode %v, %v; want 0600 kept", fi.Mode(), err)
	}
	if b, err := os.ReadFile(perReq); err != nil || strings.Count(string(b), "\n") != 20 {
		t.Errorf("per-request %d lines, %v; want 20", strings.Count(string(b), "\n"), err)
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"report.json", "requests.jsonl"}) {
		t.Errorf("directory holds %q", names)
	}
}

// With --compare the report is a JSON array, even of one policy.
func TestReplayCompareReportIsArray(t *testing.T) {
	report := filepath.Join(t.TempDir(), "r.json")
	if code, _, errOut := routerRun(t, "replay", "--compare", rrPolicy, "--trace", arxivTrace, "--limit", "20", "--report", report); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var reps []struct{ Policy string }
	if b, err := os.ReadFile(report); err != nil || json.Unmarshal(b, &reps) != nil || len(reps) != 1 || reps[0].Policy != "round-robin" {
		t.Fatalf("report %q, %v; want an array of one round-robin report", b, err)
	}
}

func TestReplayPrefixFlagErrors(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown", []string{"--prefix", "exact"}, "--prefix exact: want approximate, precise or both"},
		{"empty", []string{"--prefix", ""}, "--prefix '': want approximate, precise or both"},
		{"delay alone", []string{"--kv-event-delay", "1s"}, "--kv-event-delay applies to KV events: give --prefix precise or --prefix both"},
		{"negative", []string{"--prefix", "precise", "--kv-event-delay", "-1s"}, "--kv-event-delay -1s: want a duration >= 0"},
		{"both per-request", []string{"--prefix", "both", "--per-request", "x.jsonl"}, "--prefix both runs each policy twice"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wantExit(t, 2, append([]string{"replay", "--limit", "10"}, tt.args...), tt.want)
		})
	}
}

// TestReplayReportNoneCompleted: a run where every request is rejected
// (each names a class the policy's queue lacks) exits 0, names one
// reason with the full count, and its JSON report has null latency
// summaries, not 0 ms.
func TestReplayReportNoneCompleted(t *testing.T) {
	policy := writeFile(t, "p.hcl", `queue {
  default_class = "a"
  class "a" {
    weight = 1
  }
}

request_classifier {
  type = "header-priority"
}
`)
	var tr strings.Builder
	for i := range 4 {
		fmt.Fprintf(&tr, `{"timestamp": %d, "input_length": 10, "output_length": 2, "hash_ids": [%d], "policy_class": "zzz"}`+"\n", i, i)
	}
	trace := writeFile(t, "z.jsonl", tr.String())
	report := filepath.Join(t.TempDir(), "r.json")
	code, _, errOut := routerRun(t, "replay", "--trace", trace, "--policy", policy, "--report", report)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if want := `4 of 4 requests rejected; most common reason (4): unknown policy class "zzz" (queue classes: a)`; !strings.Contains(errOut, want) {
		t.Errorf("stderr %q lacks %q", errOut, want)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var rep map[string]json.RawMessage
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ttft_ms", "e2e_ms", "queue_ms", "tpot_ms", "itl_ms"} {
		if string(rep[k]) != "null" {
			t.Errorf("%s = %s, want null", k, rep[k])
		}
	}
	if string(rep["completed"]) != "0" || !strings.Contains(string(rep["classes"]), `"ttft_ms": null`) {
		t.Errorf("completed %s, classes %s", rep["completed"], rep["classes"])
	}
}
