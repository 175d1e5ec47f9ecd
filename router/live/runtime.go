package live

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/cluster"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/router/tokenizer"
	"github.com/switchyard-router/switchyard/router/workers"
	"github.com/switchyard-router/switchyard/shared"
)

// Defaults of Options.
const (
	// DefaultRequestTimeout bounds one request: the HTTP face bounds it
	// end to end (queue wait, every attempt, the streamed answer), Place
	// its wait for a placement.
	DefaultRequestTimeout = 10 * time.Minute
	// DefaultDispatchInterval is how often queued requests are looked at
	// when no request ended meanwhile (due times, aging, workers joining).
	DefaultDispatchInterval = 20 * time.Millisecond
	// DefaultMaxBodyBytes bounds a request body (32 MiB), the parser's
	// bound: Place refuses a larger one, and both faces default to it.
	DefaultMaxBodyBytes = 32 << 20
	// DefaultMaxBodyBytesInFlight bounds the request bodies a face holds
	// at once, all requests together (1 GiB: 32 bodies of the largest
	// size, tens of thousands of ordinary chat requests). Both faces
	// default to it.
	DefaultMaxBodyBytesInFlight = 1 << 30
)

// Workers is what the runtime needs of the worker manager
// (workers.Manager): where a worker is, how its requests went, and
// each worker's readiness.
type Workers interface {
	// URL returns the engine base URL of the worker named name (a
	// fleet.Spec.Name), without a trailing "/"; false when it is unknown.
	URL(name string) (string, bool)
	// ReportFailure records that a request to the worker failed (it
	// refused the connection, or failed mid-answer, or answered 5xx).
	ReportFailure(name string)
	// ReportSuccess records that the worker answered.
	ReportSuccess(name string)
	// Status returns every configured worker's state, sorted by name:
	// Readiness lists them and is ready only while one is Ready.
	Status() []workers.Status
}

// modelServer is implemented by Workers that know the configured models
// (workers.Manager): a model no worker lists is unknown rather than down
// (Runtime.Serves), and Models and the metrics' model label know a model
// whose workers are all down.
type modelServer interface {
	Serves(model string) bool
	// Models returns the configured workers' models, sorted, each once.
	Models() []string
}

// Options configure a Runtime.
type Options struct {
	// Router routes and books requests. The Runtime does not close it.
	Router *router.Router
	// Queue is the policy file's queue block (config.DefaultQueue when it
	// has no class): capacity per worker, classes, max_waiting. It is
	// read once; a reload does not change it.
	Queue config.Queue
	// Classifier classifies requests when the Router's current bundle has
	// no request_classifier (tests); nil: none.
	Classifier shared.ClassifierFactory
	// Workers resolves and reports on the fleet's workers.
	Workers Workers
	// Registry receives the runtime's metrics (the faces serve it on
	// /metrics); nil: no metrics.
	Registry *prometheus.Registry
	// RequestTimeout bounds each request (DefaultRequestTimeout).
	RequestTimeout time.Duration
	// CharsPerToken is the text routing key's characters per token
	// (DefaultCharsPerToken), for models without a tokenizer.
	CharsPerToken int
	// Tokenizers tokenizes the prompts of the models that have one (the
	// policy file's tokenizer blocks, and by default the engines'
	// /tokenize: tokenizer.NewSet's Defaults); nil: every text prompt is
	// keyed by character blocks. SetTokenizers replaces it.
	Tokenizers *tokenizer.Set
	// Engines gives each model's engine block size, the block size its
	// requests are keyed at unless router.block_size is set, and a LoRA
	// adapter's base model; nil: Workers when it implements Engines, else
	// the fleet's engine block sizes and no adapters.
	Engines Engines
	// DispatchInterval is the dispatcher's tick (DefaultDispatchInterval).
	DispatchInterval time.Duration
	// MaxBodyBytes bounds a request body Place parses (DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// Logger receives the runtime's logs; nil discards them.
	Logger hclog.Logger
	// Observer, when set, hears every booking the runtime's admission
	// makes (admission.Options.Observer): router replicas share them
	// (router/cluster).
	Observer admission.Observer
	// Sessions, when set, shares the classifiers' session bindings with
	// the other replicas (admission.Options.Sessions, router/cluster).
	Sessions func(model string, role shared.Role) shared.SessionStore
	// Streams, when set, gives a worker rank's KV-event stream state
	// (EventStream; the Daemon's KV subscriptions); nil: none.
	Streams func(id shared.WorkerID, rank uint32) (workers.EventStream, bool)
}

