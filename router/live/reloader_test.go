package live

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/shared"
)

// rrHCL is policy "rr" (round-robin); llHCL is policy "ll" (least-loaded),
// its picker's type on line 3. Decision.Policy tells which one decided.
var rrHCL = daemonPolicy("rr")

const llHCL = `policy "ll" {
  picker "ll" {
    type = "least-loaded"
  }
}

worker_selection {
  aggregated = "ll"
}
`

const reloaderWorkers = 4 // ids 1..4

// loadedRouter loads path into a Router with workers 1..4, bookings as
// their load, its metrics on reg (nil: none), and its loader.Reloader;
// the test's cleanup closes it.
func loadedRouter(t *testing.T, path string, reg prometheus.Registerer) (*router.Router, *loader.Reloader) {
	t.Helper()
	var lo loader.LoadOptions
	b, diags := loader.LoadBundle(context.Background(), path, lo)
	if diags.HasErrors() {
		t.Fatal(config.FormatDiagnostics(diags))
	}
	r, err := router.New(router.Options{Bundle: b.Bundle, BookingsAreLoad: true, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	x, err := loader.NewReloader(r, loader.ReloadOptions{Load: lo, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := r.Close(ctx); err != nil {
			t.Errorf("closing the router: %v", err)
		}
	})
	for i := range reloaderWorkers {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Role: shared.RoleAggregated, TotalKVBlocks: 100}); err != nil {
			t.Fatal(err)
		}
	}
	return r, x
}

// selectOne places one aggregated request and releases its booking.
func selectOne(t *testing.T, r *router.Router) router.Decision {
	t.Helper()
	d, err := r.Place(context.Background(), &shared.Request{Role: shared.RoleAggregated, PromptTokens: 1024}, router.Placement{})
	if err != nil {
		t.Fatal(err)
	}
	d.Booking.Release()
	return d
}

// assertRoundRobin checks that policy rr decides, on the hosted path, and
// that two rounds of decisions go round the workers in order.
func assertRoundRobin(t *testing.T, r *router.Router) {
	t.Helper()
	var ids []shared.WorkerID
	for range 2 * reloaderWorkers {
		d := selectOne(t, r)
		if d.Policy != "rr" || !d.Hosted {
			t.Fatalf("decision by policy %q (hosted %v), want rr on the hosted path", d.Policy, d.Hosted)
		}
		ids = append(ids, d.Worker.ID)
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] != ids[i-1]%reloaderWorkers+1 {
			t.Fatalf("not round-robin order: %v", ids)
		}
	}
}

// assertDiagAt checks that diags has an error at path:line, formatted as
// path:line:col.
func assertDiagAt(t *testing.T, diags hcl.Diagnostics, path string, line int) {
	t.Helper()
	for _, d := range diags {
		if d.Severity == hcl.DiagError && d.Subject != nil && d.Subject.Filename == path && d.Subject.Start.Line == line && d.Subject.Start.Column > 0 {
			if txt := config.FormatDiagnostics(diags); !strings.Contains(txt, fmt.Sprintf("%s:%d:%d: error: ", path, line, d.Subject.Start.Column)) {
				t.Fatalf("formatted diagnostics lack file:line:col:\n%s", txt)
			}
			return
		}
	}
	t.Fatalf("no error at %s:%d:\n%s", path, line, config.FormatDiagnostics(diags))
}

// reloaderFor runs a Reloader of x until the test ends and returns the
// diagnostics of each reload it makes.
func reloaderFor(t *testing.T, x *loader.Reloader, o ReloaderOptions) (*Reloader, <-chan hcl.Diagnostics) {
	t.Helper()
	results := make(chan hcl.Diagnostics, 16)
	o.OnReload = func(d hcl.Diagnostics) { results <- d }
	rl, err := NewReloader(x, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-rl.Ready():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	return rl, results
}

func nextReload(t *testing.T, results <-chan hcl.Diagnostics) hcl.Diagnostics {
	t.Helper()
	select {
	case d := <-results:
		return d
	case <-time.After(time.Minute):
		t.Fatal("no reload within a minute")
		return nil
	}
}

func noReload(t *testing.T, results <-chan hcl.Diagnostics, wait time.Duration) {
	t.Helper()
	select {
	case d := <-results:
		t.Fatalf("unexpected reload: %s", config.FormatDiagnostics(d))
	case <-time.After(wait):
	}
}

// assertReloads checks switchyard_policy_reloads_total on reg.
func assertReloads(t *testing.T, reg prometheus.Gatherer, success, failure int) {
	t.Helper()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(fmt.Sprintf(`
# HELP switchyard_policy_reloads_total Policy file reloads by result: success (the new policies decide) or failure (the running ones stay).
# TYPE switchyard_policy_reloads_total counter
switchyard_policy_reloads_total{result="failure"} %d
switchyard_policy_reloads_total{result="success"} %d
`, failure, success)), "switchyard_policy_reloads_total"); err != nil {
		t.Fatal(err)
	}
}

