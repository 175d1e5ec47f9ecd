package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/cluster"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/router/tokenizer"
	"github.com/switchyard-router/switchyard/router/upstream"
	"github.com/switchyard-router/switchyard/router/workers"
	"github.com/switchyard-router/switchyard/shared"
)

// Defaults of Options.
const (
	// DefaultRequestTimeout bounds one request end to end: queue wait,
	// every attempt, and the streamed answer.
	DefaultRequestTimeout = 10 * time.Minute
	// DefaultMaxRetries is how many times a request whose worker failed
	// before sending a byte is sent to another selection, which excludes
	// the workers that failed it (router.Exclude); with none left it
	// answers 502 at once.
	DefaultMaxRetries = 2
	// DefaultDispatchInterval is how often queued requests are looked at
	// when no request ended meanwhile (due times, aging, workers joining).
	DefaultDispatchInterval = 20 * time.Millisecond
	// DefaultMaxBodyBytes bounds a request body.
	DefaultMaxBodyBytes = 32 << 20
	// DefaultMaxBodyBytesInFlight bounds the request bodies held at once,
	// all requests together (1 GiB: 32 bodies of the largest size, tens
	// of thousands of ordinary chat requests).
	DefaultMaxBodyBytesInFlight = 1 << 30
	// DefaultMaxBodyBytesPerClient bounds the request bodies held at once
	// for one client address (256 MiB, a quarter of
	// DefaultMaxBodyBytesInFlight: at least four addresses are needed to
	// fill the router's budget; eight bodies of the largest size, or
	// thousands of ordinary chat requests, from one address).
	DefaultMaxBodyBytesPerClient = 256 << 20
	// MaxHeaderBytes bounds a request's header block (request line
	// included), so that a connection sending headers holds at most about
	// this much for at most the 10 s header timeout; past it net/http
	// answers 431 and closes the connection. 64 KiB: eight times nginx's
	// default (large_client_header_buffers 4 x 8k), and far more than an
	// OpenAI client sends; net/http's own default is 1 MiB.
	MaxHeaderBytes = 64 << 10
	// DefaultDrainTimeout bounds how long Serve waits for in-flight
	// requests after its context ends.
	DefaultDrainTimeout = 30 * time.Second
)

// Workers is what the server needs of the worker manager
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
	// /readyz lists them and is 200 only while one is Ready.
	Status() []workers.Status
}

// modelServer is implemented by Workers that know the configured models
// (workers.Manager): a model no worker lists is a 404, not a 503, and
// /v1/models and the metrics' model label know a model whose workers are
// all down.
type modelServer interface {
	Serves(model string) bool
	// Models returns the configured workers' models, sorted, each once.
	Models() []string
}

// Options configure a Server.
type Options struct {
	// Router routes and books requests. The Server does not close it.
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
	// Registry receives the server's metrics and is served on /metrics;
	// nil: no metrics, /metrics answers 404.
	Registry *prometheus.Registry
	// RequestTimeout bounds each request end to end
	// (DefaultRequestTimeout).
	RequestTimeout time.Duration
	// DrainTimeout bounds Serve's drain of in-flight requests on shutdown
	// (DefaultDrainTimeout).
	DrainTimeout time.Duration
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
	// MaxRetries bounds the re-selections of a request whose worker failed
	// before sending a byte (DefaultMaxRetries; negative: none).
	MaxRetries int
	// Transport sends requests to the engines; nil: a pooled transport
	// without proxy or compression.
	Transport http.RoundTripper
	// DispatchInterval is the dispatcher's tick (DefaultDispatchInterval).
	DispatchInterval time.Duration
	// MaxBodyBytes bounds a request body (DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// MaxBodyBytesInFlight bounds the bytes of the request bodies held at
	// once, all requests together (DefaultMaxBodyBytesInFlight; negative:
	// no bound). A body is held as its bytes arrive, in a buffer that
	// starts at 4 KiB (or its declared length, when smaller) and doubles
	// as it fills (up to its declared length), each growth counted before
	// it is made; it is held until its request ends. A request whose body
	// would pass the bound is answered 503 overloaded: before a byte is
	// read when its declared length would not fit, else as the growth
	// that would pass it is refused.
	MaxBodyBytesInFlight int64
	// MaxBodyBytesPerClient bounds the same bytes for one client address:
	// the request's remote IP address, an IPv6 one by its /64
	// (DefaultMaxBodyBytesPerClient; negative: no bound per address). A
	// request whose body would pass it is answered 503 overloaded as
	// above. Clients behind one NAT or proxy share one address, and so
	// one such share: raise it (up to MaxBodyBytesInFlight) when the
	// router is reached through a proxy or load balancer.
	MaxBodyBytesPerClient int64
	// Logger receives the server's logs; nil discards them.
	Logger hclog.Logger
	// Observer, when set, hears every booking the Server's admission
	// makes (admission.Options.Observer): router replicas share them
	// (router/cluster).
	Observer admission.Observer
	// Sessions, when set, shares the classifiers' session bindings with
	// the other replicas (admission.Options.Sessions, router/cluster).
	Sessions func(model string, role shared.Role) shared.SessionStore
}

