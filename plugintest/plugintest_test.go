package plugintest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/plugincheck"
)

// faulty is the supervisor tests' plugin, whose SY_TEST_MODE selects a
// broken behaviour.
const faulty = "../router/supervisor/testdata/plugin"

// TestCheckPasses: a good plugin passes Check, every check a subtest
// (t-lowest only, to keep it short).
func TestCheckPasses(t *testing.T) {
	Check(t, Build(t, faulty), Type("t-lowest"))
}

// TestCheckLivePath: Check runs the production checks of `router plugins
// check` (plugincheck.Run): a scorer answering kept rows descending fails
// its decide checks with the reason routing falls back for, and its
// replay (Replay) with router replay's fallback line; one answering every
// row as kept passes both, as routing accepts it.
func TestCheckLivePath(t *testing.T) {
	bin := Build(t, faulty)
	byName := func(results []plugincheck.Result) map[string]plugincheck.Result {
		m := map[string]plugincheck.Result{}
		for _, r := range results {
			m[r.Name] = r
		}
		return m
	}
	bad := byName(run(t, bin, []Option{Env("SY_TEST_MODE", "invalid"), Env("SY_INVALID", "kept-descending"), Type("t-active"), Replay(plugincheck.BundledTrace, 20)}))
	r := &recorder{}
	report(r, bad[`decide "t-active" rows=8`])
	if want := `expected an answer the router accepts, got the router would fall back on this decision because scorer "t-active": plugin "t-active"`; len(r.errors) != 1 ||
		!strings.Contains(r.errors[0], "the router would fall back on this decision because ") || !strings.Contains(r.errors[0], "invalid answer (kept_out_of_range): kept rows [8 7 6 5 4 3 2 1]") {
		t.Errorf("kept descending, decide rows=8: reported %q, want like %q", r.errors, want)
	}
	r = &recorder{}
	report(r, bad[`replay "t-active"`])
	if len(r.errors) != 1 || !strings.Contains(r.errors[0], "made 20 of 20 selections fall back (100.0%): invalid_answer 20") {
		t.Errorf("kept descending, replay: reported %q", r.errors)
	}
	good := byName(run(t, bin, []Option{Env("SY_TEST_MODE", "invalid"), Env("SY_INVALID", "kept-all"), Type("t-active"), Replay(plugincheck.BundledTrace, 20)}))
	for _, name := range []string{`decide "t-active" rows=8`, "decide batch", `replay "t-active"`} {
		if !good[name].Pass {
			t.Errorf("every row kept, %s: %+v, want a pass", name, good[name])
		}
	}
}

// recorder is a reporter that keeps what it was told.
type recorder struct{ errors, logs, skips []string }

func (r *recorder) Skipf(format string, args ...any) {
	r.skips = append(r.skips, fmt.Sprintf(format, args...))
}

func (*recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *recorder) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

// TestCheckReportsFailures: a plugin with a bad schema and a t-active
// scorer slower than the call timeout gets the schema checks failed, with
// what was expected and what came back, and a logged warning.
func TestCheckReportsFailures(t *testing.T) {
	results := run(t, Build(t, faulty), []Option{Env("SY_TEST_MODE", "badschema"), Type("t-active"),
		Config("delay", "2ms"), CallTimeout(1)})
	byName := map[string]plugincheck.Result{}
	for _, r := range results {
		byName[r.Name] = r
	}
	r := &recorder{}
	report(r, byName[`schema type "t-max-active"`])
	if want := []string{"expected a doc, got none"}; fmt.Sprint(r.errors) != fmt.Sprint(want) {
		t.Errorf("schema check reported %q, want %q", r.errors, want)
	}
	r = &recorder{}
	report(r, byName[`latency "t-active"`])
	if len(r.errors) != 0 || len(r.logs) != 2 || !strings.HasPrefix(r.logs[0], "cold ") ||
		!strings.HasPrefix(r.logs[1], "WARNING: cold ") || !strings.Contains(r.logs[1], "over call_timeout 1ns") {
		t.Errorf("latency check reported errors %q, logs %q; want its note and a warning", r.errors, r.logs)
	}
	for _, name := range []string{"handshake", `decide "t-active" rows=4096`, "decide batch", "health", "shutdown", "parent death"} {
		if !byName[name].Pass {
			t.Errorf("check %q: %+v, want a pass", name, byName[name])
		}
	}
}

