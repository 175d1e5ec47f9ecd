// Package workers owns the router's worker membership for `router serve`:
// it joins the workers of the policy file's worker blocks (or of a watched
// --workers-file) to the Router's fleet, scrapes each engine's Prometheus
// metrics into its engine load and capacity, reads the models it serves,
// and takes workers that stop answering out of the candidate set until
// they answer again.
//
// # Identity
//
// A worker's shared.WorkerID is shared.WorkerIDOf(name), the FNV-1a 64-bit
// hash of its block (or pod) name, the id router replay gives a simulated
// worker of that name too, so a worker keeps its id across reloads and rejoins and the
// same file gives the same ids in every router process.
//
// # Data-parallel ranks
//
// An engine whose metrics carry vLLM's engine="N" label, or SGLang's
// dp_rank="N", with several N (or an N other than 0) reports
// data-parallel ranks (Engine.Ranked): each rank is a fleet member of its
// own, fleet.Spec{ID, DPRank: N}, with its own engine load (waiting, KV
// usage and running from its own series) and capacity, so a full rank
// never makes its siblings look busy. Requests to such a worker name the
// chosen rank (serve sends X-Data-Parallel-Rank, which vLLM's API server
// and SGLang's both honour). An engine whose metrics give no ranks (SGLang
// without --enable-metrics) has the ranks of the KV-event sources it
// reports, when they name several. An engine without ranks is one member
// of rank 0. Ranks follow the engine's report: a rank that appears joins,
// one that disappears leaves. Readiness is the engine's: every rank joins
// and leaves with its probe.
//
// SGLang is modelled as vLLM is: each data-parallel rank (attention DP
// rank with --enable-dp-attention) has its own scheduler, KV cache and
// KV-event publisher (port base + rank), and SGLang's
// DataParallelController sends a request without a rank round-robin over
// the ranks (load_balance_method "auto" or "round_robin"), blind to what
// each caches; a request naming its rank (X-Data-Parallel-Rank, or the
// body's routed_dp_rank) goes to that rank
// (maybe_external_dp_rank_routing). See docs/kv-events.md, "SGLang with
// data parallelism".
//
// # Discovery
//
// A worker block needs only a url. Models: the block's models, else the
// engine's GET url + "/v1/models" (the OpenAI list; each data[].id, LoRA
// adapters included), read before the worker first joins, again whenever
// it rejoins, and every ModelsInterval (DefaultModelsInterval, 30 s) while
// it is ready; a changed list rejoins the worker as a new generation with
// the new models. A worker whose models are unknown (the block sets none
// and the engine's list could not be read) is not ready; a re-read that
// fails keeps the last list. Capacity: the block's total_kv_blocks, else
// the engine's (ParseEngine: vLLM cache_config_info, SGLang
// max_total_num_tokens) in blocks of Options.BlockSize, or of the engine's
// own block size when that is 0 (RouterBlocks); until the engine reports it the worker is routable
// with TotalKVBlocks 0, CAPACITY unavailable. A capacity or engine block
// size that changes rejoins the rank.
//
// Model cards: the engine's /v1/models is read for its cards too (a LoRA
// adapter's parent, a model's root and max_model_len; ModelCard), also
// for a block that sets its models, whose read failing is then no
// failure. Parent and ModelCards read them; BlockSize gives a model's
// engine block size (the smallest when its ready workers disagree).
//
// KV-event publishers: unless the block has a kv_events block, the
// engine is asked for them (discover: vLLM's GET url/kv_event_sources,
// else SGLang's GET url/server_info or url/get_server_info) before the
// worker first joins, again at every rejoin, after an engine restart,
// every ModelsInterval, and sourcesRetryIntervals probes after a failed
// ask; a change, and the first answer, go to Options.KVSources. The
// engine's discovery endpoint can also give its block size (SGLang's
// kv_events.block_size or page_size), which then wins over its metrics'.
//
// # Restarts
//
// Each probe's metrics are compared with the last ones that carried the
// restart signals (Restarted): process_start_time_seconds increasing, or
// a monotonic counter going back, is an engine restart, even one that
// happened while the probes failed. It is logged at info ("worker engine
// restarted", with the reason), counted in Status.EngineRestarts, handed
// to Options.EngineRestarted, and the engine's models and KV-event
// publishers are read again at once.
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
// A probe that times out while the router process itself was held up
// for a quarter of the timeout or more is not counted (neither a failure
// nor a success): the router measures how much later than asked a timer
// of its own wakes up (every tenth of the scrape interval, between 5 ms
// and 100 ms), which CPU starvation, a CPU limit's throttling or a long
// pause delays, and a deadline missed while the router could not run says
// nothing of the engine. A machine saturated by other processes otherwise
// takes every healthy worker out of the candidate set at once. Such a
// probe is logged ("worker probe not counted") and is the worker's
// Status.Reason. Once a ready worker has had no successful probe for
// HeldUpIntervals scrape intervals, its timeouts count again however held
// up the router is, so an engine that hangs on a router that is starved
// for good still leaves.
//
// Logged at info: a worker's first failed probe and each probe failing
// for another reason than the one before (connection refused, HTTP status
// N from the metrics or health URL, metrics unparseable or too large,
// timeout), never a repeat of the same failure; likewise a timeout not
// counted; it joining ("worker ready"). At warn: it
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
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/upstream"
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
	// DefaultMaxEjectedPercent bounds the share of the configured workers
	// that request failures may hold out of the candidate set at once
	// (at least one worker whatever the share): Envoy's outlier
	// detection default (max_ejection_percent, 10%, "will eject at least
	// one host regardless of the value"). A request that fails on every
	// engine it reaches (one whose prompt crashes or resets engines) would
	// otherwise take each of them out in turn, and three such requests
	// empty a three-worker fleet; probes are not bounded so, and take out
	// every engine that is down.
	DefaultMaxEjectedPercent = 10
	// StaleIntervals is the age, in scrape intervals, at which an engine
	// report is cleared.
	StaleIntervals = 3
	// DefaultDebounce is how long Watch waits after the last change to the
	// workers file before reloading it.
	DefaultDebounce = 100 * time.Millisecond
	// DefaultModelsInterval is how often a ready worker without models in
	// its block has its engine's /v1/models read again.
	DefaultModelsInterval = 30 * time.Second
	// HeldUpIntervals bounds, in scrape intervals, how long a ready
	// worker's probe timeouts go uncounted while the router itself is held
	// up (see Readiness in the package doc): once the worker has had no
	// successful probe for this long, its timeouts count again however
	// held up the router is (30 s at the default interval).
	HeldUpIntervals = 30
)