// Server is the OpenAI-compatible front end. Safe for concurrent use.
type Server struct {
	r        *router.Router
	workers  Workers
	observer admission.Observer // Options.Observer; /readyz shows a cluster's State
	registry *prometheus.Registry
	met      *metrics
	timeout  time.Duration
	drain    time.Duration
	cpt      int
	// toks is the current tokenizer set (Options.Tokenizers,
	// SetTokenizers); it may hold nil.
	toks atomic.Pointer[tokenizer.Set]
	// engines gives models' block sizes and adapters' base models;
	// warnedBS the models keyBlockSize warned about.
	engines   Engines
	warnedBS  warnedOnce
	retries   int
	transport http.RoundTripper
	interval  time.Duration
	maxBody   int64
	// capacity is the queue's max_active_requests per worker (0: no
	// limit), as admission places with it (/debug/route).
	capacity int64
	// bodies counts the request bodies' bytes held (MaxBodyBytesInFlight,
	// MaxBodyBytesPerClient).
	bodies  *bodyBudget
	log     hclog.Logger
	handler http.Handler
	// refusals rate-limits the log lines of bodies refused by a budget.
	refusals *untrusted.Limiter
	// tokenLogs rate-limits the log lines of prompts whose token count
	// differs from the engine's (checkPromptTokens).
	tokenLogs *tokenLog
	// closing is set once Serve began its shutdown: every answer from
	// then on carries Connection: close.
	closing atomic.Bool

	idPrefix string
	seq      atomic.Uint64
	inflight atomic.Int64

	// adm admits, queues and tracks the requests; wakeC wakes its
	// dispatcher (Dispatcher).
	adm   *admission.Controller
	wakeC chan struct{}

	bufs sync.Pool // *[]byte, proxy copy buffers
}

