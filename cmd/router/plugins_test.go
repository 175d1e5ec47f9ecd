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

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/replay"
)

// TestMain runs the busy-loop helper when this binary is started as one,
// else the tests, with testkit.Build's binaries shared by all of them.
func TestMain(m *testing.M) {
	if ok, err := busyLoopChild(); ok {
		if err != nil {
			fmt.Fprintln(os.Stderr, "busy-loop helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(testkit.Main(m).Run())
}

// examplePackages are the plugins examplePlugin builds, by name: the
// example plugins, from the repository's sources, so these tests run the
// real binaries a user builds, and the supervisor's test plugin
// ("faulty"), whose modes misbehave on purpose.
var examplePackages = map[string]string{
	"plugin-example":           "../plugin-example",
	"disagg-filter-score-pick": "../../examples/disagg-filter-score-pick",
	"soft-pin-repin":           "../../examples/soft-pin-repin",
	"faulty":                   "../../router/supervisor/testdata/plugin",
}

// examplePlugin returns the named plugin's binary, built once per test
// process.
func examplePlugin(t *testing.T, name string) string {
	t.Helper()
	pkg, ok := examplePackages[name]
	if !ok {
		t.Fatalf("no example plugin %q", name)
	}
	return testkit.BuildNamed(t, pkg, name)
}

// policyWith rewrites an example policy's `command = "bin/NAME"` to the
// freshly built binary and writes it to a temporary file.
func policyWith(t *testing.T, example, binName string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(policyDir, example))
	if err != nil {
		t.Fatal(err)
	}
	out := strings.Replace(string(src), `"bin/`+binName+`"`, fmt.Sprintf("%q", examplePlugin(t, binName)), 1)
	if out == string(src) {
		t.Fatalf("%s does not run bin/%s", example, binName)
	}
	return writeFile(t, example, out)
}

func TestPluginsDescribe(t *testing.T) {
	code, out, errOut := routerRun(t, "plugins", "describe", examplePlugin(t, "disagg-filter-score-pick"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"plugin version 0.1.0, API v1, component types: 4",
		`filter "min-overlap"  inputs CACHE`,
		"min_device_overlap_blocks  number  true",
		`scorer "prefill-cost"  inputs LOAD|CACHE`,
		`scorer "decode-cost"  inputs LOAD`,
		`picker "lowest-cost"  inputs none`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("describe output lacks %q:\n%s", want, out)
		}
	}
	if code, _, errOut := routerRun(t, "plugins", "describe", filepath.Join(t.TempDir(), "nope")); code != 1 || !strings.Contains(errOut, "nope") {
		t.Errorf("missing binary: exit %d, stderr %q", code, errOut)
	}
}

func TestValidateShowsOutOfProcessComponents(t *testing.T) {
	file := policyWith(t, "disagg.hcl", "disagg-filter-score-pick")
	code, out, errOut := routerRun(t, "validate", file)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		`prefill     policy "prefill"  [pipeline, inputs LOAD|CACHE]`,
		"filter overlap      type min-overlap    out-of-process (plugin pd)",
		"picker lowest       type lowest-cost    out-of-process (plugin pd)",
		`decode      policy "decode"  [pipeline, inputs LOAD]`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("validate output lacks %q:\n%s", want, out)
		}
	}
}