// Runtime is the live runtime's request side, shared by the faces:
// request intake (Key, Admit, Place), admission and its dispatcher, the
// answer meter (Meter) and the request metrics, readiness. Safe for
// concurrent use.
type Runtime struct {
	r        *router.Router
	workers  Workers
	observer admission.Observer // Options.Observer; Readiness shows a cluster's State
	registry *prometheus.Registry
	met      *metrics
	timeout  time.Duration
	cpt      int
	// toks is the current tokenizer set (Options.Tokenizers,
	// SetTokenizers); it may hold nil.
	toks atomic.Pointer[tokenizer.Set]
	// engines gives models' block sizes and adapters' base models;
	// warnedBS the models keyBlockSize warned about.
	engines  Engines
	warnedBS warnedOnce
	interval time.Duration
	maxBody  int64
	// capacity is the queue's max_active_requests per worker (0: no
	// limit), as admission places with it.
	capacity int64
	log      hclog.Logger
	streams  func(id shared.WorkerID, rank uint32) (workers.EventStream, bool)
	// tokenLogs rate-limits the log lines of prompts whose token count
	// differs from the engine's (checkPromptTokens).
	tokenLogs *tokenLog

	idPrefix string
	seq      atomic.Uint64

	// adm admits, queues and tracks the requests; wakeC wakes its
	// dispatcher (Dispatcher).
	adm   *admission.Controller
	wakeC chan struct{}

	// responses binds Responses ids to workers (BindResponse); sessions
	// is Options.Sessions, which shares them in a cluster.
	responses *responseBindings
	sessions  func(model string, role shared.Role) shared.SessionStore

	// utilityNext is the round-robin cursor of the engine utilities'
	// ties (UtilityWorker).
	utilityNext atomic.Uint64
}

// New returns a Runtime over o.Router. Errors: no Router or Workers in o,
// admission's (a queue block it refuses), or the metrics' registration.
func New(o Options) (*Runtime, error) {
	if o.Router == nil {
		return nil, errors.New("live: no router")
	}
	if o.Workers == nil {
		return nil, errors.New("live: no workers")
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.CharsPerToken <= 0 {
		o.CharsPerToken = DefaultCharsPerToken
	}
	if o.DispatchInterval <= 0 {
		o.DispatchInterval = DefaultDispatchInterval
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	rt := &Runtime{
		r:         o.Router,
		workers:   o.Workers,
		registry:  o.Registry,
		observer:  o.Observer,
		timeout:   o.RequestTimeout,
		cpt:       o.CharsPerToken,
		interval:  o.DispatchInterval,
		maxBody:   o.MaxBodyBytes,
		capacity:  int64(o.Queue.MaxActiveRequests),
		tokenLogs: newTokenLog(),
		log:       o.Logger,
		streams:   o.Streams,
		idPrefix:  hex.EncodeToString(rnd[:]),
		wakeC:     make(chan struct{}, 1),
		responses: newResponseBindings(DefaultMaxResponses, DefaultResponseTTL),
		sessions:  o.Sessions,
	}
	rt.toks.Store(o.Tokenizers)
	switch e, ok := o.Workers.(Engines); {
	case o.Engines != nil:
		rt.engines = o.Engines
	case ok:
		rt.engines = e
	default:
		rt.engines = fleetEngines{r: o.Router}
	}
	var err error
	if rt.adm, err = admission.New(o.Router, admission.Options{Queue: o.Queue, Classifier: o.Classifier, OnQueued: rt.Wake, Observer: o.Observer, Sessions: o.Sessions}); err != nil {
		return nil, fmt.Errorf("live: %w", err)
	}
	if o.Registry != nil {
		if rt.met, err = newMetrics(o.Registry, rt.adm); err != nil {
			return nil, fmt.Errorf("live: metrics: %w", err)
		}
		held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "switchyard_response_bindings",
			Help: "Responses API ids this router binds to the worker holding them (previous_response_id follow-ups), at most DefaultMaxResponses; expired ones count until looked up or pushed out.",
		}, func() float64 { return float64(rt.responses.len()) })
		if err := o.Registry.Register(held); err != nil {
			return nil, fmt.Errorf("live: metrics: %w", err)
		}
	}
	return rt, nil
}

// Router returns the Router the runtime routes with (Options.Router).
func (rt *Runtime) Router() *router.Router { return rt.r }

