package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The Python SDK's example plugin (sdk/python/examples/queue_depth.py), run
// by Debian's Python as the policy file examples/policies/python-example.hcl
// runs it. `make test` installs the Debian packages it needs
// (python3-grpcio, python3-protobuf).
const pythonBin = "/usr/bin/python3"

// pythonStart is the start_timeout the tests give a Python plugin: its
// start (importing grpc and protobuf) takes seconds on a loaded machine,
// more than the default 5 s under stress-ng.
const pythonStart = "1m"

// pythonExample returns the absolute path of the Python example plugin,
// failing the test with what to install when Debian's Python lacks the
// SDK's dependencies.
func pythonExample(t *testing.T) string {
	t.Helper()
	if out, err := exec.Command(pythonBin, "-c", "import grpc, google.protobuf").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import grpc and protobuf (run make python-deps, which installs "+
			"Debian's python3-grpcio and python3-protobuf): %v\n%s", pythonBin, err, out)
	}
	p, err := filepath.Abs("../../sdk/python/examples/queue_depth.py")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPluginsCheckPythonExample: the Python SDK's queue-depth scorer, run
// through its interpreter as a policy file runs it, passes every check of
// `router plugins check`, the same ones the Go template plugin passes.
func TestPluginsCheckPythonExample(t *testing.T) {
	code, out, errOut := routerRun(t, "plugins", "check", "--start-timeout", pythonStart, pythonBin, pythonExample(t))
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		// A busy machine may slow a call past call_timeout: a warning,
		// not a failure.
		if !strings.HasPrefix(l, "PASS ") && !strings.HasPrefix(l, "WARNING latency ") && !strings.HasPrefix(l, "WARNING health: ") && l != stdoutSkip {
			t.Errorf("line %q is not a PASS", l)
		}
	}
	for _, w := range []string{
		"PASS handshake (1 component types)", "PASS schema",
		`PASS configure "queue-depth"`, `PASS configure "queue-depth" wrong type`,
		`PASS decide "queue-depth" rows=1`, `PASS decide "queue-depth" rows=8`, `PASS decide "queue-depth" rows=4096`,
		`PASS decide "queue-depth" concurrent=32 (calls of 1 to 32 rows at once)`,
		// The Python SDK serves no go-plugin stdio service: what it
		// writes to stdout is not observable.
		stdoutSkip,
	} {
		if !strings.Contains(out, w+"\n") {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	for _, w := range []string{"PASS health (", "PASS decide batch (", "PASS decide streams=4 (", `PASS latency "queue-depth" (`, "PASS parent death ("} {
		if !strings.Contains(out, "\n"+w) {
			t.Errorf("output lacks a line starting %q:\n%s", w, out)
		}
	}
	if !shutdownPass.MatchString(out) {
		t.Errorf("output lacks a passed shutdown check:\n%s", out)
	}
}

// TestReplayPythonExampleMatchesGo: a replay through the Python example
// scorer (examples/policies/python-example.hcl) makes exactly the decisions
// of the same replay through the Go template plugin (plugin-example.hcl):
// the same scorer in two languages, byte-identical per-request outputs and
// reports, with no fallback.
func TestReplayPythonExampleMatchesGo(t *testing.T) {
	goPolicy := policyWith(t, "plugin-example.hcl", "plugin-example")
	src := string(readFile(t, filepath.Join(policyDir, "python-example.hcl")))
	pyPolicy := strings.Replace(src, `"sdk/python/examples/queue_depth.py"`, fmt.Sprintf("%q", pythonExample(t)), 1)
	if pyPolicy == src {
		t.Fatal("python-example.hcl does not run sdk/python/examples/queue_depth.py")
	}
	pyFile := writeFile(t, "python-example.hcl", pyPolicy)
	dir := t.TempDir()
	replay := func(name, policy string) (perRequest, report []byte) {
		per := filepath.Join(dir, name+".jsonl")
		rep := filepath.Join(dir, name+".json")
		code, _, errOut := routerRun(t, "replay", "--policy", policy,
			"--trace", filepath.Join(traceDir, "mooncake_arxiv_trace_first1000.jsonl"),
			"--limit", "300", "--workers", "4", "--per-request", per, "--report", rep)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", name, code, errOut)
		}
		return readFile(t, per), readFile(t, rep)
	}
	goPer, goRep := replay("go", goPolicy)
	pyPer, pyRep := replay("python", pyFile)
	if !bytes.Contains(pyRep, []byte(`"completed": 300`)) || !bytes.Contains(pyRep, []byte(`"fallbacks": 0`)) {
		t.Fatalf("python report:\n%s", pyRep)
	}
	goOut, pyOut := perRequestLines(t, goPer), perRequestLines(t, pyPer)
	if len(goOut) != 300 || len(pyOut) != 300 {
		t.Fatalf("%d and %d per-request lines, want 300", len(goOut), len(pyOut))
	}
	if diff := cmp.Diff(goOut, pyOut); diff != "" {
		t.Fatalf("per-request outcomes (-Go plugin +Python plugin):\n%s", diff)
	}
	workers := map[int]int{}
	for _, o := range goOut {
		workers[o.Worker]++
	}
	if len(workers) != 4 {
		t.Errorf("the decisions used %d of 4 workers: %v", len(workers), workers)
	}
	if !bytes.Equal(goPer, pyPer) {
		t.Error("per-request outputs differ")
	}
	// The reports differ only in the policy's name (the file's) and in
	// what the wall clock measured (wall_s and the rates per wall second).
	goSum, pySum := reportFields(t, goRep), reportFields(t, pyRep)
	if goSum["policy"] != "plugin-example" || pySum["policy"] != "python-example" {
		t.Errorf("policies %v and %v", goSum["policy"], pySum["policy"])
	}
	for _, m := range []map[string]any{goSum, pySum} {
		delete(m, "policy")
		delete(m, "wall_s")
		delete(m, "decisions_per_s")
		delete(m, "sim_requests_per_s")
	}
	if diff := cmp.Diff(goSum, pySum); diff != "" {
		t.Errorf("reports (-Go plugin +Python plugin):\n%s", diff)
	}
}