// New returns a Server over o.Router.
func New(o Options) (*Server, error) {
	if o.Router == nil {
		return nil, errors.New("serve: no router")
	}
	if o.Workers == nil {
		return nil, errors.New("serve: no workers")
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if o.CharsPerToken <= 0 {
		o.CharsPerToken = DefaultCharsPerToken
	}
	if o.MaxRetries == 0 {
		o.MaxRetries = DefaultMaxRetries
	}
	if o.MaxRetries < 0 {
		o.MaxRetries = 0
	}
	if o.Transport == nil {
		o.Transport = NewTransport()
	}
	if o.DispatchInterval <= 0 {
		o.DispatchInterval = DefaultDispatchInterval
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MaxBodyBytesInFlight == 0 {
		o.MaxBodyBytesInFlight = DefaultMaxBodyBytesInFlight
	}
	if o.MaxBodyBytesPerClient == 0 {
		o.MaxBodyBytesPerClient = DefaultMaxBodyBytesPerClient
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	s := &Server{
		r:         o.Router,
		workers:   o.Workers,
		registry:  o.Registry,
		observer:  o.Observer,
		timeout:   o.RequestTimeout,
		drain:     o.DrainTimeout,
		cpt:       o.CharsPerToken,
		retries:   o.MaxRetries,
		transport: o.Transport,
		interval:  o.DispatchInterval,
		maxBody:   o.MaxBodyBytes,
		capacity:  int64(o.Queue.MaxActiveRequests),
		bodies:    newBodyBudget(o.MaxBodyBytesInFlight, o.MaxBodyBytesPerClient),
		refusals:  untrusted.NewLimiter(0),
		tokenLogs: newTokenLog(),
		log:       o.Logger,
		idPrefix:  hex.EncodeToString(rnd[:]),
		wakeC:     make(chan struct{}, 1),
	}
	s.toks.Store(o.Tokenizers)
	switch e, ok := o.Workers.(Engines); {
	case o.Engines != nil:
		s.engines = o.Engines
	case ok:
		s.engines = e
	default:
		s.engines = fleetEngines{r: o.Router}
	}
	var err error
	if s.adm, err = admission.New(o.Router, admission.Options{Queue: o.Queue, Classifier: o.Classifier, OnQueued: s.Wake, Observer: o.Observer, Sessions: o.Sessions}); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	s.bufs.New = func() any { b := make([]byte, 32<<10); return &b }
	if o.Registry != nil {
		if s.met, err = newMetrics(o.Registry, s.adm); err != nil {
			return nil, fmt.Errorf("serve: metrics: %w", err)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.complete(w, r, true) })
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.complete(w, r, false) })
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	if o.Registry != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(o.Registry, promhttp.HandlerOpts{Registry: o.Registry}))
	}
	// Anything else gets an OpenAI-shaped error, not net/http's plain text.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/chat/completions", "/v1/completions", "/v1/models", "/healthz", "/readyz", "/metrics":
			writeError(w, http.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed", fmt.Sprintf("%s is not allowed on %s", r.Method, r.URL.Path))
		default:
			writeError(w, http.StatusNotFound, typeInvalidRequest, "not_found", fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path))
		}
	})
	s.handler = s.connectionClose(canonicalPaths(mux))
	return s, nil
}

// connectionClose makes net/http close the connection after the answer
// (Connection: close) to a request with a chunked body, and to every
// request once Serve began its shutdown; it passes the request to next.
//
// RFC 9112 section 6.3: a server that reads a request with both
// Content-Length and Transfer-Encoding by its chunks must close the
// connection after answering it, as what follows on the wire may be a
// request smuggled past a front end that read it by its Content-Length.
// net/http reads such a request by its chunks but keeps the connection,
// and deletes the Content-Length header before the handler sees the
// request: a handler cannot tell it from a request with a chunked body
// alone. So every request with a chunked body closes its connection;
// what that costs an honest client is a new connection for its next
// request (OpenAI's clients send a Content-Length).
func (s *Server) connectionClose(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TransferEncoding) > 0 || s.closing.Load() {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}

