package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/replay"
	"github.com/switchyard-router/switchyard/router/trace"
)

// Bad sweep flags are usage errors that say what is wanted.
func TestReplaySweepFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--workers", "4,0"}, "--workers 0: want a whole number from 1 to 4096"},
		{[]string{"--workers", "4,4"}, "--workers: 4 is listed twice"},
		{[]string{"--workers", "4,x"}, "--workers 4,x: want whole numbers from 1 to 4096, comma-separated"},
		{[]string{"--prefill-workers", "2,4000", "--decode-workers", "100"}, "--prefill-workers 4000 + --decode-workers 100 = 4100 simulated workers"},
		{[]string{"--seeds", "0"}, "--seeds 0: want a whole number from 1 to 100"},
		{[]string{"--workers", "2,4", "--per-request", "x.jsonl"}, "--per-request writes the lines of one run"},
		{[]string{"--seeds", "2", "--per-request", "x.jsonl"}, "--per-request writes the lines of one run"},
		{[]string{"--baseline", "rr"}, `--baseline rr: "rr" is not a replayed policy; want one of default`},
		{[]string{"--baseline", "default:ttft_p95"}, `--baseline default:ttft_p95: unknown column "ttft_p95"`},
		{[]string{"--columns", "ttft_p90,nope"}, `--columns ttft_p90,nope: unknown column "nope"`},
		{[]string{"--slo", "ttft=fast"}, `--slo entry "ttft=fast": want a duration > 0`},
		{[]string{"--slo", ""}, "--slo \"\": want targets such as ttft=500ms"},
		{[]string{"--report", "-", "--html", "-"}, "cannot write to standard output together"},
		{[]string{"--goodput-target", "95"}, "--goodput-target needs --slo"},
		{[]string{"--slo", "ttft=1s", "--goodput-target", "0"}, "--goodput-target 0: want a percent above 0 and at most 100"},
		{[]string{"--slo", "ttft=1s", "--goodput-target", "101%"}, "--goodput-target 101%: want a percent"},
		{[]string{"--slo", "ttft=1s", "--goodput-target", "NaN"}, "--goodput-target NaN: want a percent"},
		// Two files of one name make two rows of one label: which is the baseline?
		{[]string{"--compare", rrPolicy + "," + rrPolicy, "--baseline", "round-robin"},
			"--baseline round-robin: 2 --compare files are labelled round-robin"},
	} {
		code, _, errOut := runRouter(append([]string{"replay"}, c.args...)...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errOut, c.want)
		}
	}
}

// --html writes the report page (drawn by router/replay/htmlreport, whose
// own tests render it in Chromium) with every row and the command line,
// and says where; the table and --report are as without it but for the
// report's timeline and distributions.
func TestReplayHTML(t *testing.T) {
	dir := t.TempDir()
	page, withHTML, without := filepath.Join(dir, "r.html"), filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	arxiv := filepath.Join("..", "..", "testdata", "traces", "mooncake_arxiv_trace_first1000.jsonl")
	args := []string{"replay", "--trace", arxiv, "--limit", "200", "--workers", "2,3"}
	code, out, errOut := runRouter(append(args, "--html", page, "--report", withHTML)...)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if !strings.Contains(errOut, "router: wrote the HTML report to "+page+"\n") {
		t.Errorf("stderr %q does not say where the report went", errOut)
	}
	code, out2, errOut := runRouter(append(args, "--report", without)...)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if out != out2 {
		t.Errorf("the table differs with --html:\n%s\n%s", out, out2)
	}
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	html := string(b)
	for _, s := range []string{"<!DOCTYPE html>", "router replay --html " + page, "<svg", "TTFT CDF, 2 workers", "TTFT CDF, 3 workers"} {
		if !strings.Contains(html, s) {
			t.Errorf("the page lacks %q", s)
		}
	}
	// (The SVG's xmlns URIs name namespaces; they are not fetched.)
	for _, s := range []string{`src="http`, `href="http`, "url(http", "<script src", "<link", "@import"} {
		if strings.Contains(html, s) {
			t.Errorf("the page has %q: it must fetch nothing", s)
		}
	}
	var a, c []map[string]any
	for path, v := range map[string]*[]map[string]any{withHTML: &a, without: &c} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatal(err)
		}
	}
	for i := range a {
		if a[i]["timeline"] == nil || a[i]["distributions"] == nil || c[i]["timeline"] != nil {
			t.Errorf("run %d: timeline in the report with --html %v, without %v", i, a[i]["timeline"] != nil, c[i]["timeline"] != nil)
		}
		for _, k := range []string{"timeline", "distributions", "wall_s", "decisions_per_s", "sim_requests_per_s"} {
			delete(a[i], k)
			delete(c[i], k)
		}
		ja, _ := json.Marshal(a[i])
		jc, _ := json.Marshal(c[i])
		if string(ja) != string(jc) {
			t.Errorf("run %d: the report differs with --html:\n%s\n%s", i, ja, jc)
		}
	}
}

// The command line the HTML report shows runs as written: a boolean flag
// is --name (not "--name true", which replay would refuse as an
// argument), and a value the shell would split or redirect is quoted.
func TestReplayCommandLine(t *testing.T) {
	cmd := newReplayCmd()
	if err := cmd.ParseFlags([]string{"--quiet", "--compare", "a<b>.hcl,it's.hcl", "--workers", "2,3", "--fail-on-fallback=false",
		"--html", "my report.html"}); err != nil {
		t.Fatal(err)
	}
	want := `replay --compare 'a<b>.hcl,it'\''s.hcl' --fail-on-fallback=false --html 'my report.html' --quiet --workers 2,3`
	if got := commandLine(cmd); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// The line above the table names the trace, its requests, the fleets, the
// router replicas and the seeds.
func TestReplayHeaderLine(t *testing.T) {
	tr := &trace.Opened{Name: "mooncake_arxiv_trace_first1000.jsonl", Requests: 300}
	for _, tt := range []struct {
		f      replayFlags
		fleets []replay.Fleet
		want   string
	}{
		{replayFlags{replicas: 1, seeds: 1}, []replay.Fleet{{Workers: 4}}, "trace mooncake_arxiv_trace_first1000.jsonl: 300 requests on 4 simulated workers"},
		{replayFlags{replicas: 1, seeds: 2}, []replay.Fleet{{Workers: 2}, {Workers: 4}},
			"trace mooncake_arxiv_trace_first1000.jsonl: 300 requests on 2 and 4 simulated workers; each cell run with 2 seeds (every seed of the policy + 0 to 1)"},
		{replayFlags{replicas: 3, seeds: 1, syncDelays: []time.Duration{0, time.Second}}, []replay.Fleet{{Workers: 2}, {Workers: 4}},
			"trace mooncake_arxiv_trace_first1000.jsonl: 300 requests on 2 and 4 simulated workers; 3 router replicas, sync delay 0s and 1s"},
		{replayFlags{replicas: 1, seeds: 1}, []replay.Fleet{{Prefill: 2, Decode: 4}}, "trace mooncake_arxiv_trace_first1000.jsonl: 300 requests on 2 prefill + 4 decode simulated workers"},
		{replayFlags{replicas: 1, seeds: 1}, []replay.Fleet{{Workers: 1}}, "trace mooncake_arxiv_trace_first1000.jsonl: 300 requests on 1 simulated worker"},
	} {
		if got := tt.f.headerLine(tr, tt.fleets); got != tt.want {
			t.Errorf("got  %s\nwant %s", got, tt.want)
		}
	}
}
