package serve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/upstream"
)

// Defaults of Options.
const (
	// DefaultMaxRetries is how many times a request whose worker failed
	// before sending a byte is sent to another selection, which excludes
	// the workers that failed it (router.Exclude); with none left it
	// answers 502 at once.
	DefaultMaxRetries = 2
	// DefaultMaxBodyBytesPerClient bounds the request bodies held at once
	// for one client address (256 MiB, a quarter of
	// live.DefaultMaxBodyBytesInFlight: at least four addresses are needed to
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

// Options configure a Server: the HTTP face's own settings (the
// runtime's are live.Options).
type Options struct {
	// DrainTimeout bounds Serve's drain of in-flight requests on shutdown
	// (DefaultDrainTimeout).
	DrainTimeout time.Duration
	// MaxRetries bounds the re-selections of a request whose worker failed
	// before sending a byte (DefaultMaxRetries; negative: none).
	MaxRetries int
	// Transport sends requests to the engines; nil: live.NewTransport's.
	Transport http.RoundTripper
	// MaxBodyBytesInFlight bounds the bytes of the request bodies held at
	// once, all requests together (live.DefaultMaxBodyBytesInFlight;
	// negative: no bound). A body is held as its bytes arrive, in a buffer
	// that starts at 4 KiB (or its declared length, when smaller) and
	// doubles as it fills (up to its declared length), each growth counted
	// before it is made; it is held until its request ends. A request
	// whose body would pass the bound is answered 503 overloaded: before a
	// byte is read when its declared length would not fit, else as the
	// growth that would pass it is refused. A body is at most the
	// runtime's MaxBodyBytes (live.Options).
	MaxBodyBytesInFlight int64
	// MaxBodyBytesPerClient bounds the same bytes for one client address:
	// the request's remote IP address, an IPv6 one by its /64
	// (DefaultMaxBodyBytesPerClient; negative: no bound per address). A
	// request whose body would pass it is answered 503 overloaded as
	// above. Clients behind one NAT or proxy share one address, and so
	// one such share: raise it (up to MaxBodyBytesInFlight) when the
	// router is reached through a proxy or load balancer.
	MaxBodyBytesPerClient int64
	// Version is the router's version, which GET /version reports
	// (`router version`'s); "" reports "unknown".
	Version string
	// DisablePassThrough turns off the pass-through of unknown paths:
	// by default a POST to a path under /v1/ that the router does not
	// route by its schema (live.EndpointFor) is proxied to an engine
	// serving the body's "model", admitted by load like a pooling
	// request; with it set, such a path is answered 404 not_found.
	DisablePassThrough bool
	// MigrationLimit bounds how many times one streamed chat or
	// completions request whose answer is cut mid-stream is continued on
	// another worker (router/migrate; migrate.DefaultLimit when 0;
	// negative: none, a cut stream ends with an error event).
	MigrationLimit int
	// StallTimeout is how long a streamed answer may send no byte before
	// its engine is taken for hung and the request migrates
	// (DefaultStallTimeout when 0; negative: never).
	StallTimeout time.Duration
	// WorkerDrainGrace is how long a generation request in flight on a
	// worker that left the fleet (drained, removed, not ready) may run
	// there before it moves: a streamed chat or completions answer
	// migrates, a non-streamed request still waiting for its answer is
	// placed again (DefaultWorkerDrainGrace when 0; negative: never).
	WorkerDrainGrace time.Duration
}

// Server is the OpenAI-compatible front end over a live.Runtime. Safe for
// concurrent use.
type Server struct {
	rt      *live.Runtime
	r       *router.Router // rt's
	workers live.Workers   // rt's
	log     hclog.Logger   // rt's
	timeout time.Duration  // rt's RequestTimeout
	maxBody int64          // rt's MaxBodyBytes
	drain   time.Duration
	retries int
	// transport sends the requests to the engines.
	transport http.RoundTripper
	// bodies counts the request bodies' bytes held (MaxBodyBytesInFlight,
	// MaxBodyBytesPerClient).
	bodies  *bodyBudget
	handler http.Handler
	// refusals rate-limits the log lines of bodies refused by a budget.
	refusals *untrusted.Limiter
	// closing is set once Serve began its shutdown: every answer from
	// then on carries Connection: close.
	closing  atomic.Bool
	inflight atomic.Int64
	// version is Options.Version; passUnknown is !DisablePassThrough.
	version     string
	passUnknown bool

	bufs sync.Pool // *[]byte, proxy copy buffers

	// mig migrates cut streams (migrate.go); dw cuts non-streamed
	// attempts on workers that left (drainwatch.go; nil: never).
	mig *migration
	dw  *drainWatch
}

// New returns the HTTP face over rt with o. rt's dispatcher
// (live.Runtime.Dispatcher) must run for queued requests to be placed;
// the Daemon runs it. The Server does not close rt.
func New(rt *live.Runtime, o Options) (*Server, error) {
	if rt == nil {
		return nil, errors.New("serve: no runtime")
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if o.MaxRetries == 0 {
		o.MaxRetries = DefaultMaxRetries
	}
	if o.MaxRetries < 0 {
		o.MaxRetries = 0
	}
	if o.Transport == nil {
		o.Transport = live.NewTransport()
	}
	if o.MaxBodyBytesInFlight == 0 {
		o.MaxBodyBytesInFlight = live.DefaultMaxBodyBytesInFlight
	}
	if o.MaxBodyBytesPerClient == 0 {
		o.MaxBodyBytesPerClient = DefaultMaxBodyBytesPerClient
	}
	s := &Server{
		rt:        rt,
		r:         rt.Router(),
		workers:   rt.Workers(),
		log:       rt.Logger(),
		timeout:   rt.RequestTimeout(),
		maxBody:   rt.MaxBodyBytes(),
		drain:     o.DrainTimeout,
		retries:   o.MaxRetries,
		transport: o.Transport,
		bodies:    newBodyBudget(o.MaxBodyBytesInFlight, o.MaxBodyBytesPerClient),
		refusals:  untrusted.NewLimiter(0),
		version:   o.Version,

		passUnknown: !o.DisablePassThrough,
	}
	s.bufs.New = func() any { b := make([]byte, 32<<10); return &b }
	reg := rt.Registry()
	mig, err := newMigration(o, reg)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	s.mig = mig
	if mig.grace >= 0 {
		s.dw = newDrainWatch(mig.grace)
	}
	mux := http.NewServeMux()
	// Every POST endpoint of the engines' servers that the router routes
	// by its schema (live.Endpoints): generation, pooling and scoring,
	// engine utilities.
	for _, e := range live.Endpoints() {
		api := e.API
		mux.HandleFunc("POST "+e.Path, func(w http.ResponseWriter, r *http.Request) { s.complete(w, r, api) })
	}
	mux.HandleFunc("GET /v1/responses/{id}", s.storedResponse)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", s.storedResponse)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /v1/models/{id...}", s.model)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("GET /ping", s.health)
	mux.HandleFunc("POST /ping", s.health)
	mux.HandleFunc("GET /version", s.versionView)
	if reg != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	}
	// Anything else: a known path with another method is 405, a POST
	// under /v1/ is passed through (passThrough), the rest 404, each in
	// its API's error shape rather than net/http's plain text.
	mux.HandleFunc("/", s.unrouted)
	s.handler = s.connectionClose(canonicalPaths(mux))
	return s, nil
}

