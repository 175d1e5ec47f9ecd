// Package workers owns the router's worker membership for `router serve`:
// it joins the workers of the policy file's worker blocks (or of a watched
// --workers-file) to the Router's fleet, scrapes each engine's Prometheus
// metrics into its engine load, and takes workers that stop answering out
// of the candidate set until they answer again.
//
// # Identity
//
// A worker's shared.WorkerID is ID(name), the FNV-1a 64-bit hash of its
// block name, so a worker keeps its id across reloads and rejoins and the
// same file gives the same ids in every router process. Data-parallel rank
// is always 0.
//
// # Readiness
//
// Each worker is probed every scrape interval: its metrics endpoint is
// scraped, and when that answers 404 (SGLang started without
// --enable-metrics serves no /metrics) its health endpoint, URL +
// "/health", is asked instead. A probe succeeds when the metrics answer
// 200 with Prometheus text, or answer 404 while /health answers 200.
//
// A worker joins the fleet (is ready) after its first successful probe,
// so a worker that never answered is never a candidate. It leaves the
// candidate set (fleet RemoveWorker; its requests in flight finish and
// release against the generation they were booked on) when
// FailureThreshold consecutive probes fail, or when the serve front
// reports FailureThreshold consecutive request failures (ReportFailure,
// reset by ReportSuccess). It rejoins, as a new fleet generation, at the
// first successful probe that started after it left: at least one scrape
// interval later, without a router restart.
//
// Logged at info: a worker's first failed probe and each probe failing
// for another reason than the one before (connection refused, HTTP status
// N from the metrics or health URL, metrics unparseable or too large,
// timeout), never a repeat of the same failure; it joining ("worker
// ready"). At warn: it
// leaving ("worker not ready", with the reason) and its engine load
// becoming unknown. Status.Reason keeps the latest reason for /readyz.
//
// # Engine load
//
// Each successful scrape that holds the vLLM or SGLang metrics (see
// ParseEngine) sets the worker's engine load; only the worker's own report
// does. A report older than StaleIntervals scrape intervals is cleared
// (Worker.SetEngineLoad(nil): LOAD unavailable, which differs from idle).
// A successful probe without the metrics (a metrics endpoint answering
// 404, or answering without the engine metrics) keeps the worker ready and
// sets nothing, so its last report ages out the same way, and a worker
// that never had one is ready with its load unavailable; the first such
// probe logs a warning that its load is unknown, once until a report
// arrives again.
package workers

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/shared"
)

// Defaults of Options.
const (
	// DefaultScrapeInterval is how often each engine is probed (its
	// metrics scraped); it is also each probe's timeout.
	DefaultScrapeInterval = time.Second
	// DefaultFailureThreshold is how many consecutive failed probes, or
	// consecutive failed requests, make a worker not ready.
	DefaultFailureThreshold = 3
	// StaleIntervals is the age, in scrape intervals, at which an engine
	// report is cleared.
	StaleIntervals = 3
	// DefaultDebounce is how long Watch waits after the last change to the
	// workers file before reloading it.
	DefaultDebounce = 100 * time.Millisecond
)

// Options configure a Manager.
type Options struct {
	// ScrapeInterval is the probe period and each probe's timeout
	// (DefaultScrapeInterval).
	ScrapeInterval time.Duration
	// FailureThreshold is the consecutive failures that make a worker not
	// ready (DefaultFailureThreshold).
	FailureThreshold int
	// Client scrapes the engines; nil uses a client of its own that,
	// unlike http.DefaultTransport, ignores HTTP_PROXY (the engines'
	// requests take no proxy either).
	Client *http.Client
	// Logger receives membership changes, failed probes and readiness
	// changes with their reasons (see Readiness), and workers file reload
	// failures (with file:line:col); nil discards them.
	Logger hclog.Logger
	// Registerer, when set, gets switchyard_worker_ready{worker} (1 ready,
	// 0 not) and switchyard_worker_active_requests{worker} (the requests in
	// flight on the worker, over every generation it joined under), read
	// from the current state at each collection.
	Registerer prometheus.Registerer
	// Debounce is Watch's quiet period (DefaultDebounce).
	Debounce time.Duration
}

// ID is the WorkerID of the worker named name: FNV-1a 64 of the name.
func ID(name string) shared.WorkerID {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return shared.WorkerID(h.Sum64())
}

