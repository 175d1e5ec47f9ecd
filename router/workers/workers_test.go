package workers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
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

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const fast = 20 * time.Millisecond

// engine is a fake engine's metrics and health endpoints: /metrics serves
// body, or fails with 500 while failing is set, or answers 404 while
// noMetrics is set (SGLang without --enable-metrics); /health answers
// healthCode, 200 when 0.
type engine struct {
	srv        *httptest.Server
	mu         sync.Mutex
	body       string
	failing    atomic.Bool
	noMetrics  atomic.Bool
	healthCode atomic.Int64
	scrapes    atomic.Int64
	healths    atomic.Int64
}

func newEngine(t *testing.T, body string) *engine {
	t.Helper()
	e := &engine{body: body}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			e.healths.Add(1)
			if c := e.healthCode.Load(); c != 0 {
				w.WriteHeader(int(c))
			}
			return
		}
		e.scrapes.Add(1)
		if r.URL.Path != "/metrics" || e.noMetrics.Load() {
			http.NotFound(w, r)
			return
		}
		if e.failing.Load() {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		e.mu.Lock()
		b := e.body
		e.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, b)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *engine) set(body string) {
	e.mu.Lock()
	e.body = body
	e.mu.Unlock()
}

func worker(name string, e *engine, models ...string) config.Worker {
	return config.Worker{Name: name, URL: e.srv.URL, MetricsURL: e.srv.URL + "/metrics", Role: shared.RoleAggregated,
		Models: models, TotalKVBlocks: 100}
}

func newRouter(t *testing.T) *router.Router {
	t.Helper()
	p := &policy.Policy{Name: "rr", PickerName: "rr", Picker: builtin.NewRoundRobin()}
	roles := map[shared.Role]*policy.Policy{shared.RoleAggregated: p, shared.RolePrefill: p, shared.RoleDecode: p}
	r, err := router.New(router.Options{BlockSize: 16, Roles: roles})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r
}

// syncBuffer is a log sink safe for concurrent writes and reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newManager(t *testing.T, r *router.Router, o Options) (*Manager, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	if o.Logger == nil {
		o.Logger = hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug})
	}
	m, err := NewManager(r, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m, logs
}

// names lists the members of the partition of model and role by name.
func names(r *router.Router, model string, role shared.Role) []string {
	var out []string
	for _, w := range r.Workers(model, role) {
		out = append(out, w.Name)
	}
	slices.Sort(out)
	return out
}

func member(r *router.Router, name string) *fleet.Worker {
	for _, role := range config.Roles {
		for _, w := range r.Workers("", role) {
			if w.Name == name {
				return w
			}
		}
	}
	return nil
}

// anyReady reports whether a worker of m is ready.
func anyReady(m *Manager) bool {
	return slices.ContainsFunc(m.Status(), func(s Status) bool { return s.Ready })
}

func membersAre(r *router.Router, model string, role shared.Role, want ...string) func() bool {
	return func() bool { return slices.Equal(names(r, model, role), want) }
}

func TestEngineMetricsLandInLoad(t *testing.T) {
	r := newRouter(t)
	m, _ := newManager(t, r, Options{ScrapeInterval: fast})
	v, s := newEngine(t, vllmMetrics), newEngine(t, sglangMetrics)
	if anyReady(m) {
		t.Fatal("ready without workers")
	}
	if err := m.Sync([]config.Worker{worker("v", v, "llama"), worker("s", s, "qwen")}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "both ready", membersAre(r, "", shared.RoleAggregated, "s", "v"))
	if !anyReady(m) {
		t.Error("not ready")
	}
	for _, c := range []struct {
		name, model      string
		kv               float64
		waiting, running int64
	}{{"v", "llama", 0.42, 7, 3}, {"s", "qwen", 0.25, 2, 5}} {
		ws := r.Workers(c.model, shared.RoleAggregated)
		if len(ws) != 1 || ws[0].Name != c.name || ws[0].ID != shared.WorkerIDOf(c.name) {
			t.Fatalf("partition %s = %v", c.model, names(r, c.model, shared.RoleAggregated))
		}
		l := ws[0].Load(false)
		if !l.Available || !l.HasKVUsage || l.KVUsage != c.kv || !l.HasWaiting || l.Waiting != c.waiting {
			t.Errorf("%s load = %+v, want kv %v waiting %d", c.name, l, c.kv, c.waiting)
		}
		st, _ := m.StatusOf(c.name)
		if !st.Ready || !st.HasRunning || st.Running != c.running || st.Member != ws[0] {
			t.Errorf("%s status = %+v", c.name, st)
		}
	}
	if u, ok := m.URL("v"); !ok || u != v.srv.URL {
		t.Errorf("URL(v) = %q, %v", u, ok)
	}
	if _, ok := m.URL("nobody"); ok {
		t.Error("URL of an unknown worker")
	}
	if got := r.Models(); !slices.Equal(got, []string{"llama", "qwen"}) {
		t.Errorf("models = %v", got)
	}

	// A new report replaces the old one.
	v.set(strings.ReplaceAll(vllmMetrics, "} 0.42", "} 0.9"))
	testkit.Eventually(t, "new kv usage", func() bool { return member(r, "v").Load(false).KVUsage == 0.9 })
}

