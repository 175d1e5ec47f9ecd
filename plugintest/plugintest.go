// Package plugintest runs the conformance checks of `router plugins check`
// (docs/plugin-protocol.md, section 9) on a plugin binary from a Go test,
// so that `go test` checks a plugin as the router will run it:
//
//	func TestConformance(t *testing.T) {
//		bin := plugintest.Build(t, ".") // this directory's main package
//		plugintest.Check(t, bin, plugintest.Config("max_active_requests", "4"))
//	}
//
// Check starts the binary as the router does and reports every check as a
// subtest: a failed check says what was expected and what came back; a
// check's measurements (latency) and warnings are logged.
//
// One check, parent death, needs a parent process it can kill: it runs the
// test binary itself again as the plugin's parent (package
// router/plugincheck takes over a process started with
// plugincheck.ParentEnv set, before TestMain runs), so nothing else has to
// be built or installed.
//
// The package lives in the router module, not in the SDK module (shared),
// because it runs the router's own checker (router/plugincheck, which
// starts the plugin with router/supervisor) and reads parameters as a
// policy file does (router/config). A plugin whose tests import it
// therefore requires the router module as well as the SDK, and its go.mod
// selects versions among the router's dependencies too; a plugin that wants
// a go.mod of the SDK's dependencies only runs `router plugins check` in
// its CI instead (the same checks; docs/sdk.md).
package plugintest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/plugincheck"
	"github.com/switchyard-router/switchyard/shared"
)

// An Option changes what Check checks or how it starts the plugin.
type Option func(*plugincheck.Options)

// Config gives parameter param the value value (parsed as its declared
// type, as in a policy file: "4", "2.5", "true", "10s") for every checked
// type that declares it. Required parameters need one.
func Config(param, value string) Option {
	return func(o *plugincheck.Options) {
		if o.Config == nil {
			o.Config = map[string]string{}
		}
		o.Config[param] = value
	}
}

// Type checks only the component type of that name.
func Type(name string) Option { return func(o *plugincheck.Options) { o.Type = name } }

// Role configures the instances for role (default shared.RoleAggregated);
// a disaggregated plugin is checked with shared.RolePrefill or
// shared.RoleDecode.
func Role(role shared.Role) Option { return func(o *plugincheck.Options) { o.Role = role } }

// Env sets a variable of the plugin's environment, as a plugin block's env
// does; the plugin gets no other variable of the test's environment.
func Env(name, value string) Option {
	return func(o *plugincheck.Options) {
		if o.Plugin.Env == nil {
			o.Plugin.Env = map[string]string{}
		}
		o.Plugin.Env[name] = value
	}
}

// Args are the plugin's arguments, as a plugin block's args.
func Args(args ...string) Option { return func(o *plugincheck.Options) { o.Plugin.Args = args } }

// CallTimeout is the call_timeout call latency is compared with (default
// 20ms, the router's): a call over it is logged as a warning, never a
// failure.
func CallTimeout(d time.Duration) Option { return func(o *plugincheck.Options) { o.CallTimeout = d } }

// Replay also replays each filter, scorer and picker type on trace (a file
// `router replay` reads, or plugincheck.BundledTrace) for its first limit
// requests (0: plugincheck.DefaultReplayLimit), with `router replay
// --fail-on-fallback`'s rule: a replay in which any selection fell back
// fails, naming the plugin and the cause.
func Replay(trace string, limit int) Option {
	return func(o *plugincheck.Options) { o.Replay, o.ReplayLimit = trace, limit }
}

// Check starts binary as the router does and runs every check of
// `router plugins check` on it, each as a subtest of t named after the
// check; a check not run (after the plugin process went, or stdout that
// cannot be observed) is a skipped subtest. The plugin's stderr lines at
// warn and above are logged. Check
// returns once the plugin and every process it started are stopped.
func Check(t *testing.T, binary string, opts ...Option) {
	t.Helper()
	for _, r := range run(t, binary, opts) {
		t.Run(r.Name, func(t *testing.T) {
			t.Helper()
			report(t, r)
		})
	}
}