// Workers returns the workers the runtime resolves and reports on
// (Options.Workers).
func (rt *Runtime) Workers() Workers { return rt.workers }

// Registry returns the metrics' registry (Options.Registry); nil: none.
func (rt *Runtime) Registry() *prometheus.Registry { return rt.registry }

// Logger returns the runtime's logger (Options.Logger).
func (rt *Runtime) Logger() hclog.Logger { return rt.log }

// RequestTimeout returns the bound on each request (Options.RequestTimeout).
func (rt *Runtime) RequestTimeout() time.Duration { return rt.timeout }

// MaxBodyBytes returns the bound on a request body, in bytes
// (Options.MaxBodyBytes).
func (rt *Runtime) MaxBodyBytes() int64 { return rt.maxBody }

// Capacity returns the queue's max_active_requests per worker (0: no
// limit), the capacity admission places with.
func (rt *Runtime) Capacity() int64 { return rt.capacity }

// EventStream returns the KV-event stream state of a worker's rank
// (Options.Streams); false when it has none or the runtime has no
// streams.
func (rt *Runtime) EventStream(id shared.WorkerID, rank uint32) (workers.EventStream, bool) {
	if rt.streams == nil {
		return workers.EventStream{}, false
	}
	return rt.streams(id, rank)
}

// Dispatcher hands queued requests their placements as capacity frees,
// until ctx ends: woken by every request's end and by a ticker (due
// times, aging, workers joining). A face runs it while it serves.
func (rt *Runtime) Dispatcher(ctx context.Context) {
	rt.adm.Run(ctx, rt.interval, rt.wakeC)
}

// Wake asks the dispatcher to look at the queue now (a request ended, a
// worker joined). With no request waiting it does nothing: a wake-up per
// request would cost the dispatcher's goroutine a thread wake-up each.
func (rt *Runtime) Wake() {
	if rt.adm.Queued() == 0 {
		return
	}
	select {
	case rt.wakeC <- struct{}{}:
	default:
	}
}

// Close stops the delivery of lifecycle events (after delivering those
// already emitted). Call it once no face places requests any more.
func (rt *Runtime) Close() { rt.adm.Close() }

// Queued returns the requests waiting in the queue, all roles and classes
// together.
func (rt *Runtime) Queued() int { return rt.adm.Queued() }

// Waiting returns the requests of role waiting in the queue.
func (rt *Runtime) Waiting(role shared.Role) int { return rt.adm.Waiting(role) }

// End ends h, a handle of this runtime's admission, with o, then wakes
// the dispatcher to look at the queue.
func (rt *Runtime) End(h *admission.Handle, o admission.Outcome) {
	h.End(o)
	rt.Wake()
}

// SetTokenizers makes set the tokenizers of the requests that arrive from
// now on (nil: none, every text prompt keyed by character blocks).
func (rt *Runtime) SetTokenizers(set *tokenizer.Set) { rt.toks.Store(set) }

// Models returns the models the workers serve, sorted: the configured
// workers' (also those whose workers are down) when the workers know
// them, else the Router's.
func (rt *Runtime) Models() []string {
	if ms, ok := rt.workers.(modelServer); ok {
		return ms.Models()
	}
	return rt.r.Models()
}

// Unknown reports whether no configured worker lists model (a 404, not a
// 503): false when the workers do not know the configured models.
func (rt *Runtime) Unknown(model string) bool {
	ms, ok := rt.workers.(modelServer)
	return ok && !ms.Serves(model)
}

// CodeModelNotFound is the OpenAI error code of a *ModelNotFoundError,
// answered 404 with type TypeInvalidRequest (OpenAI's answer for a model
// that does not exist: not retryable).
const CodeModelNotFound = "model_not_found"

// ModelNotFoundError is the refusal of a request whose model no configured
// worker serves or lists (Runtime.Unknown): serve and the EPP answer it 404
// CodeModelNotFound, where a model whose workers are all down or starting
// is a retryable 503. Runtime.ModelNotFound makes it.
type ModelNotFoundError struct {
	Model string // the request's model, as the client sent it
	Err   error  // the runtime's refusal, wrapping shared.ErrNoWorkers
}

// Error is the answer's message: the model (quoted, escaped) and why.
func (e *ModelNotFoundError) Error() string {
	return fmt.Sprintf("the model %q does not exist: no worker serves it", e.Model)
}

