package plugintest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/plugincheck"
)

// faulty is the supervisor tests' plugin, whose SY_TEST_MODE selects a
// broken behaviour.
const faulty = "../../router/supervisor/testdata/plugin"

// TestCheckPasses: a good plugin passes Check, every check a subtest
// (t-lowest only, to keep it short).
func TestCheckPasses(t *testing.T) {
	Check(t, Build(t, faulty), Type("t-lowest"))
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