func TestStaleReportIsUnavailable(t *testing.T) {
	r := newRouter(t)
	// A high threshold keeps failing workers members: only staleness acts.
	m, _ := newManager(t, r, Options{ScrapeInterval: fast, FailureThreshold: 1 << 20})
	quiet, failing := newEngine(t, vllmMetrics), newEngine(t, vllmMetrics)
	if err := m.Sync([]config.Worker{worker("quiet", quiet, "m"), worker("failing", failing, "m")}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "reports", func() bool {
		a, b := member(r, "quiet"), member(r, "failing")
		return a != nil && b != nil && a.Load(false).Available && b.Load(false).Available
	})
	quiet.set("# no engine metrics here\n") // answers, reports nothing
	failing.failing.Store(true)
	for _, name := range []string{"quiet", "failing"} {
		// lastSeen is no later than the last report, so cleared-lastSeen
		// bounds the report's age at clearing from above. The check is a
		// lower bound (not cleared too early): a slow machine only makes
		// the age larger, so it holds however busy the machine is.
		var lastSeen time.Time
		testkit.Eventually(t, name+" unavailable", func() bool {
			st, _ := m.StatusOf(name)
			if st.Load != nil {
				lastSeen = st.ObservedAt
			}
			return !member(r, name).Load(false).Available
		})
		if age := time.Since(lastSeen); !lastSeen.IsZero() && age < StaleIntervals*fast {
			t.Errorf("%s cleared %s after a report, before %d intervals", name, age, StaleIntervals)
		}
		l := member(r, name).Load(false)
		if l.HasKVUsage || l.HasWaiting {
			t.Errorf("%s stale load = %+v", name, l)
		}
		if st, _ := m.StatusOf(name); !st.Ready || st.Load != nil {
			t.Errorf("%s status = %+v, want ready without a load", name, st)
		}
	}
	// Unavailable differs from idle: bookings alone do not make it available,
	// but a router whose bookings are the load would.
	if member(r, "quiet").Load(true).Available != true {
		t.Error("bookingsAreLoad")
	}
	// A fresh report makes it available again.
	quiet.set(vllmMetrics)
	testkit.Eventually(t, "quiet available again", func() bool { return member(r, "quiet").Load(false).Available })
}

