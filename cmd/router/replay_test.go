package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
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

func TestReplayEmptyTrace(t *testing.T) {
	for _, tt := range []struct{ name, content string }{
		{"empty.jsonl", ""},
		{"blank.jsonl", "\n\n"},
		{"header.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			file := writeFile(t, tt.name, tt.content)
			if errOut := wantExit(t, 1, []string{"replay", "--trace", file}); errOut != "router: "+file+": no records\n" {
				t.Errorf("stderr %q", errOut)
			}
		})
	}
}

func TestReplayNoArgs(t *testing.T) {
	errOut := wantExit(t, 2, []string{"replay", "foo"}, `router replay takes no arguments, got ["foo"]`)
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
			for _, p := range []string{report, perReq} {
				if err := os.WriteFile(p, []byte("old "+filepath.Base(p)), 0o600); err != nil {
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
				if b, err := os.ReadFile(p); err != nil || string(b) != "old "+filepath.Base(p) {
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
	if err := os.WriteFile(report, []byte("old"), 0o600); err != nil {
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

// TestReplayDefaultRoleWarning checks the warning and the row label when a
// role falls back to the built-in default policy, and that neither appears
// when the file's policies run.
func TestReplayDefaultRoleWarning(t *testing.T) {
	prefillOnly := writeFile(t, "prefill-only.hcl", `
policy "rr" {
  picker "rr" { type = "round-robin" }
}
worker_selection { prefill = "rr" }
`)
	both := writeFile(t, "pd.hcl", `
policy "rr" {
  picker "rr" { type = "round-robin" }
}
worker_selection {
  prefill = "rr"
  decode  = "rr"
}
`)
	disagg := []string{"--prefill-workers", "1", "--decode-workers", "2"}
	for _, tt := range []struct {
		name    string
		args    []string
		warning string // "" for none
		row     string
	}{
		{"disaggregated, neither set", append([]string{"--policy", rrPolicy}, disagg...),
			"router: warning: " + rrPolicy + `: roles prefill and decode run the built-in default policy "default"`, "round-robin(1P:default+2D:default)"},
		{"disaggregated, decode unset", append([]string{"--policy", prefillOnly}, disagg...),
			"router: warning: " + prefillOnly + `: role decode runs the built-in default policy "default"`, "prefill-only(1P+2D:default)"},
		{"aggregated unset", []string{"--policy", prefillOnly},
			"router: warning: " + prefillOnly + `: role aggregated runs the built-in default policy "default"`, "prefill-only(default)"},
		{"disaggregated, both set", append([]string{"--policy", both}, disagg...), "", "pd(1P+2D)"},
		{"no policy file", disagg, "", "default(1P+2D)"},
		{"aggregated set", []string{"--policy", rrPolicy}, "", "round-robin"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := routerRun(t, append([]string{"replay", "--trace", arxivTrace, "--limit", "20"}, tt.args...)...)
			if code != 0 {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			if tt.warning == "" && errOut != "" {
				t.Errorf("stderr %q, want nothing", errOut)
			}
			if tt.warning != "" && (!strings.HasPrefix(errOut, tt.warning) || strings.Count(errOut, "\n") != 1) {
				t.Errorf("stderr %q, want one line starting %q", errOut, tt.warning)
			}
			if !regexpMatch(`(?m)^\s*`+regexp.QuoteMeta(tt.row)+`\s+20\s+20\s+0\s`, out) {
				t.Errorf("no table row %q:\n%s", tt.row, out)
			}
		})
	}
}

// TestReplayRejections replays five simultaneous requests on one worker
// that admits one at a time: four are rejected, the exit status is still 0,
// the table counts them and stderr names the reason.
func TestReplayRejections(t *testing.T) {
	busy := writeFile(t, "busy.hcl", `
policy "busy" {
  filter "b" {
    type                = "busy"
    max_active_requests = 1
  }
  picker "rr" { type = "round-robin" }
}
worker_selection { aggregated = "busy" }
`)
	line := `{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}` + "\n"
	tr := writeFile(t, "burst.jsonl", strings.Repeat(line, 5))
	code, out, errOut := routerRun(t, "replay", "--trace", tr, "--policy", busy, "--workers", "1")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q; rejections must not fail the run", code, errOut)
	}
	if !regexpMatch(`(?m)^\s*busy\s+5\s+1\s+4\s`, out) {
		t.Errorf("no row with 5 requests, 1 completed, 4 rejected:\n%s", out)
	}
	if want := "router: busy: 4 of 5 requests rejected; most common reason (4): " +
		`policy "busy": filter "b": all candidates filtered out` + "\n"; errOut != want {
		t.Errorf("stderr %q, want %q", errOut, want)
	}
}

func regexpMatch(pattern, s string) bool { return regexp.MustCompile(pattern).MatchString(s) }

// --prefix both replays each policy twice, NAME then NAME+precise, in one
// table with a belief column; the report is an array naming each run's
// mode and the precise run's delay. The table without --prefix has no
// belief column.
func TestReplayPrefixBoth(t *testing.T) {
	report := filepath.Join(t.TempDir(), "r.json")
	code, out, errOut := routerRun(t, "replay", "--trace", arxivTrace, "--limit", "200", "--workers", "4",
		"--prefix", "both", "--kv-event-delay", "5ms", "--report", report)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(out, "\n")
	if !strings.Contains(lines[1], " of ref  belief ") {
		t.Errorf("header %q lacks the belief column", lines[1])
	}
	if f2, f3 := strings.Fields(lines[2]), strings.Fields(lines[3]); len(f2) == 0 || f2[0] != "default" || len(f3) == 0 || f3[0] != "default+precise" {
		t.Errorf("rows %q, %q; want default then default+precise", lines[2], lines[3])
	}
	if !strings.Contains(out, "NAME+precise rows") {
		t.Errorf("legend lacks the precise rows' note:\n%s", out)
	}
	var reps []struct {
		Policy         string
		Prefix         string
		BeliefAccuracy float64 `json:"belief_accuracy"`
		KVEvents       *struct {
			DelayMs float64 `json:"delay_ms"`
			Events  int64
		} `json:"kv_events"`
	}
	b, err := os.ReadFile(report)
	if err != nil || json.Unmarshal(b, &reps) != nil || len(reps) != 2 {
		t.Fatalf("report %q, %v; want an array of two", b, err)
	}
	if reps[0].Prefix != "approximate" || reps[0].KVEvents != nil || reps[1].Prefix != "precise" ||
		reps[1].KVEvents == nil || reps[1].KVEvents.DelayMs != 5 || reps[1].KVEvents.Events == 0 || reps[1].BeliefAccuracy <= 0 {
		t.Errorf("report %s", b)
	}

	code, out, errOut = routerRun(t, "replay", "--trace", arxivTrace, "--limit", "20", "--workers", "4")
	if code != 0 || strings.Contains(out, "belief") {
		t.Errorf("default replay: exit %d, stderr %q, table mentions belief:\n%s", code, errOut, out)
	}
}

// A precise replay repeats byte for byte (scripts/replay-repeat-under-load.sh
// checks the default's the same way).
func TestReplayPrecisePerRequestRepeats(t *testing.T) {
	dir := t.TempDir()
	var sums [2]string
	for i := range sums {
		p := filepath.Join(dir, "r"+string(rune('0'+i))+".jsonl")
		if code, _, errOut := routerRun(t, "replay", "--trace", arxivTrace, "--limit", "300", "--workers", "4",
			"--prefix", "precise", "--per-request", p); code != 0 {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
		b, err := os.ReadFile(p)
		if err != nil || len(b) == 0 {
			t.Fatalf("per-request %q: %v", p, err)
		}
		sums[i] = string(b)
	}
	if sums[0] != sums[1] {
		t.Fatal("two precise replays wrote different per-request lines")
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