// Unwrap returns the runtime's refusal.
func (e *ModelNotFoundError) Unwrap() error { return e.Err }

// ModelNotFound returns err as a *ModelNotFoundError when it wraps
// shared.ErrNoWorkers and no configured worker serves or lists model
// (Unknown), and err unchanged otherwise (nil for nil).
func (rt *Runtime) ModelNotFound(model string, err error) error {
	if err == nil || !errors.Is(err, shared.ErrNoWorkers) || !rt.Unknown(model) {
		return err
	}
	return &ModelNotFoundError{Model: model, Err: err}
}

// ModelLabel bounds the metrics' model label's values to the fleet's
// models: model when a worker serves or lists it, "" for none, else
// "unknown".
func (rt *Runtime) ModelLabel(model string) string {
	if model == "" {
		return ""
	}
	if _, ok := slices.BinarySearch(rt.r.Models(), model); ok {
		return model
	}
	if ms, ok := rt.workers.(modelServer); ok && ms.Serves(model) {
		return model // configured, its workers not ready
	}
	return "unknown"
}

// NewID returns a request id for a request without one of its own:
// "sy-", 8 hex digits fixed per Runtime, "-" and a sequence number.
func (rt *Runtime) NewID() string {
	return "sy-" + rt.idPrefix + "-" + strconv.FormatUint(rt.seq.Add(1), 10)
}

// CountRequest counts one request as the faces count theirs:
// switchyard_requests_total under label (ModelLabel) and the status code
// the client got (CodeClientGone when it left first), and
// switchyard_request_duration_seconds since start. No-op without metrics.
func (rt *Runtime) CountRequest(label string, code int, start time.Time) {
	if rt.met == nil {
		return
	}
	rt.met.requests.WithLabelValues(label, strconv.Itoa(code)).Inc()
	rt.met.duration.WithLabelValues(label).Observe(time.Since(start).Seconds())
}

// CodeClientGone is the status code a request is counted under when its
// client (or proxy) left before the answer's end (nginx's 499).
const CodeClientGone = 499

// Readiness is the runtime's readiness, the HTTP face's /readyz answer
// (docs/serve.md shows one).
type Readiness struct {
	// Ready is true when the policy is loaded and at least one worker is
	// ready; the answer is then 200, else 503.
	Ready bool `json:"ready"`
	// Reason says why not ready ("router closed", "no worker ready");
	// absent when ready.
	Reason  string            `json:"reason,omitempty"`
	Policy  PolicyReadiness   `json:"policy"`
	Plugins []PluginReadiness `json:"plugins"`
	Workers []WorkerReadiness `json:"workers"`
	// Cluster is this replica's view of its cluster (the policy file's
	// cluster block); absent without one. A (re)starting replica is
	// unready until it has caught up (cluster.Replica.Ready), at most the
	// block's warm_timeout: past it, or once caught up, NATS never makes
	// the router unready (a replica cut from NATS routes on its own
	// state).
	Cluster *cluster.State `json:"cluster,omitempty"`
	// Canaries are the current policies' canaries (router.Router.Canaries:
	// each side's decisions, the candidate's window, and the rollback
	// once it happened); absent without any. A rolled-back canary does
	// not make the router unready: the live policy decides everything.
	Canaries []router.CanaryStatus `json:"canaries,omitempty"`
}

// ClusterReady reports whether the cluster side lets the router be ready:
// true without a cluster block, else cluster.Replica.Ready (caught up, or
// its warm_timeout passed). `router epp` waits for it before its gRPC
// readiness turns SERVING, as /readyz does.
func (rt *Runtime) ClusterReady() bool {
	if cs, ok := rt.observer.(clusterMember); ok {
		return cs.Ready()
	}
	return true
}

// clusterMember is what Readiness reads of a cluster.Replica.
type clusterMember interface {
	State() cluster.State
	Ready() bool
}

// PolicyReadiness is the policy file's state in Readiness.
type PolicyReadiness struct {
	// State is "loaded", or "router closed" once the router shut down.
	State string `json:"state"`
	// File is the policy file loaded; absent for policies built in code.
	File string `json:"file,omitempty"`
}