// reportFields decodes a --report file of one policy.
func reportFields(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("report: %v\n%s", err, b)
	}
	return m
}

// TestReplayPythonClassifierMatchesGo: the Python SDK's sticky-session
// classifier (sdk/python/examples/sticky_session.py), out of process in
// place of the soft-pin-repin plugin's in examples/policies/sticky-session.hcl,
// keeps every session on one worker on a generated 200-request, 20-session
// trace, with byte-identical per-request output to the Go plugin's: the
// router's Classify calls (worker lists, its clock, events_through) and the
// lifecycle events reach both the same way.
func TestReplayPythonClassifierMatchesGo(t *testing.T) {
	goPolicy := policyWith(t, "sticky-session.hcl", "soft-pin-repin")
	script, err := filepath.Abs("../../sdk/python/examples/sticky_session.py")
	if err != nil {
		t.Fatal(err)
	}
	pythonExample(t) // the Debian packages are there
	src := string(readFile(t, filepath.Join(policyDir, "sticky-session.hcl")))
	py := strings.Replace(src, `command = "bin/soft-pin-repin"`,
		fmt.Sprintf("command = %q\n  args    = [%q]\n  start_timeout = %q", pythonBin, script, pythonStart), 1)
	if py == src {
		t.Fatal(`sticky-session.hcl does not run "bin/soft-pin-repin"`)
	}
	pyPolicy := writeFile(t, "sticky-python.hcl", py)
	dir := t.TempDir()
	tr := filepath.Join(dir, "sessions.jsonl")
	sessionOf := writeSessionTrace(t, tr, 200, 20, 20)
	run := func(name, policy string) []byte {
		per := filepath.Join(dir, name+".jsonl")
		code, _, errOut := routerRun(t, "replay", "--policy", policy, "--trace", tr, "--workers", "4",
			"--per-request", per, "--fail-on-fallback")
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", name, code, errOut)
		}
		return readFile(t, per)
	}
	goPer, pyPer := run("go", goPolicy), run("python", pyPolicy)
	goOut, pyOut := perRequestLines(t, goPer), perRequestLines(t, pyPer)
	if diff := cmp.Diff(goOut, pyOut); diff != "" {
		t.Fatalf("per-request outcomes (-Go plugin +Python plugin):\n%s", diff)
	}
	if len(pyOut) != len(sessionOf) {
		t.Fatalf("%d per-request lines, want %d", len(pyOut), len(sessionOf))
	}
	workerOf := map[int]int{}
	for _, o := range pyOut {
		s := sessionOf[o.Index]
		if w, ok := workerOf[s]; ok && w != o.Worker {
			t.Fatalf("session %d went to workers %d and %d", s, w, o.Worker)
		}
		workerOf[s] = o.Worker
	}
	if !bytes.Equal(goPer, pyPer) {
		t.Error("per-request outputs differ")
	}
}

// TestPluginsCheckPythonMistakes: a Python plugin's mistakes reach the
// check's output in the SDK's words: invalid types (refused by serve()
// before the handshake) in the quoted stderr, and a scorer's wrong answer
// as the task's error naming the scorer.
func TestPluginsCheckPythonMistakes(t *testing.T) {
	sdk := filepath.Dir(filepath.Dir(pythonExample(t)))
	dir := t.TempDir()
	for i, c := range []struct{ script, want string }{
		{`sp.serve("0.1.0", [sp.TypeInfo(name="a", kind=sp.Kind.SCORER, doc="d", new=lambda i, p: None,
    params=[sp.ParamSpec("x", sp.ParamType.INT, "d"), sp.ParamSpec("x", sp.ParamType.INT, "d")])])`,
			`FAIL handshake: expected the handshake line, then a usable Describe answer, got plugin "p0.py": ` +
				`the plugin exited before completing the handshake; ` +
				`stderr: "error: invalid plugin types: type \"a\" parameter \"x\" is defined twice"`},
		{`class S:
    def score(self, req, cands):
        return None
sp.serve("0.1.0", [sp.TypeInfo(name="s", kind=sp.Kind.SCORER, doc="d", new=lambda i, p: S())])`,
			`FAIL decide "s" rows=1: expected an answer the router accepts, got the router would fall back on this decision because scorer "s": plugin "p1.py": ` +
				`plugin decide: scorer "check/s": returned None, not a sequence of numbers`},
	} {
		script := filepath.Join(dir, fmt.Sprintf("p%d.py", i))
		if err := os.WriteFile(script, []byte("import switchyard_plugin as sp\n"+c.script+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := routerRun(t, "plugins", "check", "--start-timeout", pythonStart, "--env", "PYTHONPATH="+sdk, pythonBin, script)
		if code != 1 || !slices.Contains(strings.Split(out, "\n"), c.want) {
			t.Errorf("exit %d, want 1 and the line\n%s\nstdout:\n%s\nstderr:\n%s", code, c.want, out, errOut)
		}
	}
}