// canonicalPaths answers 404 not_found, in the OpenAI error shape, for a
// request whose path is not in canonical form (path.Clean's: no empty,
// "." or ".." segment, no trailing slash, no percent-escape where none is
// needed), and passes the others to next. net/http's ServeMux would
// redirect such a path (307) to its clean form, and a client following
// the redirect would send its POST, body and all, a second time.
func canonicalPaths(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.EscapedPath(); p != path.Clean(r.URL.Path) {
			writeError(w, http.StatusNotFound, typeInvalidRequest, "not_found",
				fmt.Sprintf("no endpoint %s %s: the path is not in canonical form (%s)", r.Method, p, path.Clean(r.URL.Path)))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// NewTransport returns the engines' default transport, an
// upstream.Transport: each exchange on the handler's own goroutine over
// pooled keep-alive connections (upstream.DefaultMaxIdlePerHost per
// engine, idle ones checked before reuse), no proxy, no transparent
// compression (bodies pass through as the engine sent them), a 5s dial
// timeout and no response timeout (a non-streamed answer's headers come
// when generation ends; the request timeout bounds it). It saves two
// goroutine hand-offs per request over net/http's Transport (BENCHMARKS.md).
func NewTransport() *upstream.Transport {
	return &upstream.Transport{DialTimeout: 5 * time.Second}
}

// Handler is the server's HTTP handler. Queued requests need the
// dispatcher: run Serve, or Dispatcher beside the handler.
func (s *Server) Handler() http.Handler { return s.handler }

// InFlight is the number of completion requests being handled.
func (s *Server) InFlight() int64 { return s.inflight.Load() }

// Serve serves on ln until ctx ends, then shuts down and returns nil (or
// the listener's error, when it fails first). The shutdown, bounded as a
// whole by the drain timeout:
//
//  1. ln is closed: no new connection (a client's connect is refused).
//  2. Every answer from then on carries Connection: close, so each
//     client connection closes after its next answer.
//  3. Requests in flight run on, and the open connections stay open,
//     until none runs a request and each has been idle for at least
//     ShutdownIdleGrace: a client that was just answered with
//     keep-alive, and writes its next request on that connection, is
//     answered (and the connection then closed) rather than reset.
//  4. The idle connections are closed, and net/http's Shutdown waits for
//     what still runs until the drain timeout; past it the remaining
//     connections are cut, and their requests' bookings released (Serve
//     waits at most 5 s more for that).
//
// The Router stays open: the caller closes it (stopping its plugins)
// after Serve returns.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	defer s.Close() // after the drain: the handlers have ended
	conns := newConnTracker()
	hs := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    MaxHeaderBytes,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          s.log.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
		ConnState:         conns.hook,
	}
	if ci, ok := s.transport.(interface{ CloseIdleConnections() }); ok {
		defer ci.CloseIdleConnections()
	}
	dctx, stopDispatch := context.WithCancel(context.WithoutCancel(ctx))
	dispatched := make(chan struct{})
	go func() {
		defer close(dispatched)
		s.Dispatcher(dctx)
	}()
	defer func() {
		stopDispatch()
		<-dispatched
	}()
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	start := time.Now()
	deadline := start.Add(s.drain)
	open, active := conns.counts()
	s.log.Info("shutting down: draining requests in flight", "in_flight", s.InFlight(),
		"connections", open, "connections_active", active, "drain_timeout", s.drain)
	_ = ln.Close()
	<-served // its Accept failed: it returns, and its connections go on
	s.closing.Store(true)
	conns.waitQuiet(ShutdownIdleGrace, deadline)
	conns.closeIdle()
	sctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		open, active := conns.counts()
		s.log.Warn("drain timeout: cutting the requests still in flight", "in_flight", s.InFlight(),
			"connections", open, "connections_active", active, "error", err)
		_ = hs.Close()
		// Cut handlers see their context end and release their bookings;
		// wait for that (bounded) so the Router closes with nothing booked.
		deadline := time.Now().Add(5 * time.Second)
		for s.InFlight() > 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	s.log.Info("drained", "took", time.Since(start))
	return nil
}

// bodyBytesHeld is the bytes of request bodies held now, all clients
// together.
func (s *Server) bodyBytesHeld() int64 { return s.bodies.held.Load() }

// Dispatcher hands queued requests their placements as capacity frees,
// until ctx ends: woken by every request's end and by a ticker (due
// times, aging, workers joining). Serve runs it; tests that use Handler
// alone run it themselves.
func (s *Server) Dispatcher(ctx context.Context) {
	s.adm.Run(ctx, s.interval, s.wakeC)
}

// Wake asks the dispatcher to look at the queue now (a request ended, a
// worker joined). With no request waiting it does nothing: a wake-up per
// request would cost the dispatcher's goroutine a thread wake-up each.
func (s *Server) Wake() {
	if s.adm.Queued() == 0 {
		return
	}
	select {
	case s.wakeC <- struct{}{}:
	default:
	}
}