// Options configure a Manager.
type Options struct {
	// ScrapeInterval is the probe period and each probe's timeout
	// (DefaultScrapeInterval).
	ScrapeInterval time.Duration
	// FailureThreshold is the consecutive failures that make a worker not
	// ready (DefaultFailureThreshold).
	FailureThreshold int
	// MaxEjectedPercent bounds the workers held out by request failures
	// (ReportFailure) at once, as a percentage of the configured workers,
	// at least one (DefaultMaxEjectedPercent; 0 takes the default, 100
	// bounds nothing). A worker at the threshold past the bound stays in
	// (logged once until it succeeds or leaves); its probes still take
	// it out when its engine is down.
	MaxEjectedPercent int
	// Client scrapes the engines; nil uses a client of its own that,
	// unlike http.DefaultTransport, ignores HTTP_PROXY (the engines'
	// requests take no proxy either) and closes connections idle for
	// upstream.DefaultIdleTimeout.
	Client *http.Client
	// Logger receives membership changes, failed probes and readiness
	// changes with their reasons (see Readiness), and workers file reload
	// failures (with file:line:col); nil discards them.
	Logger hclog.Logger
	// Registerer, when set, gets switchyard_worker_ready{worker} (1 ready,
	// 0 not) and switchyard_worker_active_requests{worker} (the requests in
	// flight on the worker, over every generation it joined under), and
	// per worker and data-parallel rank (labels worker, rank) the engine's
	// view: switchyard_worker_engine_kv_usage (0..1),
	// switchyard_worker_engine_waiting_requests and
	// switchyard_worker_engine_running_requests (while the engine's report
	// is fresh), switchyard_worker_capacity_blocks (router blocks; 0
	// unknown), switchyard_worker_engine_report_age_seconds (since the
	// last report with a load), switchyard_worker_engine_load_available
	// (1 or 0), and, with Streams, switchyard_worker_kv_events_total,
	// switchyard_worker_kv_event_gaps_total and
	// switchyard_worker_kv_event_malformed_total. All are read from the current
	// state at each collection.
	Registerer prometheus.Registerer
	// Debounce is Watch's quiet period (DefaultDebounce).
	Debounce time.Duration
	// BlockSize is the policy file's router.block_size when it sets one
	// (router.Router.BlockSizeOverride), the unit engine capacities are
	// converted to; 0 converts each rank's capacity to its engine's own
	// block size (the blocks its requests are keyed in), and to
	// config.DefaultBlockSize while the engine has not reported one
	// (router.Router.CapacityBlockSize follows the same rule).
	BlockSize int
	// ModelsInterval is how often a ready worker's engine models are read
	// again (DefaultModelsInterval).
	ModelsInterval time.Duration
	// Streams, when set, reports a candidate's KV-event stream (false:
	// it has none). The KV-event subscriber provides it; Status, /metrics
	// and /debug/workers read it at each call, without the Manager's lock
	// held. It must not block.
	Streams func(id shared.WorkerID, rank uint32) (EventStream, bool)
	// IndexBlocks, when set, reports the prefix-index entries (blocks)
	// the router holds for a candidate (false: unknown). Read like
	// Streams; it must not block.
	IndexBlocks func(id shared.WorkerID, rank uint32) (int64, bool)
	// Departed, when set, is called after a Sync with each engine base
	// URL (config.Worker.URL) that a configured worker had before it and
	// none has after it: a worker removed, or moved to another URL. The
	// caller closes what it keeps for the address (the requests'
	// transport: upstream.Transport.CloseIdleConnectionsTo). Called
	// without the Manager's lock, on Sync's goroutine; it must not block.
	Departed func(url string)
	// KVSources, when set, is called with the KV-event publishers a
	// worker's engine reports (see KVSource and Discovery in the package
	// doc), sorted by rank: after its first discovery (nil when the
	// engine reports none), and again whenever they change. It is called
	// with nil when they no longer apply: the worker left the
	// configuration, or its block gained a kv_events block (which then
	// overrides discovery; a worker with one is never discovered). Calls
	// come in order, one at a time, from one goroutine of the Manager,
	// never under its lock (Status, BlockSize and the like may be called
	// from it); it must not block for long, and must not call Close,
	// which waits for that goroutine. Calls still queued at Close are
	// dropped.
	KVSources func(worker string, sources []KVSource)
	// EngineRestarted, when set, is called with a worker's name when its
	// engine's metrics show that it restarted between two probes (see
	// Restarted): process_start_time_seconds increased, or a monotonic
	// counter went back. It is ordered with KVSources (a restart first,
	// then the sources read again after it) and called the same way.
	EngineRestarted func(worker string)
}

// EventStream is a candidate's KV-event stream as the subscriber reports
// it (Options.Streams).
type EventStream struct {
	// State is the stream's state in words: "connecting" (no connection
	// to the engine's endpoint), "cold" (never synced, or after a gap
	// without replay: scored approximately) or "live".
	State string `json:"state"`
	// Received counts the KV events received; Gaps the sequence gaps seen.
	Received uint64 `json:"events_received"`
	Gaps     uint64 `json:"sequence_gaps"`
	// Evicted counts blocks the router's index dropped at its bound
	// (the engine's removals missed); Skipped, stored blocks it could not
	// key (another tier or block size, an unknown parent, malformed).
	Evicted uint64 `json:"blocks_evicted"`
	Skipped uint64 `json:"blocks_skipped"`
	// Malformed counts the engine's messages that were dropped as
	// malformed: not [topic, sequence, payload], or a payload that does
	// not decode (which also clears the candidate's precise index).
	Malformed uint64 `json:"malformed_messages"`
}

// Status is a snapshot of one configured worker.
type Status struct {
	Config config.Worker
	ID     shared.WorkerID
	// Ready is true while the worker is a member of the fleet (every rank
	// of it).
	Ready bool
	// Models are the models the worker is routed for: Config.Models when
	// set, else the engine's list (sorted); nil while unknown.
	// ModelsSource says which: "config", "engine", or "" while unknown.
	Models       []string
	ModelsSource string
	// Ranked is true when the engine reports data-parallel ranks
	// (Engine.Ranked): requests to it name their rank.
	Ranked bool
	// Ranks are the worker's candidates, one per data-parallel rank in
	// ascending order; one, rank 0, for an engine without ranks.
	Ranks []RankStatus
	// Member, Load, ObservedAt, Running and HasRunning are those of
	// Ranks[0] (the only rank of an engine without ranks).
	Member     *fleet.Worker
	Load       *fleet.EngineLoad
	ObservedAt time.Time
	Running    int64
	HasRunning bool
	// ScrapeFailures (failed probes) and RequestFailures are the current
	// consecutive failure counts.
	ScrapeFailures, RequestFailures int
	// KVSources are the KV-event publishers the engine reported, sorted
	// by rank (Options.KVSources); nil when it reported none, has not
	// been asked yet, or the block has a kv_events block.
	// KVSourcesFrom is the endpoint that answered; "" when none did.
	KVSources     []KVSource
	KVSourcesFrom string
	// EngineRestarts counts the engine restarts its metrics showed
	// (Restarted) since the worker was configured; LastRestart is when
	// the last was seen (zero when none was).
	EngineRestarts uint64
	LastRestart    time.Time
	// LastError is the last probe's error: wrapping ErrRefused,
	// ErrTimeout, ErrUnparseable, ErrTooLarge or ErrModels, or a
	// *StatusError, or another network error ("GET URL: ..."); nil after
	// a success.
	LastError error
	// Reason says in plain words, bounded in length, why the worker is
	// not ready or what is amiss with a ready one: the last probe's error;
	// else, when not ready, why it left ("3 consecutive requests
	// failed") or "not probed yet"; else why its engine load is unknown
	// (its metrics endpoint answers 404, or holds no engine metrics), or
	// why its models were not re-read. "" for a ready worker whose last
	// probe had a load.
	Reason string
}