func TestFailingWorkerLeavesAndReturns(t *testing.T) {
	r := newRouter(t)
	reg := prometheus.NewPedanticRegistry()
	m, logs := newManager(t, r, Options{ScrapeInterval: fast, Registerer: reg})
	a, b := newEngine(t, vllmMetrics), newEngine(t, vllmMetrics)
	if err := m.Sync([]config.Worker{worker("a", a, "m"), worker("b", b, "m")}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "both ready", membersAre(r, "m", shared.RoleAggregated, "a", "b"))
	gen := member(r, "a").Generation

	a.failing.Store(true)
	testkit.Eventually(t, "a out of the partition", membersAre(r, "m", shared.RoleAggregated, "b"))
	if st, _ := m.StatusOf("a"); st.Ready || st.ScrapeFailures < DefaultFailureThreshold || st.LastError == nil {
		t.Errorf("a status = %+v", st)
	}
	if !anyReady(m) {
		t.Error("manager not ready with b up")
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP switchyard_worker_ready 1 when the worker is in the candidate set, 0 when it is configured but not ready.
# TYPE switchyard_worker_ready gauge
switchyard_worker_ready{worker="a"} 0
switchyard_worker_ready{worker="b"} 1
`), "switchyard_worker_ready"); err != nil {
		t.Error(err)
	}

	a.failing.Store(false)
	testkit.Eventually(t, "a back", membersAre(r, "m", shared.RoleAggregated, "a", "b"))
	if g := member(r, "a").Generation; g <= gen {
		t.Errorf("a rejoined under generation %d, not after %d", g, gen)
	}
	testkit.Eventually(t, "a's load after rejoining", func() bool { return member(r, "a").Load(false).Available })
	if !strings.Contains(logs.String(), "worker not ready") || !strings.Contains(logs.String(), "consecutive probes failed") {
		t.Errorf("logs:\n%s", logs)
	}

	// A worker that refuses connections leaves too; with none ready the
	// manager is not ready.
	a.srv.Close()
	b.srv.Close()
	testkit.Eventually(t, "none ready", func() bool { return !anyReady(m) })
	if got := r.Workers("m", shared.RoleAggregated); got != nil {
		t.Errorf("members = %v", names(r, "m", shared.RoleAggregated))
	}
}

// oneReadyWorker returns a Manager of r over one vLLM engine, worker "a"
// of model "m", once it is ready. Its long probe interval lets the checks
// right after request reports see the state before the next probe.
func oneReadyWorker(t *testing.T, r *router.Router) *Manager {
	t.Helper()
	m, _ := newManager(t, r, Options{ScrapeInterval: 300 * time.Millisecond})
	a := newEngine(t, vllmMetrics)
	if err := m.Sync([]config.Worker{worker("a", a, "m")}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "a ready", func() bool { return anyReady(m) })
	return m
}

func TestReportFailure(t *testing.T) {
	r := newRouter(t)
	m := oneReadyWorker(t, r)

	m.ReportFailure("a")
	m.ReportFailure("a")
	m.ReportSuccess("a")
	m.ReportFailure("a")
	m.ReportFailure("a")
	m.ReportFailure("nobody")
	if !anyReady(m) {
		t.Fatal("a left after non-consecutive failures")
	}
	m.ReportFailure("a")
	if anyReady(m) || r.Workers("m", shared.RoleAggregated) != nil {
		t.Fatal("a still a member after 3 consecutive failures")
	}
	m.ReportFailure("a") // not ready: ignored
	// It returns at the next scrape that answers.
	testkit.Eventually(t, "a back", membersAre(r, "m", shared.RoleAggregated, "a"))
	if st, _ := m.StatusOf("a"); st.RequestFailures != 0 {
		t.Errorf("request failures after rejoining = %d", st.RequestFailures)
	}
}

// TestRequestFailuresEjectBounded: request failures hold at most
// MaxEjectedPercent of the configured workers out at once (at least one):
// a request that fails on every engine it reaches (three of them, each
// past the threshold) takes one out, not the fleet; the others are kept
// in, logged once each. Once the ejected one is back, another may go.
func TestRequestFailuresEjectBounded(t *testing.T) {
	r := newRouter(t)
	// A scrape interval long enough that the ejected worker cannot
	// rejoin between the reports and the checks right after them.
	m, logs := newManager(t, r, Options{ScrapeInterval: time.Second})
	ws := []config.Worker{worker("a", newEngine(t, vllmMetrics), "m"), worker("b", newEngine(t, vllmMetrics), "m"),
		worker("c", newEngine(t, vllmMetrics), "m")}
	if err := m.Sync(ws); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "a, b, c ready", membersAre(r, "m", shared.RoleAggregated, "a", "b", "c"))
	for range DefaultFailureThreshold + 1 { // one past the threshold: still logged once
		for _, name := range []string{"a", "b", "c"} {
			m.ReportFailure(name)
		}
	}
	if got := names(r, "m", shared.RoleAggregated); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("members after %d failures on each of 3 workers: %v, want [b c] (10%% of 3 is 1 worker out at most)",
			DefaultFailureThreshold+1, got)
	}
	if n := strings.Count(logs.String(), "worker kept in despite failed requests"); n != 2 {
		t.Errorf("%d kept-in warnings, want 2 (b and c once each):\n%s", n, logs.String())
	}
	for _, name := range []string{"b", "c"} {
		if st, _ := m.StatusOf(name); !st.Ready || st.RequestFailures != DefaultFailureThreshold+1 {
			t.Errorf("%s: ready %v, request failures %d; want ready with %d", name, st.Ready, st.RequestFailures, DefaultFailureThreshold+1)
		}
	}
	// a rejoins at its next probe; then b's next failure takes it out.
	testkit.Eventually(t, "a back", membersAre(r, "m", shared.RoleAggregated, "a", "b", "c"))
	m.ReportFailure("b")
	if got := names(r, "m", shared.RoleAggregated); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("members after b's next failure with a back: %v, want [a c]", got)
	}
}

func TestSyncAddRemoveChange(t *testing.T) {
	r := newRouter(t)
	m, _ := newManager(t, r, Options{ScrapeInterval: fast})
	ea, eb, ec, ed := newEngine(t, vllmMetrics), newEngine(t, sglangMetrics), newEngine(t, vllmMetrics), newEngine(t, vllmMetrics)
	a, b := worker("a", ea, "llama"), worker("b", eb, "llama")
	if err := m.Sync([]config.Worker{a, b}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "a, b", membersAre(r, "llama", shared.RoleAggregated, "a", "b"))
	genA, genB := member(r, "a").Generation, member(r, "b").Generation

	// Unchanged a stays as it is; b moves to another model and role with
	// more capacity; c joins.
	b2 := b
	b2.Models, b2.Role, b2.TotalKVBlocks = []string{"qwen"}, shared.RoleDecode, 500
	c := worker("c", ec, "llama")
	if err := m.Sync([]config.Worker{a, b2, c}); err != nil {
		t.Fatal(err)
	}
	// b is replaced at once, without waiting for a scrape.
	if got := names(r, "qwen", shared.RoleDecode); !slices.Equal(got, []string{"b"}) {
		t.Errorf("qwen decode = %v, want [b]", got)
	}
	wb := member(r, "b")
	if wb.Generation <= genB || wb.TotalKVBlocks != 500 || wb.Role != shared.RoleDecode || wb.ID != shared.WorkerIDOf("b") {
		t.Errorf("b = %+v", wb.Spec)
	}
	if !wb.Load(false).Available {
		t.Error("b lost its engine report on the change")
	}
	testkit.Eventually(t, "c joins", membersAre(r, "llama", shared.RoleAggregated, "a", "c"))
	if member(r, "a").Generation != genA {
		t.Error("unchanged a was rejoined")
	}

	// a moves to another endpoint: it starts over there.
	a2 := worker("a", ed, "llama")
	if err := m.Sync([]config.Worker{a2, b2, c}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "a on its new endpoint", func() bool {
		w := member(r, "a")
		return w != nil && w.Generation > genA && ed.scrapes.Load() > 0
	})
	if st, _ := m.StatusOf("a"); st.Config.URL != ed.srv.URL {
		t.Errorf("a url = %s", st.Config.URL)
	}

	// An invalid set changes nothing.
	for _, bad := range [][]config.Worker{
		{a2, a2},
		{func() config.Worker { w := c; w.TotalKVBlocks = -1; return w }()},
		{func() config.Worker { w := c; w.Models = []string{}; return w }()},
		{func() config.Worker { w := c; w.Role = "both"; return w }()},
	} {
		if err := m.Sync(bad); err == nil {
			t.Errorf("Sync(%v) succeeded", bad)
		}
	}
	if len(m.Status()) != 3 {
		t.Errorf("status = %v", m.Status())
	}

	// Removing all but c.
	if err := m.Sync([]config.Worker{c}); err != nil {
		t.Fatal(err)
	}
	if got := names(r, "", shared.RoleAggregated); !slices.Equal(got, []string{"c"}) {
		t.Errorf("aggregated = %v", got)
	}
	if r.Workers("", shared.RoleDecode) != nil || slices.Contains(r.Models(), "qwen") {
		t.Errorf("b still a member: models %v", r.Models())
	}
	if st := m.Status(); len(st) != 1 || st[0].Config.Name != "c" {
		t.Errorf("status = %+v", st)
	}
	// A removed worker's engine is no longer scraped.
	n := ea.scrapes.Load()
	testkit.Eventually(t, "some intervals", func() bool { return ec.scrapes.Load() > 5 })
	if ea.scrapes.Load() > n+1 {
		t.Errorf("removed a scraped %d more times", ea.scrapes.Load()-n)
	}
}

// TestRejoinWithBookingInFlight removes a worker with a request in flight
// and re-adds it under the same name: the late release charges the old
// generation, so no count ever goes negative.
func TestRejoinWithBookingInFlight(t *testing.T) {
	r := newRouter(t)
	reg := prometheus.NewPedanticRegistry()
	m, _ := newManager(t, r, Options{ScrapeInterval: fast, Registerer: reg})
	e := newEngine(t, vllmMetrics)
	a := worker("a", e, "llama")
	if err := m.Sync([]config.Worker{a}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "a ready", func() bool { return anyReady(m) })
	sel := func() router.Decision {
		t.Helper()
		d, err := r.Place(context.Background(), &shared.Request{ID: "x", Model: "llama", Role: shared.RoleAggregated, PromptTokens: 40}, router.Placement{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d1 := sel()
	old := d1.Worker

	// Leave by Sync, with the request in flight, and rejoin.
	if err := m.Sync(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Place(context.Background(), &shared.Request{Model: "llama", Role: shared.RoleAggregated}, router.Placement{}); err == nil {
		t.Fatal("selected a removed worker")
	}
	if old.ActiveRequests() != 1 {
		t.Fatalf("in-flight count on the removed worker = %d", old.ActiveRequests())
	}
	// No longer configured, but its request is in flight: still counted.
	gaugeIs(t, reg, "switchyard_worker_active_requests", 1)
	if err := m.Sync([]config.Worker{a}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "a rejoined", func() bool { return anyReady(m) })
	d2 := sel()
	if d2.Worker == old || d2.Worker.ID != old.ID {
		t.Fatalf("rejoined worker: %+v, old %+v", d2.Worker.Spec, old.Spec)
	}
	// Configured again under its name: the removed generation's request
	// counts with the new one's.
	gaugeIs(t, reg, "switchyard_worker_active_requests", 2)
	if !d1.Booking.Release() {
		t.Fatal("first release did nothing")
	}
	if d1.Booking.Release() {
		t.Fatal("second release released")
	}
	if old.ActiveRequests() != 0 || d2.Worker.ActiveRequests() != 1 {
		t.Fatalf("counts: old %d, new %d", old.ActiveRequests(), d2.Worker.ActiveRequests())
	}
	if l := d2.Worker.Load(false); l.ActiveRequests != 1 || l.ActivePrefillTokens < 0 || l.ActiveDecodeBlocks != 3 {
		t.Errorf("new load = %+v", l)
	}
	gaugeIs(t, reg, "switchyard_worker_active_requests", 1)

	// Leave by failing health, with d2 in flight; a third booking after the
	// return; d2 then ends.
	e.failing.Store(true)
	testkit.Eventually(t, "a not ready", func() bool { return !anyReady(m) })
	gaugeIs(t, reg, "switchyard_worker_active_requests", 1) // still counted while in flight
	e.failing.Store(false)
	testkit.Eventually(t, "a ready again", func() bool { return anyReady(m) })
	d3 := sel()
	d2.Booking.Release()
	for _, w := range []*fleet.Worker{old, d2.Worker, d3.Worker} {
		if w.ActiveRequests() < 0 {
			t.Errorf("generation %d count %d", w.Generation, w.ActiveRequests())
		}
	}
	if d2.Worker.ActiveRequests() != 0 || d3.Worker.ActiveRequests() != 1 {
		t.Errorf("counts: d2's %d, d3's %d", d2.Worker.ActiveRequests(), d3.Worker.ActiveRequests())
	}
	d3.Booking.Release()
	gaugeIs(t, reg, "switchyard_worker_active_requests", 0)
}

// gaugeIs checks the one series of name in reg.
func gaugeIs(t *testing.T, reg *prometheus.Registry, name string, want float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			if ms := mf.GetMetric(); len(ms) != 1 || ms[0].GetGauge().GetValue() != want {
				t.Errorf("%s = %v, want %v", name, ms, want)
			}
			return
		}
	}
	t.Errorf("%s not gathered", name)
}

func TestWatch(t *testing.T) {
	r := newRouter(t)
	m, logs := newManager(t, r, Options{ScrapeInterval: fast})
	ea, eb := newEngine(t, vllmMetrics), newEngine(t, vllmMetrics)
	dir := t.TempDir()
	path := filepath.Join(dir, "workers.hcl")
	block := func(name string, e *engine) string {
		return fmt.Sprintf("worker %q {\n  url             = %q\n  models          = [\"m\"]\n  total_kv_blocks = 64\n}\n", name, e.srv.URL)
	}
	write := func(src string) {
		t.Helper()
		// Replace atomically, as editors and deployments do.
		tmp := filepath.Join(dir, ".workers.tmp")
		if err := os.WriteFile(tmp, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(block("a", ea))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Watch(ctx, path) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	}()
	testkit.Eventually(t, "a from the file", membersAre(r, "m", shared.RoleAggregated, "a"))

	write(block("a", ea) + block("b", eb))
	testkit.Eventually(t, "b added", membersAre(r, "m", shared.RoleAggregated, "a", "b"))

	// An invalid file changes nothing and is logged at file:line:col.
	write(block("a", ea) + "worker \"c\" {\n  url             = \"nope\"\n  models          = [\"m\"]\n  total_kv_blocks = 64\n}\n")
	testkit.Eventually(t, "the error logged", func() bool {
		return strings.Contains(logs.String(), path+":7:21: error: Invalid URL")
	})
	if got := names(r, "m", shared.RoleAggregated); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("members after an invalid file = %v", got)
	}

	// So does a file nested 100,000 deep (config.MaxNesting), which used
	// to end the process with a stack overflow: the 256th [ is refused.
	write("worker \"c\" {\n  url = " + strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000) + "\n}\n")
	testkit.Eventually(t, "the nesting error logged", func() bool {
		return strings.Contains(logs.String(), path+":2:264: error: Nesting too deep")
	})
	if got := names(r, "m", shared.RoleAggregated); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("members after a deep file = %v", got)
	}

	// Written in place, too.
	if err := os.WriteFile(path, []byte(block("b", eb)), 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "a removed", membersAre(r, "m", shared.RoleAggregated, "b"))
	if len(m.Status()) != 1 {
		t.Errorf("status = %+v", m.Status())
	}
}

func TestNewManagerMetricsConflict(t *testing.T) {
	r := newRouter(t)
	reg := prometheus.NewRegistry()
	newManager(t, r, Options{Registerer: reg})
	if _, err := NewManager(r, Options{Registerer: reg}); err == nil {
		t.Error("second registration succeeded")
	}
	if _, err := NewManager(nil, Options{}); err == nil {
		t.Error("nil router accepted")
	}
}

// A Kubernetes ConfigMap update (kubelet's AtomicWriter) never names the
// mounted file: workers.hcl -> ..data/workers.hcl, ..data -> a timestamped
// directory, and the update renames a new ..data_tmp symlink over ..data.
// Watch loads the new membership, once.
func TestWatchConfigMap(t *testing.T) {
	r := newRouter(t)
	m, logs := newManager(t, r, Options{ScrapeInterval: fast})
	ea, eb := newEngine(t, vllmMetrics), newEngine(t, vllmMetrics)
	dir := t.TempDir()
	block := func(name string, e *engine) string {
		return fmt.Sprintf("worker %q {\n  url             = %q\n  models          = [\"m\"]\n  total_kv_blocks = 64\n}\n", name, e.srv.URL)
	}
	mount := func(ts, content string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ts, "workers.hcl"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mount("..2026_a", block("a", ea))
	if err := os.Symlink("..2026_a", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "workers.hcl")
	if err := os.Symlink(filepath.Join("..data", "workers.hcl"), path); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Watch(ctx, path) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	}()
	testkit.Eventually(t, "a from the file", membersAre(r, "m", shared.RoleAggregated, "a"))

	mount("..2026_b", block("b", eb))
	if err := os.Symlink("..2026_b", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..2026_a")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "b in place of a", membersAre(r, "m", shared.RoleAggregated, "b"))
	// One load at the start, one for the swap, and no more.
	loaded := func() int { return strings.Count(logs.String(), "workers file loaded") }
	time.Sleep(4 * DefaultDebounce) // bounded: no further load may follow
	if n := loaded(); n != 2 {
		t.Errorf("the file was loaded %d times, want 2 (start, swap):\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "[ERROR]") {
		t.Errorf("errors logged:\n%s", logs.String())
	}
}

// TestSyncDuplicateNamesBothBlocks checks that a worker name given twice,
// in the policy file and in the workers file as router serve merges them,
// is refused naming both blocks' file:line:col, and without positions
// (workers built in code) by name alone.
func TestSyncDuplicateNamesBothBlocks(t *testing.T) {
	r := newRouter(t)
	m, _ := newManager(t, r, Options{ScrapeInterval: fast})
	e := newEngine(t, vllmMetrics)
	a1, a2 := worker("a", e, "llama"), worker("a", e, "llama")
	a1.Range = hcl.Range{Filename: "policy.hcl", Start: hcl.Pos{Line: 12, Column: 1}}
	a2.Range = hcl.Range{Filename: "workers.hcl", Start: hcl.Pos{Line: 3, Column: 1}}
	err := m.Sync([]config.Worker{a1, a2})
	const want = `workers: duplicate worker "a": declared at policy.hcl:12:1 and at workers.hcl:3:1; worker names must be unique across the policy file and the workers file`
	if err == nil || err.Error() != want {
		t.Errorf("Sync = %v, want %s", err, want)
	}
	a1.Range, a2.Range = hcl.Range{}, hcl.Range{}
	if err := m.Sync([]config.Worker{a1, a2}); err == nil || err.Error() != `workers: duplicate worker "a"` {
		t.Errorf("Sync without positions = %v, want workers: duplicate worker \"a\"", err)
	}
	if got := names(r, "llama", shared.RoleAggregated); len(got) != 0 {
		t.Errorf("members after refused Syncs = %v, want none", got)
	}
}

// The Router is the Membership serve hands the Manager.
var _ Membership = (*router.Router)(nil)

// recordingMembership is a Membership over a real fleet that records the
// Manager's calls and refuses joins while refuse is set.
type recordingMembership struct {
	f      *fleet.Fleet
	refuse atomic.Bool
	mu     sync.Mutex
	calls  []string
}

func (r *recordingMembership) AddWorker(s fleet.Spec) (*fleet.Worker, error) {
	r.mu.Lock()
	r.calls = append(r.calls, "add "+s.Name)
	r.mu.Unlock()
	if r.refuse.Load() {
		return nil, errors.New("the fleet refuses it")
	}
	return r.f.AddWorker(s)
}

func (r *recordingMembership) RemoveWorker(id shared.WorkerID, rank uint32) error {
	r.mu.Lock()
	r.calls = append(r.calls, fmt.Sprintf("remove %d/%d", id, rank))
	r.mu.Unlock()
	return r.f.RemoveWorker(id, rank)
}

func (r *recordingMembership) callsAre(want ...string) func() bool {
	return func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return slices.Equal(r.calls, want)
	}
}

// TestManagerOverMembership drives a Manager over a Membership that is not
// a Router: it joins a worker at its first good probe (once), removes it
// when its probes fail, and while the membership refuses the join says
// why in the worker's status and retries at later probes.
func TestManagerOverMembership(t *testing.T) {
	mem := &recordingMembership{f: fleet.New()}
	m, err := NewManager(mem, Options{ScrapeInterval: fast, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	e := newEngine(t, vllmMetrics)
	if err := m.Sync([]config.Worker{worker("a", e, "m")}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "a joined", mem.callsAre("add a"))
	if st, _ := m.StatusOf("a"); !st.Ready || st.ID != shared.WorkerIDOf("a") || st.Member == nil || st.Member.Name != "a" {
		t.Errorf("a status %+v, want ready as member a", st)
	}

	mem.refuse.Store(true)
	e.failing.Store(true)
	removed := fmt.Sprintf("remove %d/0", shared.WorkerIDOf("a"))
	testkit.Eventually(t, "a removed", mem.callsAre("add a", removed))
	e.failing.Store(false)
	testkit.Eventually(t, "a refused", func() bool {
		st, _ := m.StatusOf("a")
		return !st.Ready && st.Reason == "cannot join the fleet: the fleet refuses it"
	})
	mem.refuse.Store(false)
	testkit.Eventually(t, "a back", func() bool { st, _ := m.StatusOf("a"); return st.Ready })
	mem.mu.Lock()
	calls := slices.Clone(mem.calls)
	mem.mu.Unlock()
	// add a, remove, then one refused add or more, then the add that took.
	if len(calls) < 4 || calls[len(calls)-1] != "add a" || calls[len(calls)-2] != "add a" {
		t.Errorf("calls %v, want add, remove, refused adds, add", calls)
	}
	if p := mem.f.Snapshot().ModelPartition("m", shared.RoleAggregated); p == nil || len(p.Workers) != 1 || p.Workers[0].Name != "a" {
		t.Errorf("fleet partition %+v, want a alone", p)
	}
}

// TestSyncReportsDepartedURLs: after each Sync, Options.Departed gets the
// base URLs no worker has any more (a worker removed, one moved to
// another URL), and not one another worker still has or an invalid set.
func TestSyncReportsDepartedURLs(t *testing.T) {
	r := newRouter(t)
	var mu sync.Mutex
	var got []string
	took := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := got
		got = nil
		return out
	}
	m, _ := newManager(t, r, Options{ScrapeInterval: fast, Departed: func(u string) {
		mu.Lock()
		got = append(got, u)
		mu.Unlock()
	}})
	ea, eb, ec := newEngine(t, vllmMetrics), newEngine(t, vllmMetrics), newEngine(t, vllmMetrics)
	a, b, c := worker("a", ea, "llama"), worker("b", eb, "llama"), worker("c", ec, "llama")
	if err := m.Sync([]config.Worker{a, b}); err != nil {
		t.Fatal(err)
	}
	if d := took(); len(d) != 0 {
		t.Fatalf("departed %v on the first sync, want none", d)
	}
	// a moves to c's engine; b2 shares b's URL under another name.
	a2 := a
	a2.URL, a2.MetricsURL = c.URL, c.MetricsURL
	b2 := worker("b2", eb, "llama")
	if err := m.Sync([]config.Worker{a2, b2}); err != nil {
		t.Fatal(err)
	}
	if d := took(); !slices.Equal(d, []string{ea.srv.URL}) {
		t.Fatalf("departed %v, want [%s] (a's old URL; b's is b2's)", d, ea.srv.URL)
	}
	if err := m.Sync([]config.Worker{a2, a2}); err == nil {
		t.Fatal("a repeated name synced")
	}
	if d := took(); len(d) != 0 {
		t.Fatalf("departed %v after a refused sync, want none", d)
	}
	if err := m.Sync(nil); err != nil {
		t.Fatal(err)
	}
	want := []string{eb.srv.URL, ec.srv.URL}
	slices.Sort(want)
	if d := took(); !slices.Equal(d, want) {
		t.Fatalf("departed %v, want %v", d, want)
	}
}

// TestURLWithoutTheLock: URL answers while the Manager's lock is held (a
// probe's outcome or a membership change under way: a join hands a
// warm-start snapshot to the cluster replica under it), from the
// configuration: every request asks it. A worker that leaves the
// configuration leaves it, and one whose url changes answers the new one.
func TestURLWithoutTheLock(t *testing.T) {
	r := newRouter(t)
	m, _ := newManager(t, r, Options{ScrapeInterval: fast})
	v, s := newEngine(t, vllmMetrics), newEngine(t, sglangMetrics)
	if err := m.Sync([]config.Worker{worker("v", v, "llama")}); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	got := make(chan string, 1)
	go func() { u, _ := m.URL("v"); got <- u }()
	select {
	case u := <-got:
		m.mu.Unlock()
		if u != v.srv.URL {
			t.Errorf("URL(v) under the lock = %q, want %q", u, v.srv.URL)
		}
	case <-time.After(30 * time.Second):
		m.mu.Unlock()
		t.Fatal("URL waited for the Manager's lock")
	}
	moved := worker("v", s, "llama")
	if err := m.Sync([]config.Worker{moved}); err != nil {
		t.Fatal(err)
	}
	if u, ok := m.URL("v"); !ok || u != s.srv.URL {
		t.Errorf("URL(v) after its url changed = %q, %v; want %q", u, ok, s.srv.URL)
	}
	if err := m.Sync(nil); err != nil {
		t.Fatal(err)
	}
	if u, ok := m.URL("v"); ok {
		t.Errorf("URL(v) after it left the configuration = %q, want none", u)
	}
}

// TestReportSuccessWithoutTheLock: a success of a worker with no failed
// requests to reset is recorded without the Manager's lock (every request
// reports one); after a failure it takes the lock and resets the count.
func TestReportSuccessWithoutTheLock(t *testing.T) {
	m := oneReadyWorker(t, newRouter(t))
	m.mu.Lock()
	done := make(chan struct{})
	go func() { m.ReportSuccess("a"); m.ReportSuccess("nobody"); close(done) }()
	select {
	case <-done:
		m.mu.Unlock()
	case <-time.After(30 * time.Second):
		m.mu.Unlock()
		t.Fatal("ReportSuccess of a worker without failures waited for the Manager's lock")
	}
	m.ReportFailure("a")
	if st, _ := m.StatusOf("a"); st.RequestFailures != 1 {
		t.Fatalf("request failures after one = %d", st.RequestFailures)
	}
	m.ReportSuccess("a")
	if st, _ := m.StatusOf("a"); st.RequestFailures != 0 {
		t.Errorf("request failures after a success = %d, want 0", st.RequestFailures)
	}
}
