package loader

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/shared"
)

// pluginBin is cmd/plugin-example, built by TestMain.
var pluginBin string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "router-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	pluginBin = filepath.Join(dir, "plugin-example")
	if out, err := exec.Command("go", "build", "-o", pluginBin, "../../cmd/plugin-example").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building cmd/plugin-example: %v\n%s", err, out)
		return 1
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	return code
}

// highestID picks the last candidate: candidates come in ascending
// WorkerID order, so it always picks the highest worker id, a policy whose
// decisions are told apart from round-robin's at a glance.
type highestID struct{}

func (highestID) Inputs() shared.Inputs { return 0 }
func (highestID) Pick(_ context.Context, _ *shared.Request, c *shared.Candidates) (int, error) {
	return len(c.IDs) - 1, nil
}

// tracked is a highestID that counts its instances and their Close calls.
type tracked struct {
	highestID
	closes *atomic.Int64
}

func (t *tracked) Close() error { t.closes.Add(1); return nil }

var trackedNew, trackedClosed atomic.Int64

// testCatalog is the built-in catalog plus highest-id and tracked pickers.
func testCatalog(t *testing.T) *catalog.Catalog {
	t.Helper()
	cat := catalog.Default()
	for _, ti := range []shared.TypeInfo{
		{Name: "highest-id", Kind: shared.KindPicker, New: func(shared.InstanceInfo, shared.Params) (shared.Component, error) {
			return highestID{}, nil
		}},
		{Name: "tracked", Kind: shared.KindPicker, New: func(shared.InstanceInfo, shared.Params) (shared.Component, error) {
			trackedNew.Add(1)
			return &tracked{closes: &trackedClosed}, nil
		}},
	} {
		if err := cat.Register(catalog.SourceBuiltin, ti); err != nil {
			t.Fatal(err)
		}
	}
	return cat
}

const rrHCL = `policy "rr" {
  picker "rr" {
    type = "round-robin"
  }
}

worker_selection {
  aggregated = "rr"
}
`

// invalidHCL is rrHCL with a typo in the picker's type (line 3).
const invalidHCL = `policy "rr" {
  picker "rr" {
    type = "round-robbin"
  }
}

worker_selection {
  aggregated = "rr"
}
`

const topHCL = `policy "top" {
  picker "top" {
    type = "highest-id"
  }
}

worker_selection {
  aggregated = "top"
}
`

// pluginHCL uses cmd/plugin-example's queue-depth scorer; call_timeout is
// generous so that no decision falls back under -race on a busy machine.
func pluginHCL(scorerType string) string {
	return fmt.Sprintf(`plugin "example" {
  command      = %q
  call_timeout = "5s"
}

policy "queue" {
  scorer "depth" {
    type = %q
  }
  picker "pick" {
    type = "min-cost"
  }
}

worker_selection {
  aggregated = "queue"
}
`, pluginBin, scorerType)
}

const workers = 4 // ids 1..4

// writeFile replaces path's content the way editors do: a temporary file
// renamed over it.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// loadedRouter loads path into a Router with workers 1..4 that Cleanup
// closes, and returns it with its Reloader.
func loadedRouter(t *testing.T, path string, reg prometheus.Registerer) (*router.Router, *Reloader) {
	t.Helper()
	lo := LoadOptions{Catalog: testCatalog(t)}
	b, diags := LoadBundle(context.Background(), path, lo)
	if diags.HasErrors() {
		t.Fatal(config.FormatDiagnostics(diags))
	}
	r, err := router.New(router.Options{Bundle: b.Bundle, BookingsAreLoad: true, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	x, err := NewReloader(r, ReloadOptions{Load: lo, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Close(ctx); err != nil {
			t.Errorf("closing the router: %v", err)
		}
	})
	addWorkers(t, r)
	return r, x
}

func addWorkers(t *testing.T, r *router.Router) {
	t.Helper()
	for i := range workers {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Role: shared.RoleAggregated, TotalKVBlocks: 100}); err != nil {
			t.Fatal(err)
		}
	}
}