// RankStatus is one data-parallel rank of a worker: one fleet candidate.
type RankStatus struct {
	Rank uint32
	// Member is the rank's current fleet generation; nil when not ready.
	Member *fleet.Worker
	// Load is the rank's last engine report while it is fresh; nil
	// otherwise. ObservedAt is when it was scraped (zero when Load is
	// nil); LastReport when the last report with a load arrived, fresh or
	// not (zero when none ever did).
	Load       *fleet.EngineLoad
	ObservedAt time.Time
	LastReport time.Time
	// Running is the rank's running-request count while its report is
	// fresh; HasRunning is false otherwise.
	Running    int64
	HasRunning bool
	// TotalKVBlocks is the rank's capacity in router blocks, 0 while
	// unknown; CapacitySource is "config" (total_kv_blocks), "engine"
	// (its metrics), or "" while unknown.
	TotalKVBlocks  int64
	CapacitySource string
	// EngineBlockSize is the engine's KV block size in tokens; 0 while
	// unknown.
	EngineBlockSize int64
	// Events is the rank's KV-event stream (Options.Streams); nil when
	// it has none or Streams is unset.
	Events *EventStream
	// IndexBlocks is the prefix-index entries held for the rank
	// (Options.IndexBlocks); HasIndexBlocks is false when unknown.
	IndexBlocks    int64
	HasIndexBlocks bool
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
	// dirty is set when something view reads changed: a member joined or
	// left, or a worker's models or model cards changed; unlock
	// recomputes view then.
	dirty bool
	// warnedSizes is, by model, the engine block sizes last warned about
	// as disagreeing.
	warnedSizes map[string]string
	// notes are the KVSources and EngineRestarted calls not made yet, in
	// order; the notify goroutine makes them (noteCh wakes it).
	notes  []note
	noteCh chan struct{}

	// view is what the per-request lookups read (BlockSize, Parent,
	// ModelCards), rebuilt under mu when dirty, read without it.
	view atomic.Pointer[view]

	// held measures how long the router was held up (heldUp); started
	// with the first probe loop.
	held *heldUp
}

// note is one call of Options.KVSources (restarted false) or
// Options.EngineRestarted.
type note struct {
	worker    string
	restarted bool
	sources   []KVSource
}

// view is the Manager's per-model summary (Manager.view).
type view struct {
	// blockSize is each model's engine block size (BlockSize).
	blockSize map[string]int
	// cards are the models' cards, by id; list sorted by id.
	cards map[string]ModelCard
	list  []ModelCard
	// urls are the configured workers' engine base URLs, by name (URL),
	// and entries the workers (ReportSuccess reads their failing flag).
	urls    map[string]string
	entries map[string]*entry
}

// entry is one configured worker; its fields after done are guarded by
// Manager.mu.
type entry struct {
	cfg  config.Worker
	id   shared.WorkerID
	stop context.CancelFunc

	ready        bool
	ranked       bool
	ranks        []*rankState    // ascending by rank, never empty
	gens         []*fleet.Worker // generations that may still have requests in flight
	scrapeFails  int
	requestFails int
	// failing is requestFails > 0 or kept, readable without the lock:
	// ReportSuccess, once per request, takes the lock only then.
	failing atomic.Bool
	// ejected: it left for request failures (ReportFailure) and has not
	// joined since; kept: it reached the threshold while the ejection
	// bound held it in (logged once).
	ejected, kept bool
	leftAt        time.Time // when it last left the candidate set
	probedOK      time.Time // when a probe last succeeded
	lastErr       error
	leftWhy       string      // why it left the candidate set, or could not join
	noLoad        string      // why the last successful probe had no load; "" when it had one
	models        []string    // the engine's models, sorted; nil until read
	cards         []ModelCard // the engine's model cards, sorted by id; nil until read
	modelsAt      time.Time   // when they were last read
	modelsWhy     string      // why the last re-read failed; "" when it did not

	// The engine's KV-event publishers (discover).
	srcAt       time.Time  // when they were last asked for; zero: never
	srcFailed   bool       // the last ask failed
	srcWhy      string     // why the last ask failed, or which sources were skipped
	srcReported bool       // KVSources was called with sources
	sources     []KVSource // the last reported
	srcFrom     string     // the endpoint that answered
	infoBlock   int64      // the block size the discovery endpoint reported; 0 unknown

	restarts    uint64    // engine restarts seen
	lastRestart time.Time // when the last was seen
}