// run runs the checks, logging the plugin's stderr to t while they run.
func run(t testing.TB, binary string, opts []Option) []plugincheck.Result {
	t.Helper()
	o := plugincheck.Options{Plugin: config.Plugin{Name: filepath.Base(binary), Command: binary}}
	for _, opt := range opts {
		opt(&o)
	}
	w := &testWriter{t: t}
	defer w.stop()
	o.Logger = hclog.New(&hclog.LoggerOptions{Name: "plugintest", Level: hclog.Warn, Output: w})
	return plugincheck.Run(t.Context(), o)
}

// reporter is what report needs of a *testing.T.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
	Skipf(format string, args ...any)
}

// report reports one check's result on t: an error for a failure, a skip
// for a check not run (the plugin process gone, stdout not observable),
// logs for a note or a warning.
func report(t reporter, r plugincheck.Result) {
	t.Helper()
	switch {
	case r.Skipped:
		t.Skipf("%s", r.Note)
	case !r.Pass:
		t.Errorf("expected %s, got %s", r.Expected, r.Got)
	case r.Note != "":
		t.Logf("%s", r.Note)
	}
	if r.Pass && r.Warning != "" {
		t.Logf("WARNING: %s", r.Warning)
	}
}

// testWriter logs what it is given on t until stop.
type testWriter struct {
	mu      sync.Mutex
	t       testing.TB
	stopped bool
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.t.Logf("%s", b)
	}
	return len(b), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
}

// Build builds the main package pkg (a directory such as ".", or an import
// path) with `go build` into a temporary directory removed after the test,
// and returns the binary's path. A failed build fails the test at once,
// with the compiler's output.
//
// go test caches a passing result keyed on the test binary and on the files
// the test itself opened or stat'ed; a child `go build` is invisible to it,
// and a change to a method body of a package the test imports can leave the
// test binary's key unchanged. So Build first stats every source file of pkg
// and of its dependencies in the main module (or in a directory a replace
// directive points at), and the module's go.mod: a change to any of them
// makes the next `go test` run the checks again rather than print a cached
// ok.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	if err := statSources(t.Context(), pkg); err != nil {
		t.Fatalf("listing the sources of %s: %v", pkg, err)
	}
	bin := filepath.Join(t.TempDir(), "plugin")
	if out, err := exec.CommandContext(t.Context(), "go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// localSources prints, for each package `go list -deps` lists that comes
// from a main module or a directory replacement, its directory, a tab and
// one source file name, a line each; and each such module's go.mod.
const localSources = `{{if .Module}}{{if or .Module.Main (and .Module.Replace (not .Module.Replace.Version))}}` +
	`{{range .GoFiles}}{{$.Dir}}{{"\t"}}{{.}}{{"\n"}}{{end}}` +
	`{{range .CgoFiles}}{{$.Dir}}{{"\t"}}{{.}}{{"\n"}}{{end}}` +
	`{{range .CFiles}}{{$.Dir}}{{"\t"}}{{.}}{{"\n"}}{{end}}` +
	`{{range .HFiles}}{{$.Dir}}{{"\t"}}{{.}}{{"\n"}}{{end}}` +
	`{{range .SFiles}}{{$.Dir}}{{"\t"}}{{.}}{{"\n"}}{{end}}` +
	`{{range .EmbedFiles}}{{$.Dir}}{{"\t"}}{{.}}{{"\n"}}{{end}}` +
	`{{with .Module.GoMod}}{{.}}{{"\n"}}{{end}}{{end}}{{end}}`

// statSources stats the files localSources lists for pkg, so that go
// test's cache (which records the files a test stats) notices a change to
// any of them. A file that cannot be stat'ed is left to `go build` to
// report.
func statSources(ctx context.Context, pkg string) error {
	cmd := exec.CommandContext(ctx, "go", "list", "-deps", "-f", localSources, pkg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("go list: %w\n%s", err, stderr.Bytes())
	}
	seen := map[string]bool{}
	for line := range strings.Lines(string(out)) {
		line = strings.TrimSuffix(line, "\n")
		if dir, file, ok := strings.Cut(line, "\t"); ok {
			line = filepath.Join(dir, file)
		}
		if line == "" || seen[line] {
			continue
		}
		seen[line] = true
		_, _ = os.Stat(line)
	}
	return nil
}