func selectOne(t *testing.T, r *router.Router) router.Decision {
	t.Helper()
	d, err := r.Place(context.Background(), &shared.Request{Role: shared.RoleAggregated, PromptTokens: 1024}, router.Placement{})
	if err != nil {
		t.Fatal(err)
	}
	d.Booking.Release()
	return d
}

// load is 8 goroutines selecting in a loop, releasing each booking at once.
// check judges each decision given the phase read before it started (or,
// when the phase changed meanwhile, any phase it spanned): 0
// before the invalid reload, 1 after it, 2 during the valid reload (either
// policy may decide), 3 once the valid reload returned.
type load struct {
	stop      chan struct{}
	wg        sync.WaitGroup
	pause     sync.RWMutex // Lock pauses the load
	phase     atomic.Int32
	decisions [4]atomic.Int64 // per phase
	mu        sync.Mutex
	errs      []error // Select errors and check failures, the first 10
	nerrs     atomic.Int64
	once      sync.Once
}

func startLoad(r *router.Router, check func(phase int32, d router.Decision) error) *load {
	l := &load{stop: make(chan struct{})}
	for g := range 8 {
		l.wg.Go(func() {
			req := shared.Request{Role: shared.RoleAggregated, PromptTokens: 100 + g}
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				l.pause.RLock()
				ph := l.phase.Load()
				r2 := req
				d, err := r.Place(context.Background(), &r2, router.Placement{})
				if err == nil {
					d.Booking.PrefillDone()
					d.Booking.Release()
					err = check(ph, d)
					// A selection that spans a phase change may follow
					// any phase it saw.
					for p := ph + 1; err != nil && p <= l.phase.Load(); p++ {
						if check(p, d) == nil {
							err = nil
						}
					}
					l.decisions[ph].Add(1)
				}
				l.pause.RUnlock()
				if err != nil {
					l.nerrs.Add(1)
					l.mu.Lock()
					if len(l.errs) < 10 {
						l.errs = append(l.errs, fmt.Errorf("phase %d: %w", ph, err))
					}
					l.mu.Unlock()
				}
			}
		})
	}
	return l
}

// finish stops the load and fails t on any error it saw; later calls do
// nothing.
func (l *load) finish(t *testing.T) {
	t.Helper()
	l.once.Do(func() {
		close(l.stop)
		l.wg.Wait()
		if n := l.nerrs.Load(); n > 0 {
			t.Errorf("%d decisions failed under load, first ones: %v", n, errors.Join(l.errs...))
		}
	})
}