// rankState is one data-parallel rank of an entry; guarded by Manager.mu.
type rankState struct {
	rank       uint32
	member     *fleet.Worker // current generation while ready
	obs        *fleet.EngineLoad
	obsAt      time.Time
	lastAt     time.Time // last report with a load, fresh or not
	running    int64
	hasRunning bool
	capTokens  int64 // engine-reported capacity in tokens; 0 unknown
	blockSize  int64 // engine block size in tokens; 0 unknown
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
	if o.MaxEjectedPercent <= 0 || o.MaxEjectedPercent > 100 {
		o.MaxEjectedPercent = DefaultMaxEjectedPercent
	}
	if o.FailureThreshold <= 0 {
		o.FailureThreshold = DefaultFailureThreshold
	}
	if o.Client == nil {
		// No proxy from the environment: scrapes reach the engines the way
		// requests do (router/upstream uses none). Idle connections close
		// after the requests' idle timeout, below the engines' keep-alive
		// timeout, so that a departed engine's do not stay open long.
		o.Client = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 2, IdleConnTimeout: upstream.DefaultIdleTimeout}}
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Debounce <= 0 {
		o.Debounce = DefaultDebounce
	}
	if o.BlockSize < 0 {
		o.BlockSize = 0
	}
	if o.ModelsInterval <= 0 {
		o.ModelsInterval = DefaultModelsInterval
	}
	m := &Manager{r: r, o: o, log: o.Logger, entries: make(map[string]*entry), retired: make(map[string][]*fleet.Worker),
		warnedSizes: map[string]string{}, noteCh: make(chan struct{}, 1),
		held: newHeldUp(heldUpTick(o.ScrapeInterval))}
	m.view.Store(&view{})
	m.ctx, m.cancel = context.WithCancel(context.Background())
	if o.Registerer != nil {
		if err := o.Registerer.Register(collector{m}); err != nil {
			m.cancel()
			return nil, fmt.Errorf("workers: metrics: %w", err)
		}
	}
	if o.KVSources != nil || o.EngineRestarted != nil {
		m.wg.Add(1)
		go m.notify()
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
// the changed ones; then it hands the base URLs no worker has any more to
// Options.Departed. A worker whose url or metrics_url changed starts over
// as a new endpoint (not ready until its first scrape); one whose role,
// models or total_kv_blocks changed is replaced in the fleet at once by a
// new generation when it is ready (its prefix-index entries are purged);
// one whose kv_events block alone changed keeps its generation.
// An unchanged worker is left alone. Sync checks ws first and changes
// nothing when a worker is invalid, two share a name, or two names hash to
// one id.
func (m *Manager) Sync(ws []config.Worker) error {
	departed, err := m.sync(ws)
	if err != nil {
		return err
	}
	if m.o.Departed != nil {
		for _, u := range departed {
			m.o.Departed(u)
		}
	}
	return nil
}

// sync is Sync under the Manager's lock; it returns the base URLs that
// left, sorted.
func (m *Manager) sync(ws []config.Worker) ([]string, error) {
	if err := check(ws); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.unlock()
	if m.closed {
		return nil, errors.New("workers: manager closed")
	}
	m.dirty = true // models and membership may change
	before := make(map[string]bool, len(m.entries))
	for _, e := range m.entries {
		before[e.cfg.URL] = true
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
			if (e.cfg.KVEvents == nil) != (w.KVEvents == nil) {
				// The block gained a kv_events block, which overrides
				// discovery, or lost it: discovery starts over.
				m.withdrawSourcesLocked(e)
			}
			e.cfg = cloneWorker(w)
			if e.ready && !m.reconcileLocked(e) {
				m.leaveLocked(e, e.leftWhy)
			}
			m.log.Info("worker changed", "worker", w.Name, "role", w.Role, "models", w.Models, "total_kv_blocks", w.TotalKVBlocks)
		}
	}
	for _, w := range ws {
		delete(before, w.URL)
	}
	return slices.Sorted(maps.Keys(before)), nil
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
		case w.TotalKVBlocks < 0:
			return fmt.Errorf("workers: worker %q: total_kv_blocks %d, want > 0 (or 0: from the engine)", w.Name, w.TotalKVBlocks)
		case w.Models != nil && len(w.Models) == 0:
			return fmt.Errorf("workers: worker %q: an empty models list (nil: from the engine)", w.Name)
		}
		if other, dup := ids[shared.WorkerIDOf(w.Name)]; dup {
			return fmt.Errorf("workers: workers %q and %q have the same id; rename one", other, w.Name)
		}
		names[w.Name] = w.Range
		ids[shared.WorkerIDOf(w.Name)] = w.Name
	}
	return nil
}

func cloneWorker(w config.Worker) config.Worker {
	w.Models = slices.Clone(w.Models)
	w.Labels = maps.Clone(w.Labels)
	if w.KVEvents != nil {
		k := *w.KVEvents
		w.KVEvents = &k
	}
	return w
}

// startLocked adds an entry for w and starts its scrape loop.
func (m *Manager) startLocked(w config.Worker) {
	ctx, stop := context.WithCancel(m.ctx)
	e := &entry{cfg: cloneWorker(w), id: shared.WorkerIDOf(w.Name), stop: stop, ranks: []*rankState{{}}}
	e.gens, m.retired[w.Name] = m.retired[w.Name], nil
	delete(m.retired, w.Name)
	m.entries[w.Name] = e
	if w.GivenURL != "" {
		m.log.Info("worker url normalised to the engine's base URL: the router appends /v1/chat/completions, /v1/models, /metrics and the other paths itself",
			"worker", w.Name, "given", w.GivenURL, "url", w.URL)
	}
	m.held.start(m.ctx, &m.wg)
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
	m.withdrawSourcesLocked(e)
	if e.activeLocked() > 0 {
		m.retired[e.cfg.Name] = append(m.retired[e.cfg.Name], e.gens...)
	}
	if why != "endpoint changed" {
		m.log.Info("worker removed", "worker", e.cfg.Name, "reason", why)
	}
}

// modelsLocked returns the models e is routed for and where they came
// from: its block's, else its engine's (nil, "" while unknown).
func (e *entry) modelsLocked() ([]string, string) {
	switch {
	case e.cfg.Models != nil:
		return e.cfg.Models, "config"
	case e.models != nil:
		return e.models, "engine"
	}
	return nil, ""
}

// capacityLocked returns rs's capacity in its blocks and where it came
// from: the block's total_kv_blocks, else the engine's report converted
// (RouterBlocks) to Options.BlockSize, else to the engine's own block
// size, else to config.DefaultBlockSize; else 0 and "".
func (m *Manager) capacityLocked(e *entry, rs *rankState) (int64, string) {
	if e.cfg.TotalKVBlocks > 0 {
		return e.cfg.TotalKVBlocks, "config"
	}
	unit := int64(m.o.BlockSize)
	if unit <= 0 {
		unit = rs.blockSize
	}
	if unit <= 0 {
		unit = config.DefaultBlockSize
	}
	if n := RouterBlocks(rs.capTokens, unit); n > 0 {
		return n, "engine"
	}
	return 0, ""
}

// specLocked is the fleet.Spec rs should be a member under.
func (m *Manager) specLocked(e *entry, rs *rankState) fleet.Spec {
	models, _ := e.modelsLocked()
	blocks, _ := m.capacityLocked(e, rs)
	return fleet.Spec{
		ID: e.id, DPRank: rs.rank, Role: e.cfg.Role, TotalKVBlocks: blocks,
		Name: e.cfg.Name, Models: slices.Clone(models), EngineBlockSize: e.blockSizeLocked(rs), DataParallel: e.ranked,
		Labels: e.cfg.Labels,
	}
}

// blockSizeLocked is rs's engine block size in tokens: the one the
// engine's discovery endpoint reported (SGLang's /server_info: the size its
// KV events are hashed at), else its metrics' (vLLM's cache_config_info
// block_size, SGLang's page_size); 0 unknown.
func (e *entry) blockSizeLocked(rs *rankState) int64 {
	if e.infoBlock > 0 {
		return e.infoBlock
	}
	return rs.blockSize
}

func sameSpec(a, b fleet.Spec) bool {
	return a.ID == b.ID && a.DPRank == b.DPRank && a.Role == b.Role && a.TotalKVBlocks == b.TotalKVBlocks &&
		a.Name == b.Name && slices.Equal(a.Models, b.Models) && a.EngineBlockSize == b.EngineBlockSize &&
		a.DataParallel == b.DataParallel && maps.Equal(a.Labels, b.Labels)
}

// joinLocked joins every rank of e to the fleet as a new generation
// carrying its fresh engine report.
func (m *Manager) joinLocked(e *entry) {
	e.ready = true
	if !m.reconcileLocked(e) {
		m.leaveLocked(e, e.leftWhy)
		return
	}
	e.requestFails, e.leftWhy, e.ejected, e.kept = 0, "", false, false
	e.failing.Store(false)
}