// Status is a snapshot of one configured worker.
type Status struct {
	Config config.Worker
	ID     shared.WorkerID
	// Ready is true while the worker is a member of the fleet.
	Ready bool
	// Member is the worker's current fleet generation; nil when not ready.
	Member *fleet.Worker
	// Load is the engine's last report while it is fresh; nil otherwise.
	Load *fleet.EngineLoad
	// ObservedAt is when Load was scraped.
	ObservedAt time.Time
	// Running is the engine's running-request count of the last scrape
	// that had it.
	Running    int64
	HasRunning bool
	// ScrapeFailures (failed probes) and RequestFailures are the current
	// consecutive failure counts.
	ScrapeFailures, RequestFailures int
	// LastError is the last probe's error: wrapping ErrRefused,
	// ErrTimeout or ErrUnparseable, or a *StatusError, or another network
	// error ("GET URL: ..."); nil after a success.
	LastError error
	// Reason says in plain words, bounded in length, why the worker is
	// not ready or what is amiss with a ready one: the last probe's error;
	// else, when not ready, why it left ("3 consecutive requests
	// failed") or "not probed yet"; else why its engine load is unknown
	// (its metrics endpoint answers 404, or holds no engine metrics). ""
	// for a ready worker whose last probe had a load.
	Reason string
}

// Membership is what a Manager changes: the fleet of the Router
// (*router.Router implements it). AddWorker joins a worker as a new
// generation (fleet.Fleet.AddWorker's rules: an id already present is
// replaced); RemoveWorker takes the worker (id, data-parallel rank) out of
// the candidate set, its requests in flight finishing on their generation.
type Membership interface {
	AddWorker(s fleet.Spec) (*fleet.Worker, error)
	RemoveWorker(id shared.WorkerID, rank uint32) error
}

// Manager owns the Router's membership. Safe for concurrent use.
type Manager struct {
	r   Membership
	o   Options
	log hclog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	entries map[string]*entry
	// retired are the generations of workers removed from the
	// configuration that still have requests in flight, by name: their
	// active-requests series lasts until those finish, and a worker
	// configured again under the name takes them back.
	retired map[string][]*fleet.Worker
	closed  bool
}

// entry is one configured worker; its fields after done are guarded by
// Manager.mu.
type entry struct {
	cfg  config.Worker
	id   shared.WorkerID
	stop context.CancelFunc

	ready        bool
	member       *fleet.Worker   // current generation while ready
	gens         []*fleet.Worker // generations that may still have requests in flight
	scrapeFails  int
	requestFails int
	leftAt       time.Time // when it last left the candidate set
	obs          *fleet.EngineLoad
	obsAt        time.Time
	running      int64
	hasRunning   bool
	lastErr      error
	leftWhy      string // why it left the candidate set, or could not join
	noLoad       string // why the last successful probe had no load; "" when it had one
}

// NewManager returns a Manager of r's membership with no workers; Sync
// adds them. r's fleet must not be changed by anyone else while the
// Manager is in use.
func NewManager(r Membership, o Options) (*Manager, error) {
	if r == nil {
		return nil, errors.New("workers: nil router")
	}
	if o.ScrapeInterval <= 0 {
		o.ScrapeInterval = DefaultScrapeInterval
	}
	if o.FailureThreshold <= 0 {
		o.FailureThreshold = DefaultFailureThreshold
	}
	if o.Client == nil {
		// No proxy from the environment: scrapes reach the engines the way
		// requests do (router/upstream uses none).
		o.Client = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 2, IdleConnTimeout: 90 * time.Second}}
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Debounce <= 0 {
		o.Debounce = DefaultDebounce
	}
	m := &Manager{r: r, o: o, log: o.Logger, entries: make(map[string]*entry), retired: make(map[string][]*fleet.Worker)}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	if o.Registerer != nil {
		if err := o.Registerer.Register(collector{m}); err != nil {
			m.cancel()
			return nil, fmt.Errorf("workers: metrics: %w", err)
		}
	}
	return m, nil
}

// Close stops every scrape and watch loop and waits for them. The fleet is
// left as it is.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
}