// PluginReadiness is one plugin block's state in Readiness, in file
// order. A plugin that is not up does not make the router unready: the
// policies using it decide by their fallbacks.
type PluginReadiness struct {
	Name string `json:"name"`
	// State is "up", or "degraded: serving by fallback" when the plugin
	// is not up or is up with its circuit breaker open (its calls failed;
	// the breaker lets one through now and then).
	State string `json:"state"`
	// Status is the supervisor's status (supervisor.Status.String():
	// "up", "restarting", "failed", "stopped", ...), or "not started"
	// when it failed to start under on_start_failure = "fallback" (the
	// load logged why).
	Status string `json:"status"`
	// Version is the running process's DescribeResponse.plugin_version;
	// absent while no process runs or when the plugin reports none.
	Version string `json:"version,omitempty"`
	// SHA256 is the running process's executable's SHA-256 (for an
	// interpreter, the interpreter's; Files has the script's), taken
	// before it started; absent while no process runs.
	SHA256 string `json:"sha256,omitempty"`
	// Started is when the running process started serving (RFC 3339, UTC,
	// with nanoseconds); absent while no process runs. A restart or a
	// reload changes it.
	Started string `json:"started,omitempty"`
	// Files are the checksums of every file the running process runs
	// (supervisor.PluginInfo.Files: the executable, then the files among
	// its args and in sha256_files), in that order; absent while no
	// process runs.
	Files []supervisor.FileSum `json:"files,omitempty"`
}

// WorkerReadiness is one configured worker's state in Readiness, by name.
type WorkerReadiness struct {
	Name  string `json:"name"`
	URL   string `json:"url"`
	Role  string `json:"role"`
	Ready bool   `json:"ready"`
	// Load is "available" while the engine's last load report is fresh
	// (for a data-parallel engine: any rank's), else "unavailable"
	// (unknown, which differs from idle).
	Load string `json:"load"`
	// Reason is workers.Status.Reason: why the worker is not ready, or
	// what is amiss with a ready one (its load unknown, a failed probe);
	// absent when nothing is.
	Reason string `json:"reason,omitempty"`
}

// pluginFallback is the readiness state of a plugin that is not up.
const pluginFallback = "degraded: serving by fallback"

// Readiness returns the current Readiness: ready when the policy is
// loaded and at least one worker is ready (and a cluster replica has
// caught up). Its size is linear in the workers and plugins configured
// (each reason is bounded).
func (rt *Runtime) Readiness() Readiness {
	a := Readiness{Policy: PolicyReadiness{State: "loaded"}, Plugins: []PluginReadiness{}, Workers: []WorkerReadiness{}}
	rb := rt.r.Bundle()
	a.Canaries = rt.r.Canaries()
	if rb == nil {
		a.Policy.State = "router closed"
	} else if b := loader.Of(rb); b != nil {
		a.Policy.File = b.Filename()
		for _, p := range b.Plugins() {
			pr := PluginReadiness{Name: p.Name, State: "up", Status: p.Status.String()}
			if p.Running {
				pr.Version, pr.SHA256, pr.Files = p.Info.Version, p.Info.SHA256(), p.Info.Files
				pr.Started = p.Info.Started.UTC().Format(time.RFC3339Nano)
			}
			if !p.Started {
				pr.Status = "not started"
			}
			switch {
			case !p.Started || p.Status != supervisor.StatusUp:
				pr.State = pluginFallback
			case p.BreakerOpen:
				pr.State = pluginFallback + " (circuit breaker open)"
			}
			a.Plugins = append(a.Plugins, pr)
		}
	}
	clusterReady := true
	if cs, ok := rt.observer.(clusterMember); ok {
		// Ready before State: a replica that catches up between the two
		// reads must not say ready and not caught up (both only turn true).
		clusterReady = cs.Ready()
		st := cs.State()
		a.Cluster = &st
	}
	anyReady := false
	for _, st := range rt.workers.Status() {
		wr := WorkerReadiness{Name: st.Config.Name, URL: st.Config.URL, Role: string(st.Config.Role),
			Ready: st.Ready, Load: "unavailable", Reason: st.Reason}
		for _, r := range st.Ranks {
			if r.Load != nil {
				wr.Load = "available"
			}
		}
		anyReady = anyReady || st.Ready
		a.Workers = append(a.Workers, wr)
	}
	switch {
	case rb == nil:
		a.Reason = "router closed"
	case !anyReady && len(a.Workers) == 0:
		a.Reason = "no worker ready: none is configured"
	case !anyReady:
		a.Reason = "no worker ready"
	case !clusterReady:
		a.Reason = "cluster: catching up (loading the prefix-index snapshot and replaying the streams)"
	default:
		a.Ready = true
	}
	return a
}