// reconcileLocked makes the fleet hold each rank of the ready e under its
// current spec: a rank without a member, or whose spec changed (models,
// capacity, role), joins as a new generation; the others get their fresh
// engine load. It reports false, with e.leftWhy set, when the fleet
// refused a rank.
func (m *Manager) reconcileLocked(e *entry) bool {
	for _, rs := range e.ranks {
		want := m.specLocked(e, rs)
		if rs.member != nil && sameSpec(rs.member.Spec, want) {
			rs.member.SetEngineLoad(rs.obs)
			continue
		}
		w, err := m.r.AddWorker(want)
		if err != nil {
			m.log.Error("worker cannot join", "worker", e.cfg.Name, "rank", rs.rank, "error", err)
			e.leftWhy = "cannot join the fleet: " + err.Error()
			return false
		}
		if rs.member != nil {
			m.log.Info("worker changed", "worker", e.cfg.Name, "rank", rs.rank, "models", want.Models,
				"total_kv_blocks", want.TotalKVBlocks, "generation", w.Generation)
		}
		w.SetEngineLoad(rs.obs)
		rs.member = w
		e.gens = append(e.gens, w)
		m.dirty = true
	}
	return true
}

// leaveLocked takes every rank of e out of the candidate set.
func (m *Manager) leaveLocked(e *entry, why string) {
	for _, rs := range e.ranks {
		m.removeRankLocked(e, rs)
	}
	e.ready = false
	e.leftAt, e.leftWhy = time.Now(), why
	m.log.Warn("worker not ready", "worker", e.cfg.Name, "reason", why)
}

// removeRankLocked takes rs's member, if any, out of the fleet.
func (m *Manager) removeRankLocked(e *entry, rs *rankState) {
	if rs.member == nil {
		return
	}
	if err := m.r.RemoveWorker(e.id, rs.rank); err != nil {
		m.log.Error("worker removal failed", "worker", e.cfg.Name, "rank", rs.rank, "error", err)
	}
	rs.member = nil
	m.dirty = true
}

// outcome is one probe's result.
type outcome struct {
	rep    Engine
	noLoad string
	err    error
	// heldUp is how long the router was held up while the probe ran
	// (heldUp).
	heldUp time.Duration
	// fetched is true when the engine's models were read: cards, or
	// modelsErr.
	fetched   bool
	cards     []ModelCard
	modelsErr error
	// discovered is true when the engine was asked for its KV-event
	// publishers: disc, or discErr.
	discovered bool
	disc       discovery
	discErr    error
	// restarted is true when the engine's metrics show a restart since
	// the last report with restart signals (Restarted), restartWhy why.
	restarted  bool
	restartWhy string
}

// sourcesRetryIntervals is the scrape intervals after which a failed ask
// for an engine's KV-event publishers is made again.
const sourcesRetryIntervals = 5

// due reports what a successful probe of e started at now reads besides
// the metrics. Models: when the block sets none, while they are unknown,
// or e is not ready (it will join with a fresh list), or ModelsInterval
// passed; when the block sets them, the engine's model cards the same way,
// but once per ModelsInterval however the read went. KV-event publishers,
// unless the block has a kv_events block: when never asked, at a rejoin,
// after a failed ask (sourcesRetryIntervals later), and every
// ModelsInterval. Both are read again after an engine restart.
func (m *Manager) due(e *entry, now time.Time, restarted bool) (models, sources bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	stale := now.Sub(e.modelsAt) >= m.o.ModelsInterval
	if e.cfg.Models == nil {
		models = e.models == nil || !e.ready || stale
	} else {
		models = e.modelsAt.IsZero() || !e.ready || stale
	}
	if e.cfg.KVEvents == nil {
		since := now.Sub(e.srcAt)
		sources = e.srcAt.IsZero() || !e.ready && e.leftAt.After(e.srcAt) || since >= m.o.ModelsInterval ||
			e.srcFailed && since >= sourcesRetryIntervals*m.o.ScrapeInterval
	}
	return models || restarted, sources || restarted && e.cfg.KVEvents == nil
}