// Sync makes ws the configured workers: it adds the new names, removes the
// names no longer listed (their requests in flight finish), and re-joins
// the changed ones. A worker whose url or metrics_url changed starts over
// as a new endpoint (not ready until its first scrape); one whose role,
// models or total_kv_blocks changed is replaced in the fleet at once by a
// new generation when it is ready (its prefix-index entries are purged).
// An unchanged worker is left alone. Sync checks ws first and changes
// nothing when a worker is invalid, two share a name, or two names hash to
// one id.
func (m *Manager) Sync(ws []config.Worker) error {
	if err := check(ws); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errors.New("workers: manager closed")
	}
	want := make(map[string]config.Worker, len(ws))
	for _, w := range ws {
		want[w.Name] = w
	}
	for name, e := range m.entries {
		if _, ok := want[name]; !ok {
			m.dropLocked(e, "removed from the configuration")
		}
	}
	for _, w := range ws {
		e := m.entries[w.Name]
		switch {
		case e == nil:
			m.startLocked(w)
			m.log.Info("worker added", "worker", w.Name, "url", w.URL, "role", w.Role, "models", w.Models)
		case e.cfg.Equal(w):
		case e.cfg.URL != w.URL || e.cfg.MetricsURL != w.MetricsURL:
			m.dropLocked(e, "endpoint changed")
			m.startLocked(w)
			m.log.Info("worker endpoint changed", "worker", w.Name, "url", w.URL)
		default:
			e.cfg = cloneWorker(w)
			if e.ready {
				m.joinLocked(e)
			}
			m.log.Info("worker changed", "worker", w.Name, "role", w.Role, "models", w.Models, "total_kv_blocks", w.TotalKVBlocks)
		}
	}
	return nil
}

func check(ws []config.Worker) error {
	names := make(map[string]hcl.Range, len(ws))
	ids := make(map[shared.WorkerID]string, len(ws))
	for _, w := range ws {
		first, dup := names[w.Name]
		switch {
		case w.Name == "":
			return errors.New("workers: a worker without a name")
		case dup && first.Filename != "" && w.Range.Filename != "":
			// router serve merges the policy file's worker blocks and the
			// workers file's; a name repeated in one file is a load error.
			return fmt.Errorf("workers: duplicate worker %q: declared at %s:%d:%d and at %s:%d:%d; worker names must be unique across the policy file and the workers file",
				w.Name, first.Filename, first.Start.Line, first.Start.Column, w.Range.Filename, w.Range.Start.Line, w.Range.Start.Column)
		case dup:
			return fmt.Errorf("workers: duplicate worker %q", w.Name)
		case w.URL == "" || w.MetricsURL == "":
			return fmt.Errorf("workers: worker %q: no url", w.Name)
		case !w.Role.Valid():
			return fmt.Errorf("workers: worker %q: invalid role %q", w.Name, w.Role)
		case w.TotalKVBlocks <= 0:
			return fmt.Errorf("workers: worker %q: total_kv_blocks %d, want > 0", w.Name, w.TotalKVBlocks)
		}
		if other, dup := ids[ID(w.Name)]; dup {
			return fmt.Errorf("workers: workers %q and %q have the same id; rename one", other, w.Name)
		}
		names[w.Name] = w.Range
		ids[ID(w.Name)] = w.Name
	}
	return nil
}

func cloneWorker(w config.Worker) config.Worker {
	w.Models = slices.Clone(w.Models)
	return w
}

// startLocked adds an entry for w and starts its scrape loop.
func (m *Manager) startLocked(w config.Worker) {
	ctx, stop := context.WithCancel(m.ctx)
	e := &entry{cfg: cloneWorker(w), id: ID(w.Name), stop: stop}
	e.gens, m.retired[w.Name] = m.retired[w.Name], nil
	delete(m.retired, w.Name)
	m.entries[w.Name] = e
	m.wg.Add(1)
	go m.run(ctx, e, cloneWorker(w))
}

// dropLocked stops e's loop and takes it out of the fleet and the Manager.
func (m *Manager) dropLocked(e *entry, why string) {
	e.stop()
	if e.ready {
		m.leaveLocked(e, why)
	}
	delete(m.entries, e.cfg.Name)
	if e.activeLocked() > 0 {
		m.retired[e.cfg.Name] = append(m.retired[e.cfg.Name], e.gens...)
	}
	if why != "endpoint changed" {
		m.log.Info("worker removed", "worker", e.cfg.Name, "reason", why)
	}
}