// waitDecisions lets the load make at least n more decisions in phase ph.
func (l *load) waitDecisions(t *testing.T, ph int32, n int64) {
	t.Helper()
	want := l.decisions[ph].Load() + n
	deadline := time.Now().Add(time.Minute)
	for l.decisions[ph].Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("phase %d: only %d decisions in a minute", ph, l.decisions[ph].Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// assertRoundRobin makes 2n decisions alone (the load paused) and checks
// they visit the workers in cyclic order.
func assertRoundRobin(t *testing.T, r *router.Router, l *load) {
	t.Helper()
	if l != nil {
		l.pause.Lock()
		defer l.pause.Unlock()
	}
	var ids []shared.WorkerID
	for range 2 * workers {
		d := selectOne(t, r)
		if d.Policy != "rr" || !d.Hosted {
			t.Fatalf("decision by policy %q (hosted %v), want rr on the hosted path", d.Policy, d.Hosted)
		}
		ids = append(ids, d.Worker.ID)
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] != ids[i-1]%workers+1 {
			t.Fatalf("not round-robin order: %v", ids)
		}
	}
}

// assertDiagAt checks that diags has an error at path:line.
func assertDiagAt(t *testing.T, diags hcl.Diagnostics, path string, line int) {
	t.Helper()
	if !diags.HasErrors() {
		t.Fatalf("no error for the invalid file; diagnostics: %v", diags)
	}
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

// hostClosed reports whether h was shut down: Start refuses to launch.
func hostClosed(h *supervisor.Host) bool {
	_, err := h.Start(context.Background(), config.Plugin{Name: "probe", Command: "/nonexistent"})
	return errors.Is(err, supervisor.ErrHostClosed)
}

// The fault-matrix row: the policy file is edited to an invalid state, then
// to a valid new policy, while 8 goroutines make decisions. The invalid
// edit changes nothing, the valid one takes effect, no decision fails, and
// the old bundle is drained and its Host shut down.
func TestReloadUnderLoadInvalidThenValid(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.hcl")
	writeFile(t, path, rrHCL)
	reg := prometheus.NewRegistry()
	r, x := loadedRouter(t, path, reg)
	b0 := Current(r)
	assertRoundRobin(t, r, nil)

	l := startLoad(r, func(ph int32, d router.Decision) error {
		switch {
		case ph <= 1 && d.Policy != "rr":
			return fmt.Errorf("decided by %q, want rr", d.Policy)
		case ph == 2 && d.Policy != "rr" && d.Policy != "top":
			return fmt.Errorf("decided by %q, want rr or top", d.Policy)
		case ph == 3 && (d.Policy != "top" || d.Worker.ID != workers):
			return fmt.Errorf("decided by %q for worker %d, want top for worker %d", d.Policy, d.Worker.ID, workers)
		}
		return nil
	})
	defer l.finish(t)
	l.waitDecisions(t, 0, 1000)

	// Invalid edit: diagnostics at file:line:col, nothing else changes.
	writeFile(t, path, invalidHCL)
	diags := x.Reload(context.Background(), path)
	assertDiagAt(t, diags, path, 3)
	if Current(r) != b0 {
		t.Fatal("a failed reload replaced the running bundle")
	}
	l.phase.Store(1)
	l.waitDecisions(t, 1, 1000)
	assertRoundRobin(t, r, l)

	// Valid new policy: it takes effect; the old bundle drains and stops.
	writeFile(t, path, topHCL)
	l.phase.Store(2)
	if diags := x.Reload(context.Background(), path); diags.HasErrors() {
		t.Fatal(config.FormatDiagnostics(diags))
	}
	l.phase.Store(3)
	if Current(r) == b0 {
		t.Fatal("the reload did not apply the new bundle")
	}
	if n := b0.InFlight(); n != 0 {
		t.Errorf("old bundle still has %d decisions in flight after the reload", n)
	}
	if !hostClosed(b0.host) {
		t.Error("old bundle's Host still runs after the reload")
	}
	l.waitDecisions(t, 3, 1000)
	l.finish(t)
	t.Logf("decisions per phase (before, after the invalid edit, during and after the valid reload): %d %d %d %d",
		l.decisions[0].Load(), l.decisions[1].Load(), l.decisions[2].Load(), l.decisions[3].Load())

	if d := selectOne(t, r); d.Policy != "top" || d.Worker.ID != workers {
		t.Fatalf("after the reload: policy %q, worker %d; want top, %d", d.Policy, d.Worker.ID, workers)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP switchyard_policy_reloads_total Policy file reloads by result: success (the new policies decide) or failure (the running ones stay).
# TYPE switchyard_policy_reloads_total counter
switchyard_policy_reloads_total{result="failure"} 1
switchyard_policy_reloads_total{result="success"} 1
`), "switchyard_policy_reloads_total"); err != nil {
		t.Fatal(err)
	}
}

// pluginPIDs lists the running processes of pluginBin.
func pluginPIDs() []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == pluginBin {
			pids = append(pids, e.Name())
		}
	}
	slices.Sort(pids)
	return pids
}

// The same row with a real plugin policy: the plugin serves until a valid
// reload moves away from it; the invalid edit, which starts a second
// plugin process before failing, leaves only the first running; after the
// valid reload no plugin process is left.
func TestReloadAwayFromPluginStopsIt(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	path := filepath.Join(t.TempDir(), "policy.hcl")
	writeFile(t, path, pluginHCL("queue-depth"))
	r, x := loadedRouter(t, path, nil)
	b0 := Current(r)
	pids := pluginPIDs()
	if len(pids) != 1 {
		t.Fatalf("plugin processes %v, want one", pids)
	}

	l := startLoad(r, func(ph int32, d router.Decision) error {
		switch {
		case ph <= 1 && (d.Policy != "queue" || d.Fallback):
			return fmt.Errorf("decided by %q (fallback %v, cause %v), want the plugin policy queue", d.Policy, d.Fallback, d.FallbackCause)
		case ph == 2 && d.Policy != "rr" && (d.Policy != "queue" || d.Fallback):
			return fmt.Errorf("decided by %q (fallback %v, cause %v), want rr or queue", d.Policy, d.Fallback, d.FallbackCause)
		case ph == 3 && d.Policy != "rr":
			return fmt.Errorf("decided by %q, want rr", d.Policy)
		}
		return nil
	})
	defer l.finish(t)
	l.waitDecisions(t, 0, 200)

	writeFile(t, path, pluginHCL("queue-dept"))
	assertDiagAt(t, x.Reload(context.Background(), path), path, 8)
	if Current(r) != b0 {
		t.Fatal("a failed reload replaced the running bundle")
	}
	if got := pluginPIDs(); !slices.Equal(got, pids) {
		t.Fatalf("after the failed reload plugin processes are %v, want only the running one %v", got, pids)
	}
	l.phase.Store(1)
	l.waitDecisions(t, 1, 200)
	if ps := b0.Plugins(); len(ps) != 1 || ps[0].Name != "example" || !ps[0].Started || ps[0].Status != supervisor.StatusUp {
		t.Errorf("plugins %+v, want example started and up", ps)
	} else if calls := ps[0].Stats.Calls; calls < 400 {
		t.Errorf("plugin served %d calls, want >= 400", calls)
	}

	writeFile(t, path, rrHCL)
	l.phase.Store(2)
	if diags := x.Reload(context.Background(), path); diags.HasErrors() {
		t.Fatal(config.FormatDiagnostics(diags))
	}
	l.phase.Store(3)
	if got := pluginPIDs(); len(got) > 0 {
		t.Errorf("plugin processes %v still run after the reload away from the plugin", got)
	}
	if !hostClosed(b0.host) {
		t.Error("old bundle's Host still runs after the reload")
	}
	if st := b0.Plugins()[0].Stats; st.Fallbacks != 0 {
		t.Errorf("plugin stats %+v: calls failed", st)
	}
	l.waitDecisions(t, 3, 200)
	l.finish(t)
	assertRoundRobin(t, r, nil)
}

// A file that fails after its plugins started leaves nothing running.
func TestLoadBundleFailureLeavesNothingRunning(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	path := filepath.Join(t.TempDir(), "policy.hcl")
	writeFile(t, path, pluginHCL("no-such-scorer"))
	b, diags := LoadBundle(context.Background(), path, LoadOptions{})
	if b != nil {
		t.Fatal("LoadBundle returned a bundle with errors")
	}
	assertDiagAt(t, diags, path, 8)
	if !strings.Contains(config.FormatDiagnostics(diags), "queue-depth") {
		t.Errorf("diagnostics do not list the plugin's types:\n%s", config.FormatDiagnostics(diags))
	}
	if got := pluginPIDs(); len(got) > 0 {
		t.Fatalf("plugin processes %v left by a failed load", got)
	}
}

// Every failure counts: a file with errors, a missing file, a file that
// changes router.block_size; the running policy stays each time. Two
// routers on one registry share the counter.
func TestReloadMetrics(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.hcl")
	writeFile(t, path, rrHCL)
	reg := prometheus.NewRegistry()
	r, x := loadedRouter(t, path, reg)
	var logs strings.Builder
	x.log = hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})
	b0 := Current(r)

	writeFile(t, path, invalidHCL)
	assertDiagAt(t, x.Reload(context.Background(), path), path, 3)
	if got := logs.String(); !strings.Contains(got, "policy file reload failed") || !strings.Contains(got, path+":3:") {
		t.Fatalf("the failure is not logged with its diagnostics:\n%s", got)
	}
	missing := filepath.Join(dir, "missing.hcl")
	assertDiagAt(t, x.Reload(context.Background(), missing), missing, 1)
	writeFile(t, path, "router {\n  block_size = 16\n}\n"+rrHCL)
	diags := x.Reload(context.Background(), path)
	if !diags.HasErrors() || !strings.Contains(config.FormatDiagnostics(diags), "block_size cannot change") {
		t.Fatalf("block size change: %s", config.FormatDiagnostics(diags))
	}
	if Current(r) != b0 {
		t.Fatal("a failed reload replaced the running bundle")
	}
	assertRoundRobin(t, r, nil)

	writeFile(t, path, topHCL)
	if diags := x.Reload(context.Background(), path); diags.HasErrors() {
		t.Fatal(config.FormatDiagnostics(diags))
	}
	r3, err := router.New(router.Options{BlockSize: 4, Roles: map[shared.Role]*policy.Policy{}, Registerer: reg})
	if err != nil {
		t.Fatalf("second router on the same registry: %v", err)
	}
	x3, err := NewReloader(r3, ReloadOptions{Registerer: reg})
	if err != nil {
		t.Fatalf("second reloader on the same registry: %v", err)
	}
	x3.countReload(ReloadSuccess)
	if got := testutil.ToFloat64(x.reloads.WithLabelValues(ReloadFailure)); got != 3 {
		t.Errorf("failures = %v, want 3", got)
	}
	if got := testutil.ToFloat64(x.reloads.WithLabelValues(ReloadSuccess)); got != 2 {
		t.Errorf("successes = %v, want 2 (one from each reloader)", got)
	}
	if err := r3.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A reload closes the old bundle's components that implement
// shared.Closer, each once.
func TestReloadClosesComponents(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.hcl")
	writeFile(t, path, strings.ReplaceAll(topHCL, "highest-id", "tracked"))
	made, closed := trackedNew.Load(), trackedClosed.Load()
	_, x := loadedRouter(t, path, nil)
	if n := trackedNew.Load() - made; n != 1 {
		t.Fatalf("%d tracked instances, want 1 (role aggregated)", n)
	}
	writeFile(t, path, rrHCL)
	if diags := x.Reload(context.Background(), path); diags.HasErrors() {
		t.Fatal(config.FormatDiagnostics(diags))
	}
	if n := trackedClosed.Load() - closed; n != 1 {
		t.Fatalf("%d Close calls, want 1", n)
	}
}

// TestReloadOfAClosedRouter: a reload after the Router closed fails and
// leaves no plugin running.
func TestReloadOfAClosedRouter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.hcl")
	writeFile(t, path, rrHCL)
	r, x := loadedRouter(t, path, nil)
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if diags := x.Reload(context.Background(), "/nonexistent.hcl"); !diags.HasErrors() {
		t.Fatal("Reload of a missing file on a closed router succeeded")
	}
	if diags := x.Reload(context.Background(), path); !diags.HasErrors() || !strings.Contains(config.FormatDiagnostics(diags), router.ErrClosed.Error()) {
		t.Fatalf("Reload on a closed router: %s, want the router's ErrClosed", config.FormatDiagnostics(diags))
	}
}