// run probes w's engine every interval until ctx ends.
func (m *Manager) run(ctx context.Context, e *entry, w config.Worker) {
	defer m.wg.Done()
	t := time.NewTicker(m.o.ScrapeInterval)
	defer t.Stop()
	// signals is the last report with restart signals, kept across failed
	// probes so that a restart while the engine was down is seen.
	var signals Engine
	for {
		start := time.Now()
		var o outcome
		held := m.held.held()
		sctx, cancel := context.WithTimeout(ctx, m.o.ScrapeInterval)
		o.rep, o.noLoad, o.err = probe(sctx, m.o.Client, w, m.o.ScrapeInterval)
		cancel()
		o.heldUp = m.held.held() - held
		if o.err == nil && (o.rep.StartTime > 0 || len(o.rep.Counters) > 0) {
			if signals.StartTime > 0 || len(signals.Counters) > 0 {
				o.restartWhy, o.restarted = Restarted(signals, o.rep)
			}
			signals = Engine{StartTime: o.rep.StartTime, Counters: o.rep.Counters}
		}
		if o.err == nil {
			models, sources := m.due(e, start, o.restarted)
			if models {
				mctx, cancel := context.WithTimeout(ctx, m.o.ScrapeInterval)
				o.cards, o.modelsErr = fetchModels(mctx, m.o.Client, w.URL+"/v1/models", m.o.ScrapeInterval)
				o.fetched = true
				cancel()
			}
			if sources && ctx.Err() == nil {
				// Up to three GETs (vLLM's, then SGLang's two), each
				// within the interval.
				dctx, cancel := context.WithTimeout(ctx, 3*m.o.ScrapeInterval)
				o.disc, o.discErr = discover(dctx, m.o.Client, w.URL, m.o.ScrapeInterval)
				o.discovered = true
				cancel()
			}
		}
		if ctx.Err() != nil {
			return
		}
		m.observe(e, start, o)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// notCounted ends the reason of a probe timeout that observe did not
// count against its worker.
const notCounted = "(not counted: the router itself was held up for a quarter of the time or more)"

// observe applies one probe's outcome to e.
func (m *Manager) observe(e *entry, start time.Time, o outcome) {
	m.mu.Lock()
	defer m.unlock()
	if m.entries[e.cfg.Name] != e {
		return // removed or replaced meanwhile
	}
	now := time.Now()
	err := o.err
	if err == nil && o.fetched && o.modelsErr != nil && e.models == nil && e.cfg.Models == nil {
		err = o.modelsErr // without models the worker cannot serve
	}
	if o.restarted {
		e.restarts++
		e.lastRestart = now
		m.log.Info("worker engine restarted", "worker", e.cfg.Name, "reason", untrusted.Text(o.restartWhy, 0))
		m.noteLocked(note{worker: e.cfg.Name, restarted: true})
		if e.ready {
			// The engine lost its KV cache and the requests it was
			// serving: the worker leaves now, its bookings and the
			// router's record of what it sent there going with it, and
			// rejoins at the next probe as a new generation.
			m.leaveLocked(e, "engine restarted: "+untrusted.Text(o.restartWhy, 0))
		}
	}
	// After the restart's note, and whether or not the worker can join:
	// one whose models cannot be read keeps what its engine said of its
	// publishers, so that they are not asked for at every probe.
	m.applySourcesLocked(e, o, now)
	switch {
	case err != nil && e.ready && errors.Is(err, ErrTimeout) && o.heldUp >= m.o.ScrapeInterval/4 &&
		now.Sub(e.probedOK) < HeldUpIntervals*m.o.ScrapeInterval:
		// The router lost a quarter of the probe's time or more to its
		// own hold-up: the timeout says nothing of the worker.
		err = fmt.Errorf("%w %s", err, notCounted)
		if e.lastErr == nil || e.lastErr.Error() != err.Error() {
			m.log.Info("worker probe not counted", "worker", e.cfg.Name, "reason", err.Error(),
				"held_up", o.heldUp.Round(time.Millisecond), "ready", e.ready, "consecutive_failures", e.scrapeFails)
		}
		e.lastErr = err
	case err != nil:
		e.scrapeFails++
		if e.lastErr == nil || e.lastErr.Error() != err.Error() {
			m.log.Info("worker probe failed", "worker", e.cfg.Name, "reason", err.Error(),
				"ready", e.ready, "consecutive_failures", e.scrapeFails)
		}
		e.lastErr = err
		if e.scrapeFails >= m.o.FailureThreshold {
			// Out on its probes' word now: it no longer holds the
			// request failures' ejection bound (ReportFailure).
			e.ejected = false
			if e.ready {
				m.leaveLocked(e, fmt.Sprintf("%d consecutive probes failed: %v", e.scrapeFails, err))
			}
		}
	default:
		e.scrapeFails, e.lastErr, e.probedOK = 0, nil, now
		switch {
		case o.noLoad != "" && e.noLoad != o.noLoad:
			m.log.Warn("worker engine load unknown: LOAD is unavailable, not idle", "worker", e.cfg.Name, "reason", o.noLoad)
		case o.noLoad == "" && e.noLoad != "":
			m.log.Info("worker engine load known again", "worker", e.cfg.Name)
		}
		e.noLoad = o.noLoad
		m.applyModelsLocked(e, o, now)
		m.applyReportLocked(e, o.rep, now)
		switch {
		case !e.ready && start.After(e.leftAt):
			m.joinLocked(e)
			if e.ready {
				m.log.Info("worker ready", "worker", e.cfg.Name, "generation", e.ranks[0].member.Generation,
					"ranks", len(e.ranks), "models", e.ranks[0].member.Models, "total_kv_blocks", e.ranks[0].member.TotalKVBlocks)
			}
		case e.ready:
			if !m.reconcileLocked(e) {
				m.leaveLocked(e, e.leftWhy)
			}
		}
	}
	for _, rs := range e.ranks {
		if rs.obs != nil && now.Sub(rs.obsAt) > StaleIntervals*m.o.ScrapeInterval {
			rs.obs, rs.hasRunning = nil, false
			if rs.member != nil {
				rs.member.SetEngineLoad(nil)
			}
		}
	}
}

// applyModelsLocked records a read of the engine's models. For a block
// that sets its models, only the cards are kept, and a failed read is
// not reported: the block's list is what the worker serves.
func (m *Manager) applyModelsLocked(e *entry, o outcome, now time.Time) {
	switch {
	case !o.fetched:
	case e.cfg.Models != nil:
		e.modelsAt = now
		if o.modelsErr == nil && !slices.Equal(e.cards, o.cards) {
			e.cards = o.cards
			m.dirty = true
		}
	case o.modelsErr == nil:
		models := cardIDs(o.cards)
		if e.models != nil && !slices.Equal(e.models, models) {
			m.log.Info("worker models changed", "worker", e.cfg.Name, "was", e.models, "now", models)
		}
		if !slices.Equal(e.cards, o.cards) {
			m.dirty = true
		}
		e.models, e.cards, e.modelsAt, e.modelsWhy = models, o.cards, now, ""
	default:
		why := "models not re-read, the last list stays: " + o.modelsErr.Error()
		if e.modelsWhy != why {
			m.log.Info("worker models not re-read; the last list stays", "worker", e.cfg.Name, "reason", o.modelsErr.Error())
		}
		e.modelsWhy = why
	}
}

// applySourcesLocked records an ask for the engine's KV-event publishers:
// a change (or the first answer) is logged and handed to
// Options.KVSources; a failure keeps the last ones. An answer that comes
// after the block gained a kv_events block is dropped.
func (m *Manager) applySourcesLocked(e *entry, o outcome, now time.Time) {
	if !o.discovered || e.cfg.KVEvents != nil {
		return
	}
	e.srcAt = now
	if o.discErr != nil {
		why := o.discErr.Error()
		if !e.srcFailed || e.srcWhy != why {
			m.log.Info("worker kv event sources not read; the last stay", "worker", e.cfg.Name, "reason", untrusted.Text(why, 0))
		}
		e.srcFailed, e.srcWhy = true, why
		return
	}
	d := o.disc
	if d.skipped != "" && (e.srcFailed || e.srcWhy != d.skipped) {
		m.log.Warn("worker kv event sources left out", "worker", e.cfg.Name, "reason", untrusted.Text(d.skipped, 0))
	}
	e.srcFailed, e.srcWhy = false, d.skipped
	if e.infoBlock != d.blockSize {
		e.infoBlock = d.blockSize
		m.dirty = true
	}
	if e.srcReported && slices.Equal(e.sources, d.sources) {
		return
	}
	eps := make([]string, len(d.sources))
	for i, s := range d.sources {
		eps[i] = s.Endpoint
	}
	logf := m.log.Info
	if len(d.sources) == 0 && len(e.sources) == 0 {
		logf = m.log.Debug // the engine reports none, as before
	}
	logf("worker kv event sources", "worker", e.cfg.Name, "from", d.from, "sources", len(d.sources), "endpoints", eps)
	e.sources, e.srcFrom, e.srcReported = d.sources, d.from, true
	m.noteLocked(note{worker: e.cfg.Name, sources: slices.Clone(d.sources)})
}

// withdrawSourcesLocked forgets e's discovered KV-event publishers,
// handing nil to Options.KVSources when some were reported.
func (m *Manager) withdrawSourcesLocked(e *entry) {
	if e.srcReported && len(e.sources) > 0 {
		m.noteLocked(note{worker: e.cfg.Name})
	}
	e.srcAt, e.srcFailed, e.srcWhy, e.srcReported, e.sources, e.srcFrom = time.Time{}, false, "", false, nil, ""
	if e.infoBlock != 0 {
		e.infoBlock = 0
		m.dirty = true
	}
}

// noteLocked queues a call of Options.KVSources or EngineRestarted (when
// set); unlock wakes the notify goroutine.
func (m *Manager) noteLocked(n note) {
	if n.restarted && m.o.EngineRestarted == nil || !n.restarted && m.o.KVSources == nil {
		return
	}
	m.notes = append(m.notes, n)
}

// unlock rebuilds the view when it is dirty, releases mu, and wakes the
// notify goroutine when calls are queued.
func (m *Manager) unlock() {
	if m.dirty {
		m.rebuildLocked()
		m.dirty = false
	}
	wake := len(m.notes) > 0
	m.mu.Unlock()
	if wake {
		select {
		case m.noteCh <- struct{}{}:
		default:
		}
	}
}

// notify makes the queued Options.KVSources and EngineRestarted calls, in
// order, until the Manager closes.
func (m *Manager) notify() {
	defer m.wg.Done()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-m.noteCh:
		}
		for {
			m.mu.Lock()
			ns := m.notes
			m.notes = nil
			m.mu.Unlock()
			if len(ns) == 0 || m.ctx.Err() != nil {
				break
			}
			for _, n := range ns {
				if n.restarted {
					m.o.EngineRestarted(n.worker)
				} else {
					m.o.KVSources(n.worker, n.sources)
				}
			}
		}
	}
}