// joinLocked (re)joins e to the fleet as a new generation carrying its
// fresh engine report.
func (m *Manager) joinLocked(e *entry) {
	w, err := m.r.AddWorker(fleet.Spec{
		ID:            e.id,
		Role:          e.cfg.Role,
		TotalKVBlocks: e.cfg.TotalKVBlocks,
		Name:          e.cfg.Name,
		Models:        slices.Clone(e.cfg.Models),
	})
	if err != nil {
		m.log.Error("worker cannot join", "worker", e.cfg.Name, "error", err)
		e.leftWhy = "cannot join the fleet: " + err.Error()
		return
	}
	w.SetEngineLoad(e.obs)
	e.ready, e.member = true, w
	e.gens = append(e.gens, w)
	e.requestFails, e.leftWhy = 0, ""
}

// leaveLocked takes e out of the candidate set.
func (m *Manager) leaveLocked(e *entry, why string) {
	if err := m.r.RemoveWorker(e.id, 0); err != nil {
		m.log.Error("worker removal failed", "worker", e.cfg.Name, "error", err)
	}
	e.ready, e.member = false, nil
	e.leftAt, e.leftWhy = time.Now(), why
	m.log.Warn("worker not ready", "worker", e.cfg.Name, "reason", why)
}

// run probes w's engine every interval until ctx ends.
func (m *Manager) run(ctx context.Context, e *entry, w config.Worker) {
	defer m.wg.Done()
	t := time.NewTicker(m.o.ScrapeInterval)
	defer t.Stop()
	for {
		start := time.Now()
		sctx, cancel := context.WithTimeout(ctx, m.o.ScrapeInterval)
		rep, noLoad, err := probe(sctx, m.o.Client, w, m.o.ScrapeInterval)
		cancel()
		if ctx.Err() != nil {
			return
		}
		m.observe(e, start, rep, noLoad, err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// observe applies one probe's outcome to e.
func (m *Manager) observe(e *entry, start time.Time, rep Engine, noLoad string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.entries[e.cfg.Name] != e {
		return // removed or replaced meanwhile
	}
	now := time.Now()
	if err != nil {
		e.scrapeFails++
		if e.lastErr == nil || e.lastErr.Error() != err.Error() {
			m.log.Info("worker probe failed", "worker", e.cfg.Name, "reason", err.Error(),
				"ready", e.ready, "consecutive_failures", e.scrapeFails)
		}
		e.lastErr = err
		if e.ready && e.scrapeFails >= m.o.FailureThreshold {
			m.leaveLocked(e, fmt.Sprintf("%d consecutive probes failed: %v", e.scrapeFails, err))
		}
	} else {
		e.scrapeFails, e.lastErr = 0, nil
		switch {
		case noLoad != "" && e.noLoad != noLoad:
			m.log.Warn("worker engine load unknown: LOAD is unavailable, not idle", "worker", e.cfg.Name, "reason", noLoad)
		case noLoad == "" && e.noLoad != "":
			m.log.Info("worker engine load known again", "worker", e.cfg.Name)
		}
		e.noLoad = noLoad
		if rep.Load != nil {
			e.obs, e.obsAt = rep.Load, now
		}
		if rep.HasRunning {
			e.running, e.hasRunning = rep.Running, true
		}
		switch {
		case !e.ready && start.After(e.leftAt):
			m.joinLocked(e)
			if e.ready {
				m.log.Info("worker ready", "worker", e.cfg.Name, "generation", e.member.Generation)
			}
		case e.ready && rep.Load != nil:
			e.member.SetEngineLoad(rep.Load)
		}
	}
	if e.obs != nil && now.Sub(e.obsAt) > StaleIntervals*m.o.ScrapeInterval {
		e.obs = nil
		if e.member != nil {
			e.member.SetEngineLoad(nil)
		}
	}
}

// ReportFailure records that a request to the worker named name failed
// (connection refused, reset before any byte, a 5xx). FailureThreshold
// consecutive failures take it out of the candidate set until a scrape
// succeeds again. Unknown names and workers not ready are ignored.
func (m *Manager) ReportFailure(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[name]
	if e == nil || !e.ready {
		return
	}
	e.requestFails++
	if e.requestFails >= m.o.FailureThreshold {
		m.leaveLocked(e, fmt.Sprintf("%d consecutive requests failed", e.requestFails))
	}
}

// ReportSuccess records that a request to the worker named name succeeded,
// resetting its consecutive request failures.
func (m *Manager) ReportSuccess(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[name]; e != nil {
		e.requestFails = 0
	}
}

// URL returns the engine base URL of the configured worker named name
// (config.Worker.URL, without a trailing "/"), ready or not; false when no
// worker of that name is configured.
func (m *Manager) URL(name string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[name]; e != nil {
		return e.cfg.URL, true
	}
	return "", false
}

// Serves reports whether some configured worker, ready or not, lists
// model: serve answers 404 for a model nobody serves and 503 for one whose
// workers are all not ready.
func (m *Manager) Serves(model string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.entries {
		if slices.Contains(e.cfg.Models, model) {
			return true
		}
	}
	return false
}

// Models returns the models the configured workers list, ready or not:
// sorted, each once.
func (m *Manager) Models() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, e := range m.entries {
		out = append(out, e.cfg.Models...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Status returns every configured worker's state, sorted by name.
func (m *Manager) Status() []Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Status, 0, len(m.entries))
	for _, e := range m.entries {
		out = append(out, e.statusLocked())
	}
	slices.SortFunc(out, func(a, b Status) int {
		switch {
		case a.Config.Name < b.Config.Name:
			return -1
		case a.Config.Name > b.Config.Name:
			return 1
		}
		return 0
	})
	return out
}

// StatusOf returns the state of the worker named name.
func (m *Manager) StatusOf(name string) (Status, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[name]
	if e == nil {
		return Status{}, false
	}
	return e.statusLocked(), true
}

func (e *entry) statusLocked() Status {
	s := Status{
		Config: cloneWorker(e.cfg), ID: e.id, Ready: e.ready, Member: e.member,
		Load: e.obs, ObservedAt: e.obsAt, Running: e.running, HasRunning: e.hasRunning,
		ScrapeFailures: e.scrapeFails, RequestFailures: e.requestFails, LastError: e.lastErr,
	}
	if s.Load == nil {
		s.ObservedAt = time.Time{}
	}
	switch {
	case e.lastErr != nil:
		s.Reason = e.lastErr.Error()
	case !e.ready && e.leftWhy != "":
		s.Reason = e.leftWhy
	case !e.ready:
		s.Reason = "not probed yet"
	default:
		s.Reason = e.noLoad
	}
	return s
}

// activeLocked sums the requests in flight over e's generations, forgetting
// past generations with none.
func (e *entry) activeLocked() int64 {
	var n int64
	kept := e.gens[:0]
	for _, w := range e.gens {
		a := w.ActiveRequests()
		n += a
		if a != 0 || w == e.member {
			kept = append(kept, w)
		}
	}
	clear(e.gens[len(kept):])
	e.gens = kept
	return n
}

var (
	readyDesc = prometheus.NewDesc("switchyard_worker_ready",
		"1 when the worker is in the candidate set, 0 when it is configured but not ready.", []string{"worker"}, nil)
	activeDesc = prometheus.NewDesc("switchyard_worker_active_requests",
		"Requests in flight on the worker (ACTIVE_REQUESTS), over every generation it joined under; a worker removed from the configuration keeps its series until its requests finish.", []string{"worker"}, nil)
)

// collector reads the Manager's state at each collection.
type collector struct{ m *Manager }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- readyDesc
	ch <- activeDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	for name, e := range c.m.entries {
		ready := 0.0
		if e.ready {
			ready = 1
		}
		ch <- prometheus.MustNewConstMetric(readyDesc, prometheus.GaugeValue, ready, name)
		ch <- prometheus.MustNewConstMetric(activeDesc, prometheus.GaugeValue, float64(e.activeLocked()), name)
	}
	for name, gens := range c.m.retired {
		var n int64
		kept := gens[:0]
		for _, w := range gens {
			if a := w.ActiveRequests(); a != 0 {
				n += a
				kept = append(kept, w)
			}
		}
		clear(gens[len(kept):])
		if len(kept) == 0 {
			delete(c.m.retired, name)
			continue
		}
		c.m.retired[name] = kept
		ch <- prometheus.MustNewConstMetric(activeDesc, prometheus.GaugeValue, float64(n), name)
	}
}