func TestValidateRefusesAPluginThatCannotStart(t *testing.T) {
	src := `plugin "gone" {
  command       = "/nonexistent/plugin"
  start_timeout = "2s"
}
`
	file := writeFile(t, "gone.hcl", src)
	code, _, errOut := routerRun(t, "validate", file)
	if code != 1 || !strings.Contains(errOut, file+":1:1: error: Plugin failed to start") || !strings.Contains(errOut, `"gone"`) {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	// With on_start_failure = "fallback" the file loads with a warning.
	file = writeFile(t, "gone.hcl", strings.Replace(src, "}\n", "  on_start_failure = \"fallback\"\n}\n", 1))
	code, _, errOut = routerRun(t, "validate", file)
	if code != 0 || !strings.Contains(errOut, "warning: Plugin failed to start") {
		t.Fatalf("fallback: exit %d, stderr %q", code, errOut)
	}
}

// Replay with out-of-process policies repeats byte for byte when the
// plugins are deterministic (three runs), every decision is the plugin's
// (no fallback), and each request is charged its plugin calls'
// replay_decision_latency in simulated time (decision_ms): the default
// 100 us per call, or the 2 ms the disaggregated policy's plugin block
// sets, for the prefill hop and again for the decode hop. The latency
// is in every request's queue_ms, and a replay with it set to 0s charges
// nothing.
func TestReplayWithPluginsIsDeterministic(t *testing.T) {
	tests := []struct {
		example, bin string
		latency      string // replay_decision_latency set in the plugin block; "" keeps the default
		flags        []string
		decisionMs   func(outputLength int) float64
	}{
		{"plugin-example.hcl", "plugin-example", "", []string{"--workers", "4"}, func(int) float64 { return 0.1 }},
		{"disagg.hcl", "disagg-filter-score-pick", "2ms", []string{"--prefill-workers", "2", "--decode-workers", "2"},
			func(out int) float64 {
				if out > 1 {
					return 4 // one fused call per hop
				}
				return 2
			}},
		{"soft-pin.hcl", "soft-pin-repin", "", []string{"--workers", "3"}, func(int) float64 { return 0.1 }},
	}
	for _, tt := range tests {
		t.Run(tt.example, func(t *testing.T) {
			file := policyWith(t, tt.example, tt.bin)
			if tt.latency != "" {
				setLatency(t, file, tt.latency)
			}
			dir := t.TempDir()
			replayOnce := func(name, file string) []byte {
				per := filepath.Join(dir, "per-"+name+".jsonl")
				rep := filepath.Join(dir, "rep-"+name+".json")
				args := append([]string{"replay", "--policy", file, "--trace", filepath.Join(traceDir, "mooncake_arxiv_trace_first1000.jsonl"),
					"--limit", "300", "--per-request", per, "--report", rep}, tt.flags...)
				code, _, errOut := routerRun(t, args...)
				if code != 0 {
					t.Fatalf("exit %d: %s", code, errOut)
				}
				b, err := os.ReadFile(per)
				if err != nil {
					t.Fatal(err)
				}
				r, err := os.ReadFile(rep)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Contains(r, []byte(`"completed": 300`)) || !bytes.Contains(r, []byte(`"fallbacks": 0`)) {
					t.Fatalf("report:\n%s", r)
				}
				return b
			}
			var outs [][]byte
			for i := range 3 {
				outs = append(outs, replayOnce(strconv.Itoa(i), file))
			}
			for i := 1; i < len(outs); i++ {
				if !bytes.Equal(outs[0], outs[i]) {
					t.Fatalf("replays 1 and %d with the same plugin policy differ", i+1)
				}
			}
			// The first hop reaches its worker its decision's latency
			// after arrival at the earliest: queue_ms includes it.
			first := tt.decisionMs(1)
			for i, o := range perRequestLines(t, outs[0]) {
				if want := tt.decisionMs(o.OutputLength); o.DecisionMs != want || o.QueueMs < first {
					t.Fatalf("request %d (output %d): decision_ms %v, queue_ms %v; want decision_ms %v and queue_ms >= %v",
						i, o.OutputLength, o.DecisionMs, o.QueueMs, want, first)
				}
			}
			free := filepath.Join(dir, "free.hcl")
			if err := os.WriteFile(free, readFile(t, file), 0o644); err != nil {
				t.Fatal(err)
			}
			setLatency(t, free, "0s")
			uncharged := replayOnce("free", free)
			for i, o := range perRequestLines(t, uncharged) {
				if o.DecisionMs != 0 {
					t.Fatalf("request %d: decision_ms %v with replay_decision_latency 0s", i, o.DecisionMs)
				}
			}
			if bytes.Equal(uncharged, outs[0]) {
				t.Fatal("the replay without decision latency is the same as with it")
			}
		})
	}
}

// TestReplayCompareFilesSharingAPlugin: --compare of two files that
// declare the same plugin block (two versions of one policy) runs each
// with plugin processes of its own; a Host shared by the files refused
// the second start ("already started").
func TestReplayCompareFilesSharingAPlugin(t *testing.T) {
	a := policyWith(t, "plugin-example.hcl", "plugin-example")
	src, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	b := writeFile(t, "plugin-example-copy.hcl", string(src))
	rep := filepath.Join(t.TempDir(), "rep.json")
	code, _, errOut := routerRun(t, "replay", "--compare", a+","+b, "--limit", "100", "--workers", "4", "--report", rep)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	raw, err := os.ReadFile(rep)
	if err != nil {
		t.Fatal(err)
	}
	var reports []struct {
		Policy    string `json:"policy"`
		Completed int    `json:"completed"`
		Fallbacks int64  `json:"fallbacks"`
	}
	if err := json.Unmarshal(raw, &reports); err != nil {
		t.Fatal(err)
	}
	if len(reports) != 2 || reports[0].Policy != "plugin-example" || reports[1].Policy != "plugin-example-copy" {
		t.Fatalf("reports %+v, want plugin-example and plugin-example-copy", reports)
	}
	for _, r := range reports {
		if r.Completed != 100 || r.Fallbacks != 0 {
			t.Errorf("%s: %d completed, %d fallbacks; want 100 and 0", r.Policy, r.Completed, r.Fallbacks)
		}
	}
}

// setLatency sets replay_decision_latency in the (one) plugin block of
// the policy file at path.
func setLatency(t *testing.T, path, latency string) {
	t.Helper()
	src := string(readFile(t, path))
	re := regexp.MustCompile(`(?m)^(plugin "[^"]+" \{\n)(  replay_decision_latency = "[^"]*"\n)?`)
	if len(re.FindAllStringIndex(src, -1)) != 1 {
		t.Fatalf("%s: want one plugin block:\n%s", path, src)
	}
	src = re.ReplaceAllString(src, fmt.Sprintf("${1}  replay_decision_latency = %q\n", latency))
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// perRequestLines decodes a --per-request file.
func perRequestLines(t *testing.T, b []byte) []replay.Outcome {
	t.Helper()
	var outs []replay.Outcome
	for line := range bytes.Lines(b) {
		var o replay.Outcome
		if err := json.Unmarshal(line, &o); err != nil {
			t.Fatal(err)
		}
		outs = append(outs, o)
	}
	return outs
}

// A plugin that cannot start fails the replay by default; with
// on_start_failure = "fallback" the replay runs, every decision of the
// policy that uses it is the fallback's, and the report counts them.
func TestReplayPluginDownFallsBack(t *testing.T) {
	src := `plugin "gone" {
  command          = "/nonexistent/plugin"
  start_timeout    = "2s"
  on_start_failure = "fallback"
}

policy "queue" {
  scorer "depth" {
    type = "queue-depth"
  }
  picker "pick" {
    type = "min-cost"
  }
  fallback = "round-robin"
}

worker_selection {
  aggregated = "queue"
}
`
	file := writeFile(t, "down.hcl", src)
	rep := filepath.Join(t.TempDir(), "rep.json")
	args := []string{"replay", "--policy", file, "--trace", filepath.Join(traceDir, "mooncake_arxiv_trace_first1000.jsonl"),
		"--limit", "200", "--workers", "4", "--report", rep}
	code, _, errOut := routerRun(t, args...)
	if code != 0 || !strings.Contains(errOut, "warning: Plugin failed to start") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	// stderr ends with the plugin that made the selections fall back.
	const line = `router: down: plugin "gone" made 200 of 200 selections fall back (100.0%): unavailable 200; ` +
		`first error: scorer "depth": plugin unavailable: type "queue-depth" may come from plugin "gone", which failed to start` + "\n"
	if !strings.HasSuffix(errOut, line) {
		t.Errorf("stderr does not end with %q:\n%s", line, errOut)
	}
	b, err := os.ReadFile(rep)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"completed": 200`, `"fallbacks": 200`, `"fallback_share": 1`, `"fallback_sources": [
    {
      "plugin": "gone",
      "fallbacks": 200,
      "causes": {
        "unavailable": 200
      },`, `"requests_per_worker": [
    50,
    50,
    50,
    50
  ]`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("report lacks %s:\n%s", want, b)
		}
	}
	// Without on_start_failure the same file does not replay.
	file = writeFile(t, "down.hcl", strings.Replace(src, "  on_start_failure = \"fallback\"\n", "", 1))
	if code, _, errOut := routerRun(t, append([]string{"replay", "--policy", file}, args[3:]...)...); code != 1 || !strings.Contains(errOut, "error: Plugin failed to start") {
		t.Fatalf("default on_start_failure: exit %d, stderr %q", code, errOut)
	}
}

// A replay of the bundled conversation trace through a plugin policy whose
// plugin is killed with SIGKILL part way through (it kills itself after
// 3,000 decisions) still completes every request: the fallback answers
// while the supervisor restarts the plugin, and the report counts both.
func TestReplaySurvivesPluginKill(t *testing.T) {
	dir := t.TempDir()
	bin := testkit.Build(t, "./testdata/dieafter")
	starts := filepath.Join(dir, "starts")
	src := fmt.Sprintf(`plugin "q" {
  command = %q
  env = {
    DIE_AFTER = "3000"
    STARTS    = %q
  }
}

policy "queue" {
  scorer "depth" {
    type = "queue-depth"
  }
  picker "pick" {
    type = "min-cost"
  }
}

worker_selection {
  aggregated = "queue"
}
`, bin, starts)
	file := writeFile(t, "die.hcl", src)
	rep := filepath.Join(dir, "rep.json")
	code, _, errOut := routerRun(t, "replay", "--policy", file, "--report", rep)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r struct {
		Requests       int   `json:"requests"`
		Completed      int   `json:"completed"`
		Fallbacks      int64 `json:"fallbacks"`
		PluginRestarts int64 `json:"plugin_restarts"`
	}
	b, err := os.ReadFile(rep)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.Requests != 12031 || r.Completed != 12031 || r.PluginRestarts < 1 || r.Fallbacks < 1 {
		t.Fatalf("requests %d completed %d plugin_restarts %d fallbacks %d; want 12031, 12031, >= 1, >= 1",
			r.Requests, r.Completed, r.PluginRestarts, r.Fallbacks)
	}
	// The fallbacks are the killed plugin's: its process went away during
	// a call (closed, or no answer in time), or it was restarting (then
	// maybe refused by its breaker).
	lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
	m := regexp.MustCompile(`^router: die: plugin "q" made (\d+) of 12031 selections fall back \([0-9.<]+%\): (.*); first error: .*`).FindStringSubmatch(lines[len(lines)-1])
	if m == nil || m[1] != strconv.FormatInt(r.Fallbacks, 10) || !regexp.MustCompile(`^(closed|restarting|timeout|breaker_open) \d+(, (closed|restarting|timeout|breaker_open) \d+)*$`).MatchString(m[2]) {
		t.Errorf("last stderr line %q, want plugin \"q\"'s %d fallbacks: closed, restarting, timeout, breaker_open", lines[len(lines)-1], r.Fallbacks)
	}
	if lines, _ := os.ReadFile(starts); bytes.Count(lines, []byte("\n")) < 2 {
		t.Fatalf("the plugin started %d times, want >= 2", bytes.Count(lines, []byte("\n")))
	}
	t.Logf("plugin_restarts %d, fallbacks %d", r.PluginRestarts, r.Fallbacks)
}