// applyReportLocked records rep's ranks: their loads, running counts,
// capacities and block sizes. A report with ranks makes them e's ranks
// (ranks it no longer lists leave the fleet); one without (no engine
// metrics) makes them the data-parallel ranks of the KV-event sources
// the engine reported (sourceRanks), and else changes none.
func (m *Manager) applyReportLocked(e *entry, rep Engine, now time.Time) {
	if len(rep.Ranks) == 0 {
		rep = e.sourceRanksLocked()
	}
	if len(rep.Ranks) == 0 {
		return
	}
	e.ranked = rep.Ranked
	old := e.ranks
	e.ranks = make([]*rankState, 0, len(rep.Ranks))
	i := 0
	for _, r := range rep.Ranks {
		for i < len(old) && old[i].rank < r.Rank {
			m.removeRankLocked(e, old[i]) // a rank the engine no longer reports
			i++
		}
		rs := &rankState{rank: r.Rank}
		if i < len(old) && old[i].rank == r.Rank {
			rs = old[i]
			i++
		}
		if r.Load != nil {
			rs.obs, rs.obsAt, rs.lastAt = r.Load, now, now
		}
		if r.HasRunning {
			rs.running, rs.hasRunning = r.Running, true
		}
		if r.CapacityTokens > 0 {
			rs.capTokens = r.CapacityTokens
		}
		if r.BlockSize > 0 {
			rs.blockSize = r.BlockSize
		}
		e.ranks = append(e.ranks, rs)
	}
	for ; i < len(old); i++ {
		m.removeRankLocked(e, old[i])
	}
}

// sourceRanksLocked is a report of e's data-parallel ranks as its
// engine's KV-event sources name them, without loads: one rank per
// source when they name ranks (more than one, or one other than 0), else
// none. An SGLang server started with --dp-size N but without
// --enable-metrics reports its ranks there only (/server_info's
// kv_events.dp_size), and each rank has its own KV cache: routed as one
// candidate, its requests would go round-robin over the ranks (SGLang's
// DataParallelController), whatever each rank holds.
func (e *entry) sourceRanksLocked() Engine {
	if len(e.sources) == 0 || len(e.sources) == 1 && e.sources[0].Rank == 0 {
		return Engine{}
	}
	rep := Engine{Ranked: true, Ranks: make([]Rank, len(e.sources))}
	for i, s := range e.sources {
		rep.Ranks[i] = Rank{Rank: uint32(s.Rank)}
	}
	return rep
}

// ReportFailure records that a request to the worker named name failed
// (connection refused, reset before any byte, a 5xx). FailureThreshold
// consecutive failures take it out of the candidate set until a scrape
// succeeds again, unless MaxEjectedPercent of the configured workers (at
// least one) are out for request failures already. Unknown names and
// workers not ready are ignored.
func (m *Manager) ReportFailure(name string) {
	m.mu.Lock()
	defer m.unlock()
	e := m.entries[name]
	if e == nil || !e.ready {
		return
	}
	e.requestFails++
	e.failing.Store(true)
	if e.requestFails < m.o.FailureThreshold {
		return
	}
	ejected := 0
	for _, o := range m.entries {
		if o.ejected {
			ejected++
		}
	}
	if bound := max(1, len(m.entries)*m.o.MaxEjectedPercent/100); ejected >= bound {
		if !e.kept {
			e.kept = true
			m.log.Warn("worker kept in despite failed requests: request failures hold the most workers out they may",
				"worker", e.cfg.Name, "consecutive_failures", e.requestFails, "out_for_request_failures", ejected,
				"max_ejected_percent", m.o.MaxEjectedPercent)
		}
		return
	}
	e.ejected = true
	m.leaveLocked(e, fmt.Sprintf("%d consecutive requests failed", e.requestFails))
}

// ReportSuccess records that a request to the worker named name succeeded,
// resetting its consecutive request failures. Every request reports: it
// takes the Manager's lock only when the worker has failures to reset
// (a success reported while a failure is being recorded may leave that
// failure counted: of two requests ending at once, either may be last).
func (m *Manager) ReportSuccess(name string) {
	if e := m.view.Load().entries[name]; e == nil || !e.failing.Load() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[name]; e != nil {
		e.requestFails, e.kept = 0, false
		e.failing.Store(false)
	}
}

// URL returns the engine base URL of the configured worker named name
// (config.Worker.URL, without a trailing "/"), ready or not; false when no
// worker of that name is configured. Like BlockSize it reads the summary
// rebuilt when the configuration changes, without taking the Manager's
// lock: every request asks it, and the lock is held meanwhile by probes'
// outcomes and membership changes (a join hands a warm-start snapshot's
// content to the cluster replica under it).
func (m *Manager) URL(name string) (string, bool) {
	u, ok := m.view.Load().urls[name]
	return u, ok
}