func TestReloaderSignalChannel(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.hcl")
	replaceFile(t, path, rrHCL)
	r, x := loadedRouter(t, path, nil)
	sigs := make(chan os.Signal, 1)
	_, results := reloaderFor(t, x, ReloaderOptions{Path: path, Signals: sigs})

	replaceFile(t, path, llHCL)
	noReload(t, results, 300*time.Millisecond) // no watch: a write alone reloads nothing
	assertRoundRobin(t, r)
	sigs <- syscall.SIGHUP
	if d := nextReload(t, results); d.HasErrors() {
		t.Fatal(config.FormatDiagnostics(d))
	}
	if d := selectOne(t, r); d.Policy != "ll" {
		t.Fatalf("after SIGHUP: %q", d.Policy)
	}
}

func TestReloaderSIGHUPAndTrigger(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.hcl")
	replaceFile(t, path, rrHCL)
	r, x := loadedRouter(t, path, nil)
	rl, results := reloaderFor(t, x, ReloaderOptions{Path: path})

	replaceFile(t, path, llHCL)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if d := nextReload(t, results); d.HasErrors() {
		t.Fatal(config.FormatDiagnostics(d))
	}
	if d := selectOne(t, r); d.Policy != "ll" {
		t.Fatalf("after SIGHUP: %q", d.Policy)
	}

	replaceFile(t, path, rrHCL)
	rl.Trigger()
	if d := nextReload(t, results); d.HasErrors() {
		t.Fatal(config.FormatDiagnostics(d))
	}
	assertRoundRobin(t, r)
}

func TestReloaderWatch(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.hcl")
	replaceFile(t, path, rrHCL)
	reg := prometheus.NewRegistry()
	r, x := loadedRouter(t, path, reg)
	_, results := reloaderFor(t, x, ReloaderOptions{Path: path, Watch: true})

	// Replaced by rename, as editors do.
	replaceFile(t, path, llHCL)
	if d := nextReload(t, results); d.HasErrors() {
		t.Fatal(config.FormatDiagnostics(d))
	}
	if d := selectOne(t, r); d.Policy != "ll" {
		t.Fatalf("after the rename: %q", d.Policy)
	}
	noReload(t, results, 300*time.Millisecond)

	// A burst of in-place writes ending invalid: the last reload fails and
	// changes nothing.
	for i := range 5 {
		content := llHCL
		if i == 4 {
			content = strings.ReplaceAll(llHCL, "least-loaded", "least-loadedd")
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Usually one reload; a machine slow enough to space two writes by the
	// debounce makes more, of the valid content, before the failing one.
	extra := 0
	d := nextReload(t, results)
	for ; !d.HasErrors() && extra < 4; extra++ {
		d = nextReload(t, results)
	}
	assertDiagAt(t, d, path, 3)
	noReload(t, results, 300*time.Millisecond)
	if d := selectOne(t, r); d.Policy != "ll" {
		t.Fatalf("after the invalid write: %q", d.Policy)
	}

	// Other files in the directory are not the policy file.
	if err := os.WriteFile(filepath.Join(dir, "other.hcl"), []byte(rrHCL), 0o644); err != nil {
		t.Fatal(err)
	}
	noReload(t, results, 300*time.Millisecond)

	if err := os.WriteFile(path, []byte(rrHCL), 0o644); err != nil {
		t.Fatal(err)
	}
	if d := nextReload(t, results); d.HasErrors() {
		t.Fatal(config.FormatDiagnostics(d))
	}
	assertRoundRobin(t, r)
	assertReloads(t, reg, 2+extra, 1)
}

// A Kubernetes ConfigMap update (kubelet's AtomicWriter) never names the
// mounted file: policy.hcl -> ..data/policy.hcl, ..data -> a timestamped
// directory, and the update renames a new ..data_tmp symlink over ..data.
// With Watch it reloads once, into the new content.
func TestReloaderWatchConfigMap(t *testing.T) {
	dir := t.TempDir()
	mount := func(ts, content string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ts, "policy.hcl"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mount("..2026_a", rrHCL)
	if err := os.Symlink("..2026_a", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "policy.hcl")
	if err := os.Symlink(filepath.Join("..data", "policy.hcl"), path); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	r, x := loadedRouter(t, path, reg)
	_, results := reloaderFor(t, x, ReloaderOptions{Path: path, Watch: true})
	assertRoundRobin(t, r)

	mount("..2026_b", llHCL)
	if err := os.Symlink("..2026_b", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..2026_a")); err != nil {
		t.Fatal(err)
	}
	if d := nextReload(t, results); d.HasErrors() {
		t.Fatal(config.FormatDiagnostics(d))
	}
	if d := selectOne(t, r); d.Policy != "ll" {
		t.Fatalf("after the ..data swap: %q", d.Policy)
	}
	noReload(t, results, 300*time.Millisecond)
	assertReloads(t, reg, 1, 0)
}