// TestCheckReportsDeath: a plugin that exits (status 3) while a boundary
// value is configured fails that check naming the exit status, and the
// checks needing the process are reported as skipped subtests.
func TestCheckReportsDeath(t *testing.T) {
	results := run(t, Build(t, faulty), []Option{Env("SY_TEST_MODE", "boundcrash"), Type("t-max-active")})
	byName := map[string]plugincheck.Result{}
	for _, r := range results {
		byName[r.Name] = r
	}
	r := &recorder{}
	report(r, byName[`configure "t-max-active" boundaries of "max"`])
	if want := `expected -9223372036854775808 accepted, or refused with a Diagnostic naming "max", got the plugin exited (exit status 3)`; fmt.Sprint(r.errors) != fmt.Sprint([]string{want}) {
		t.Errorf("boundary check reported %q, want %q", r.errors, want)
	}
	for _, name := range []string{`decide "t-max-active"`, "decide batch", "health", "shutdown"} {
		r := &recorder{}
		report(r, byName[name])
		if want := []string{"not run: the plugin exited (exit status 3)"}; fmt.Sprint(r.skips) != fmt.Sprint(want) || len(r.errors) != 0 {
			t.Errorf("check %q reported skips %q, errors %q; want %q", name, r.skips, r.errors, want)
		}
	}
}

// TestBuildInvalidatesTestCache runs `go test` in a module of its own whose
// test calls Build on its main package, which imports a package with a
// method too large to inline: a passing run is cached, and once the
// method's body changes (its export data, and so the test binary's cache
// key, does not), the next run runs the test again and fails, not a cached
// ok.
func TestBuildInvalidatesTestCache(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test three times")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	lib := func(answer string) string {
		return "package lib\n\ntype T struct{}\n\n//go:noinline\nfunc (T) Answer() string { return \"" + answer + "\" }\n"
	}
	past := time.Now().Add(-time.Hour)
	write := func(name, text string) {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		// Older than go test's 2 s cutoff, so a pass is cached.
		if err := os.Chtimes(path, past, past); err != nil {
			t.Fatal(err)
		}
		past = past.Add(time.Minute)
	}
	// The router module's replace of its nested SDK module (shared/) does
	// not apply here: this module replaces both.
	write("go.mod", "module example.com/cachetest\n\ngo 1.26.0\n\nrequire github.com/switchyard-router/switchyard v0.0.0\n\n"+
		"replace github.com/switchyard-router/switchyard => "+root+"\n\n"+
		"replace github.com/switchyard-router/switchyard/shared => "+filepath.Join(root, "shared")+"\n")
	write("go.sum", string(sum))
	write("lib/lib.go", lib("one"))
	write("main.go", "package main\n\nimport (\n\t\"fmt\"\n\n\t\"example.com/cachetest/lib\"\n)\n\nfunc main() { fmt.Print(lib.T{}.Answer()) }\n")
	write("main_test.go", `package main

import (
	"os/exec"
	"testing"

	"github.com/switchyard-router/switchyard/plugintest"
)

func TestAnswer(t *testing.T) {
	out, err := exec.Command(plugintest.Build(t, ".")).Output()
	if err != nil || string(out) != "one" {
		t.Fatalf("answer %q (%v), want \"one\"", out, err)
	}
}
`)
	goTest := func() string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), "go", "test", "-run", "TestAnswer", ".")
		cmd.Dir = dir
		// GOPROXY stays the environment's: resolving this module's graph
		// reads go.mod files (of the router's older dependencies' own
		// requirements) that building the router never fetched, so a
		// fresh module cache may not hold them (GOPROXY=off failed there).
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		out, _ := cmd.CombinedOutput()
		return string(out)
	}
	if out := goTest(); !strings.HasPrefix(out, "ok ") || strings.Contains(out, "(cached)") {
		t.Fatalf("first run: %s", out)
	}
	if out := goTest(); !strings.Contains(out, "(cached)") {
		t.Fatalf("second run, nothing changed: %s, want a cached ok", out)
	}
	write("lib/lib.go", lib("two"))
	if out := goTest(); !strings.Contains(out, `answer "two" (<nil>), want "one"`) || strings.Contains(out, "(cached)") {
		t.Fatalf("run after the method changed: %s, want the test run again and failing", out)
	}
}