// Face returns the live.FaceFunc that builds the HTTP face with o over a
// Daemon's runtime, sending to the engines over the daemon's transport
// (o.Transport is replaced by it): `router serve` serves it on --listen,
// `router epp` on --http-listen.
func Face(o Options) live.FaceFunc {
	return func(rt *live.Runtime, tr *upstream.Transport) (live.Face, error) {
		o.Transport = tr
		return New(rt, o)
	}
}

// DebugRoutes are the face's views on the Daemon's debug listener:
// /debug/route (DebugRoute), where a request would go.
func (s *Server) DebugRoutes() map[string]http.Handler {
	return map[string]http.Handler{"/debug/route": routeView{s: s}}
}

// Runtime returns the runtime the Server serves (New's rt).
func (s *Server) Runtime() *live.Runtime { return s.rt }

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
		if p := r.URL.EscapedPath(); debugPath(path.Clean(r.URL.Path)) {
			writeError(w, p, http.StatusNotFound, live.TypeInvalidRequest, "not_found",
				fmt.Sprintf("no endpoint %s %s: %s", r.Method, untrusted.Text(p, untrusted.MaxClient), debugOnly))
			return
		}
		if p := r.URL.EscapedPath(); p != path.Clean(r.URL.Path) && !escapedID(r.URL.Path) {
			// In the shape of the API the clean path is under (Anthropic's
			// for /v1/messages/ and /v1/messages%2Fcount_tokens).
			clean := path.Clean(r.URL.Path)
			writeError(w, clean, http.StatusNotFound, live.TypeInvalidRequest, "not_found",
				fmt.Sprintf("no endpoint %s %s: the path is not in canonical form (%s)", r.Method, untrusted.Text(p, untrusted.MaxClient), untrusted.Text(clean, untrusted.MaxClient)))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// debugOnly says where the paths debugPath matches are served.
const debugOnly = "Go's profiler (/debug/pprof/) and the router's /debug views are served only on --debug-listen's address, not on the API's"

// debugPath reports whether p, a clean path, is /debug or under it: the
// profiler and the debug views, which the API's address never serves
// (live.DaemonOptions.DebugListener does).
func debugPath(p string) bool {
	return p == "/debug" || strings.HasPrefix(p, "/debug/")
}

// escapedID reports whether p, a request's decoded path, is in canonical
// form and names a model or a stored response by an id that may carry
// percent-escapes: OpenAI's SDKs escape the id of GET /v1/models/{id}
// (encodeURIComponent in the Node SDK's path template), so a model
// "org/name" arrives as /v1/models/org%2Fname.
func escapedID(p string) bool {
	return p == path.Clean(p) && (strings.HasPrefix(p, "/v1/models/") || strings.HasPrefix(p, "/v1/responses/"))
}

// Handler is the server's HTTP handler. Queued requests need the
// runtime's dispatcher (live.Runtime.Dispatcher).
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
// The runtime's dispatcher must run meanwhile (the Daemon runs it). The
// runtime and its Router stay open: the caller closes them (stopping the
// plugins) after Serve returns.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
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

// readyz answers GET /readyz with the runtime's live.Readiness: 200 when
// the policy is loaded and at least one worker is ready, else 503. Its
// size is linear in the workers and plugins configured (each reason is
// bounded).
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	a := s.rt.Readiness()
	code := http.StatusOK
	if !a.Ready {
		code = http.StatusServiceUnavailable
	}
	live.WriteJSON(w, code, a)
}