// Serves reports whether some configured worker, ready or not, lists
// model: serve answers 404 for a model nobody serves and 503 for one whose
// workers are all not ready.
func (m *Manager) Serves(model string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.entries {
		if models, _ := e.modelsLocked(); slices.Contains(models, model) {
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
		models, _ := e.modelsLocked()
		out = append(out, models...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Status returns every configured worker's state, sorted by name. The
// Options.Streams and IndexBlocks hooks are called after the Manager's
// lock is released.
func (m *Manager) Status() []Status {
	m.mu.Lock()
	out := make([]Status, 0, len(m.entries))
	for _, e := range m.entries {
		out = append(out, m.statusLocked(e))
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Config.Name, b.Config.Name) })
	for i := range out {
		m.hooks(&out[i])
	}
	return out
}

// StatusOf returns the state of the worker named name.
func (m *Manager) StatusOf(name string) (Status, bool) {
	m.mu.Lock()
	e := m.entries[name]
	if e == nil {
		m.mu.Unlock()
		return Status{}, false
	}
	s := m.statusLocked(e)
	m.mu.Unlock()
	m.hooks(&s)
	return s, true
}

// hooks fills s's ranks' event streams and index sizes from the Options'
// hooks.
func (m *Manager) hooks(s *Status) {
	for i := range s.Ranks {
		r := &s.Ranks[i]
		if m.o.Streams != nil {
			if es, ok := m.o.Streams(s.ID, r.Rank); ok {
				r.Events = &es
			}
		}
		if m.o.IndexBlocks != nil {
			r.IndexBlocks, r.HasIndexBlocks = m.o.IndexBlocks(s.ID, r.Rank)
		}
	}
}

func (m *Manager) statusLocked(e *entry) Status {
	s := Status{
		Config: cloneWorker(e.cfg), ID: e.id, Ready: e.ready, Ranked: e.ranked,
		ScrapeFailures: e.scrapeFails, RequestFailures: e.requestFails, LastError: e.lastErr,
		KVSources: slices.Clone(e.sources), KVSourcesFrom: e.srcFrom, EngineRestarts: e.restarts, LastRestart: e.lastRestart,
	}
	models, src := e.modelsLocked()
	s.Models, s.ModelsSource = slices.Clone(models), src
	for _, rs := range e.ranks {
		r := RankStatus{
			Rank: rs.rank, Member: rs.member, Load: rs.obs, ObservedAt: rs.obsAt, LastReport: rs.lastAt,
			Running: rs.running, HasRunning: rs.hasRunning, EngineBlockSize: e.blockSizeLocked(rs),
		}
		if r.Load == nil {
			r.ObservedAt = time.Time{}
		}
		r.TotalKVBlocks, r.CapacitySource = m.capacityLocked(e, rs)
		s.Ranks = append(s.Ranks, r)
	}
	r0 := s.Ranks[0]
	s.Member, s.Load, s.ObservedAt, s.Running, s.HasRunning = r0.Member, r0.Load, r0.ObservedAt, r0.Running, r0.HasRunning
	switch {
	case e.lastErr != nil:
		s.Reason = e.lastErr.Error()
	case !e.ready && e.leftWhy != "":
		s.Reason = e.leftWhy
	case !e.ready:
		s.Reason = "not probed yet"
	case e.noLoad != "":
		s.Reason = e.noLoad
	default:
		s.Reason = e.modelsWhy
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
		if a != 0 || e.current(w) {
			kept = append(kept, w)
		}
	}
	clear(e.gens[len(kept):])
	e.gens = kept
	return n
}

// current reports whether w is the current generation of one of e's ranks.
func (e *entry) current(w *fleet.Worker) bool {
	for _, rs := range e.ranks {
		if rs.member == w {
			return true
		}
	}
	return false
}

var (
	readyDesc = prometheus.NewDesc("switchyard_worker_ready",
		"1 when the worker is in the candidate set, 0 when it is configured but not ready.", []string{"worker"}, nil)
	activeDesc = prometheus.NewDesc("switchyard_worker_active_requests",
		"Requests in flight on the worker (ACTIVE_REQUESTS), over every generation it joined under; a worker removed from the configuration keeps its series until its requests finish.", []string{"worker"}, nil)
	rankLabels  = []string{"worker", "rank"}
	kvUsageDesc = prometheus.NewDesc("switchyard_worker_engine_kv_usage",
		"The engine's KV-cache usage (0..1) for the worker's data-parallel rank, while its report is fresh.", rankLabels, nil)
	waitingDesc = prometheus.NewDesc("switchyard_worker_engine_waiting_requests",
		"Requests the engine reports waiting in its queue, per data-parallel rank, while its report is fresh.", rankLabels, nil)
	runningDesc = prometheus.NewDesc("switchyard_worker_engine_running_requests",
		"Requests the engine reports running, per data-parallel rank, while its report is fresh.", rankLabels, nil)
	capacityDesc = prometheus.NewDesc("switchyard_worker_capacity_blocks",
		"The rank's KV capacity in router blocks (router.block_size tokens), configured or reported by the engine; 0 while unknown.", rankLabels, nil)
	ageDesc = prometheus.NewDesc("switchyard_worker_engine_report_age_seconds",
		"Seconds since the engine's last load report for the rank (absent until one arrives).", rankLabels, nil)
	availableDesc = prometheus.NewDesc("switchyard_worker_engine_load_available",
		"1 while the rank's engine load report is fresh (LOAD available), 0 when unknown, which differs from idle.", rankLabels, nil)
	eventsDesc = prometheus.NewDesc("switchyard_worker_kv_events_total",
		"KV-cache events received from the engine for the rank (workers whose KV events are followed: publishers the engine reported, or a kv_events block).", rankLabels, nil)
	gapsDesc = prometheus.NewDesc("switchyard_worker_kv_event_gaps_total",
		"Sequence gaps in the rank's KV-event stream (a lost message or a restarted engine).", rankLabels, nil)
	malformedDesc = prometheus.NewDesc("switchyard_worker_kv_event_malformed_total",
		"Messages of the rank's KV-event stream dropped as malformed (not [topic, sequence, payload], or a payload that does not decode); each is counted, the log shows at most one per cause per 10 s.", rankLabels, nil)
)

// collector reads the Manager's state at each collection.
type collector struct{ m *Manager }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{readyDesc, activeDesc, kvUsageDesc, waitingDesc, runningDesc, capacityDesc, ageDesc, availableDesc, eventsDesc, gapsDesc, malformedDesc} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	type active struct {
		name string
		n    int64
	}
	var actives []active
	c.m.mu.Lock()
	for name, e := range c.m.entries {
		actives = append(actives, active{name, e.activeLocked()})
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
		actives = append(actives, active{name, n})
	}
	c.m.mu.Unlock()
	for _, a := range actives {
		ch <- prometheus.MustNewConstMetric(activeDesc, prometheus.GaugeValue, float64(a.n), a.name)
	}
	now := time.Now()
	gauge := func(d *prometheus.Desc, v float64, name, rank string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, name, rank)
	}
	for _, st := range c.m.Status() {
		name := st.Config.Name
		ready := 0.0
		if st.Ready {
			ready = 1
		}
		ch <- prometheus.MustNewConstMetric(readyDesc, prometheus.GaugeValue, ready, name)
		for _, r := range st.Ranks {
			rank := strconv.FormatUint(uint64(r.Rank), 10)
			gauge(capacityDesc, float64(r.TotalKVBlocks), name, rank)
			available := 0.0
			if l := r.Load; l != nil {
				available = 1
				if l.HasKVUsage {
					gauge(kvUsageDesc, l.KVUsage, name, rank)
				}
				if l.HasWaiting {
					gauge(waitingDesc, float64(l.Waiting), name, rank)
				}
			}
			gauge(availableDesc, available, name, rank)
			if r.HasRunning {
				gauge(runningDesc, float64(r.Running), name, rank)
			}
			if !r.LastReport.IsZero() {
				gauge(ageDesc, now.Sub(r.LastReport).Seconds(), name, rank)
			}
			if r.Events != nil {
				ch <- prometheus.MustNewConstMetric(eventsDesc, prometheus.CounterValue, float64(r.Events.Received), name, rank)
				ch <- prometheus.MustNewConstMetric(gapsDesc, prometheus.CounterValue, float64(r.Events.Gaps), name, rank)
				ch <- prometheus.MustNewConstMetric(malformedDesc, prometheus.CounterValue, float64(r.Events.Malformed), name, rank)
			}
		}
	}
}