// Close stops the delivery of lifecycle events (after delivering those
// already emitted). Call it once the handler has stopped serving; Serve
// does.
func (s *Server) Close() { s.adm.Close() }

// models answers GET /v1/models: the union of the workers' models.
func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	models := s.r.Models()
	if ms, ok := s.workers.(modelServer); ok {
		models = ms.Models() // also the models whose workers are down
	}
	for _, m := range models {
		list.Data = append(list.Data, model{ID: m, Object: "model", OwnedBy: "switchyard"})
	}
	writeJSON(w, http.StatusOK, list)
}

// Readiness is the /readyz answer (docs/serve.md shows one).
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
}

// ClusterReady reports whether the cluster side lets the router be ready:
// true without a cluster block, else cluster.Replica.Ready (caught up, or
// its warm_timeout passed). `router epp` waits for it before its gRPC
// readiness turns SERVING, as /readyz does.
func (s *Server) ClusterReady() bool {
	if cs, ok := s.observer.(clusterMember); ok {
		return cs.Ready()
	}
	return true
}

// clusterMember is what /readyz reads of a cluster.Replica.
type clusterMember interface {
	State() cluster.State
	Ready() bool
}

// PolicyReadiness is the policy file's state in /readyz.
type PolicyReadiness struct {
	// State is "loaded", or "router closed" once the router shut down.
	State string `json:"state"`
	// File is the policy file loaded; absent for policies built in code.
	File string `json:"file,omitempty"`
}

// PluginReadiness is one plugin block's state in /readyz, in file order.
// A plugin that is not up does not make the router unready: the policies
// using it decide by their fallbacks.
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
}

// WorkerReadiness is one configured worker's state in /readyz, by name.
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

// pluginFallback is the /readyz state of a plugin that is not up.
const pluginFallback = "degraded: serving by fallback"

// readyz answers GET /readyz with the Readiness: 200 when the policy is
// loaded and at least one worker is ready, else 503. Its size is linear
// in the workers and plugins configured (each reason is bounded).
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	a := s.readiness()
	code := http.StatusOK
	if !a.Ready {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, a)
}

// readiness is the current Readiness.
func (s *Server) readiness() Readiness {
	a := Readiness{Policy: PolicyReadiness{State: "loaded"}, Plugins: []PluginReadiness{}, Workers: []WorkerReadiness{}}
	rb := s.r.Bundle()
	if rb == nil {
		a.Policy.State = "router closed"
	} else if b := loader.Of(rb); b != nil {
		a.Policy.File = b.Filename()
		for _, p := range b.Plugins() {
			pr := PluginReadiness{Name: p.Name, State: "up", Status: p.Status.String()}
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
	if cs, ok := s.observer.(clusterMember); ok {
		st := cs.State()
		a.Cluster = &st
		clusterReady = cs.Ready()
	}
	anyReady := false
	for _, st := range s.workers.Status() {
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

// modelLabel bounds the model label's values to the fleet's models.
func (s *Server) modelLabel(model string) string {
	if model == "" {
		return ""
	}
	if _, ok := slices.BinarySearch(s.r.Models(), model); ok {
		return model
	}
	if ms, ok := s.workers.(modelServer); ok && ms.Serves(model) {
		return model // configured, its workers not ready
	}
	return "unknown"
}

// newID returns a request id for a request without x-request-id.
func (s *Server) newID() string {
	return "sy-" + s.idPrefix + "-" + strconv.FormatUint(s.seq.Add(1), 10)
}

// apiError is the OpenAI error body.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// Error types of the answers.
const (
	typeInvalidRequest = "invalid_request_error"
	typeRateLimit      = "rate_limit_error"
	typeServer         = "server_error"
)

func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	writeJSON(w, status, apiError{Error: apiErrorBody{Message: msg, Type: typ, Code: code}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding the answer failed","type":"server_error","param":null,"code":"internal"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
