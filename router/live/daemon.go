package live

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/router/cluster"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/filewatch"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/router/tokenizer"
	"github.com/switchyard-router/switchyard/router/upstream"
	"github.com/switchyard-router/switchyard/router/workers"
	"github.com/switchyard-router/switchyard/shared"
)

// RouterCloseTimeout bounds the Router's close when a Daemon stops (the
// bundle's drain and its plugins' shutdown), after the server drained.
const RouterCloseTimeout = 10 * time.Second

// Errors of a Daemon. Callers branch on them with errors.Is.
var (
	// ErrNotLoaded: the policy file or the workers file does not load at
	// start; the error names the file ("policy.hcl does not load") and its
	// diagnostics went to DaemonOptions.Diagnostics.
	ErrNotLoaded = errors.New("does not load")
	// ErrNotRunning: Reload before the Daemon is ready (OnReady) or
	// after Run returned.
	ErrNotRunning = errors.New("live: the daemon is not running")
	// ErrReloadFailed: the policy file did not reload (it does not load,
	// or sets another router.block_size); the running policies and
	// workers stay.
	ErrReloadFailed = errors.New("policy file not reloaded; the running policies and workers stay")
	// ErrPartialReload: the policy file reloaded (its policies decide
	// now) but the workers could not be set from it and the workers file
	// (the workers file does not load, or the two repeat a name); the
	// previous workers stay until a reload or a workers file change
	// succeeds.
	ErrPartialReload = errors.New("policy file reloaded, but the workers were not updated; the previous workers stay")
)

// DaemonOptions configure a Daemon: what the runtime's flags of `router
// serve` and `router epp` say, and the face to serve.
type DaemonOptions struct {
	// PolicyFile is the policy file (required): its policies decide, its
	// worker blocks are workers, its queue block is the queue.
	PolicyFile string
	// WorkersFile, when set, is a file of worker blocks
	// (config.LoadWorkers), watched for the daemon's life: the workers are
	// the policy file's worker blocks followed by this file's.
	WorkersFile string
	// Pods, when set, is a membership source beside those two (`router
	// serve --pool-selector`: router/kubepods, Kubernetes pods): the
	// workers are the policy file's, the workers file's, then Pods'. The
	// Daemon reads Pods.Workers at each sync of the workers and syncs
	// again after each value on Pods.Changes; the caller starts and stops
	// it.
	Pods WorkerSource
	// StartPods, when set and Pods is nil, starts Pods: Run calls it once
	// the policy file and the workers file have loaded and their
	// diagnostics are written, before the workers are first set, so that
	// a file's errors are reported before a membership source's (`router
	// serve --pool-selector` lists the Kubernetes pods here, as Listen
	// opens the listeners after the files). A nil source means none. Run
	// returns its error as is; the caller stops what it started.
	StartPods func() (WorkerSource, error)
	// Catalog holds the built-in component types the policy file is
	// resolved against, at start and on every reload; nil means
	// catalog.Default() (loader.LoadOptions.Catalog). Tests add types of
	// their own to a clone of the default.
	Catalog *catalog.Catalog
	// Watch also reloads the policy file whenever its content changes
	// (ReloaderOptions.Watch); a reload signal reloads it either
	// way.
	Watch bool
	// Listener is where Face serves (this or Listen is required). Run
	// closes it.
	Listener net.Listener
	// Listen, when Listener is nil, opens Face's listener and the debug
	// listener (nil: none; DebugListener is then ignored) once the policy
	// file and the workers file have loaded and their diagnostics are
	// written, and before anything serves: a file's errors are reported
	// even when the address is in use, and an address in use is reported
	// only for files that load (docs/serve.md: the router loads the policy
	// file, adds the workers, listens). Run returns its error as is, and
	// closes what it opened.
	Listen func() (ln, debug net.Listener, err error)
	// Face builds the front end served on Listener (required): `router
	// serve`'s and `router epp`'s is serve's HTTP face (serve.Face).
	Face FaceFunc
	// DebugListener, when set, serves Go's profiler (net/http/pprof under
	// /debug/pprof/), the router's view of its workers (/debug/workers,
	// DebugWorkers), the blocks it believes each one's engine holds
	// (/debug/workers/NAME/blocks, DebugBlocks), the shadow decisions
	// (/debug/shadow, router.ShadowView) and the face's own views
	// (Face.DebugRoutes: the HTTP face's /debug/route), never reachable on
	// Listener. Run closes it.
	DebugListener net.Listener
	// RequestTimeout and CharsPerToken are the Runtime's (Options; zero
	// takes the defaults there).
	RequestTimeout time.Duration
	CharsPerToken  int
	// ShadowMaxInFlight is the number of shadow workers, the most shadow
	// decisions running at once (router.ShadowOptions.MaxInFlight;
	// router.DefaultShadowInFlight when zero); ShadowQueue bounds the
	// decisions waiting for one (router.ShadowOptions.QueueLen;
	// router.DefaultShadowQueue when zero).
	ShadowMaxInFlight int
	ShadowQueue       int
	// ScrapeInterval is each worker's probe period and timeout
	// (workers.DefaultScrapeInterval when zero).
	ScrapeInterval time.Duration
	// Logger receives the router's, the workers' and the server's logs;
	// nil discards them.
	Logger hclog.Logger
	// Diagnostics receives the diagnostics of the policy file and the
	// workers file loaded at start (warnings too), one per line at
	// file:line:col (config.FormatDiagnostics); nil logs them. Those of
	// later reloads are logged.
	Diagnostics io.Writer
	// Signals, when set, is the channel whose values reload the policy
	// file; nil subscribes SIGHUP for Run's whole life, so that a SIGHUP
	// never ends the process while Run runs.
	Signals <-chan os.Signal
	// Registry receives every metric and is served on /metrics; nil: a
	// new registry with Go's runtime and process collectors.
	Registry *prometheus.Registry
	// OnReady, when set, is called on Run's goroutine once the daemon is
	// ready, just before it serves: the policy file is loaded, the workers
	// are set (not yet probed), reloads are armed (the signal is caught
	// and, with Watch, the file watched) and the listeners accept. `router
	// serve` prints its "listening" line here.
	OnReady func()
}

// WorkerSource is a membership source a Daemon follows beside its files
// (DaemonOptions.Pods): Workers returns its current workers (a slice the
// caller may keep; their names must not repeat another source's);
// Changes receives a value after they changed.
type WorkerSource interface {
	Workers() []config.Worker
	Changes() <-chan struct{}
}

// FaceFunc builds a Daemon's face over its runtime once the runtime is
// built; tr is the engines' transport (the one the tokenizers use; the
// Daemon closes it when Run returns).
type FaceFunc func(rt *Runtime, tr *upstream.Transport) (Face, error)

// Face is a front end a Daemon serves on its Listener.
type Face interface {
	// Serve serves on ln until ctx ends, then drains the requests in
	// flight and returns nil, or returns the listener's error when it
	// fails first. The Daemon runs the runtime's dispatcher meanwhile.
	Serve(ctx context.Context, ln net.Listener) error
	// DebugRoutes are the face's own views on the debug listener, pattern
	// (http.ServeMux's) to handler; nil: none.
	DebugRoutes() map[string]http.Handler
}

// NewTransport returns the engines' default transport, an
// upstream.Transport: each exchange on the caller's own goroutine over
// pooled keep-alive connections (upstream.DefaultMaxIdlePerHost per
// engine, idle ones checked before reuse), no proxy, no transparent
// compression (bodies pass through as the engine sent them), a 5s dial
// timeout and no response timeout (a non-streamed answer's headers come
// when generation ends; the request timeout bounds it). It saves two
// goroutine hand-offs per request over net/http's Transport (BENCHMARKS.md).
func NewTransport() *upstream.Transport {
	return &upstream.Transport{DialTimeout: 5 * time.Second}
}

// Daemon is the live runtime without its command line: Run loads the
// policy file (loader.LoadBundle), builds the Router with admission and a
// workers.Manager of its fleet, sets the workers from the policy file's
// worker blocks, the workers file and DaemonOptions.Pods, follows the
// workers file's and the pods' changes, reloads
// the policy file on a signal (and with Watch on change), builds the
// Runtime, and serves its Face until its context ends, then drains and
// stops the plugins. Reload reloads on demand.
type Daemon struct {
	o   DaemonOptions
	log hclog.Logger

	started atomic.Bool
	ready   chan struct{} // closed once Run is ready (before OnReady)
	stopped chan struct{} // closed when Run returns

	// Set by Run before ready is closed, read-only after.
	r     *router.Router
	rl    *loader.Reloader // swaps the policy file's bundles into r
	mgr   *workers.Manager
	kvs   *kvSubs
	rt    *Runtime
	tr    *upstream.Transport // the engines' transport
	queue config.Queue        // the running queue's settings

	// syncMu serialises reading the membership (the current bundle's
	// worker blocks, the workers file) with Syncing it, so a later read
	// is never overwritten by an earlier one.
	syncMu sync.Mutex
}

// NewDaemon checks o and returns a Daemon; Run starts it.
func NewDaemon(o DaemonOptions) (*Daemon, error) {
	if o.PolicyFile == "" {
		return nil, errors.New("live: daemon: no policy file")
	}
	if o.Listener == nil && o.Listen == nil {
		return nil, errors.New("live: daemon: no listener")
	}
	if o.Face == nil {
		return nil, errors.New("live: daemon: no face")
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	return &Daemon{o: o, log: o.Logger, ready: make(chan struct{}), stopped: make(chan struct{})}, nil
}

// Run runs the daemon until ctx ends, then shuts down: the face drains, watches and reloads stop, and the Router is closed
// (RouterCloseTimeout), stopping the plugins. It returns nil after a
// shutdown. A policy or workers file that does not load is an error
// wrapping ErrNotLoaded; a watch that cannot be set up, a listener that
// fails, or a Router that cannot be built are errors too. Run runs once;
// it closes the listeners whatever happens.
func (d *Daemon) Run(ctx context.Context) error {
	if !d.started.CompareAndSwap(false, true) {
		return errors.New("live: daemon: Run called twice")
	}
	defer close(d.stopped)
	o := &d.o
	if o.Listener == nil {
		o.DebugListener = nil // Listen opens it
	}
	defer func() {
		if o.Listener != nil {
			_ = o.Listener.Close()
		}
		if o.DebugListener != nil {
			_ = o.DebugListener.Close()
		}
	}()
	signals := o.Signals
	if signals == nil {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		signals = hup
	}
	reg := o.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}

	load := loader.LoadOptions{Logger: d.log, Registerer: reg, Catalog: o.Catalog}
	b, diags := loader.LoadBundle(ctx, o.PolicyFile, load)
	d.diagnostics(diags)
	if diags.HasErrors() || b == nil {
		return fmt.Errorf("%s %w", o.PolicyFile, ErrNotLoaded)
	}
	r, err := d.newRouter(ctx, b, reg, load)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RouterCloseTimeout)
		defer cancel()
		if err := r.Close(cctx); err != nil {
			d.log.Warn("plugins did not stop cleanly", "error", err)
		}
	}()
	// The workers with a kv_events block get their engines' KV events
	// followed as they join (kvSubs wraps the Router's membership); with
	// a cluster block, from the cluster's stream (useCluster below).
	kvs := newKVSubs(r, d.log, b.Cluster() != nil)
	defer kvs.close()
	if err := kvs.register(reg); err != nil {
		return fmt.Errorf("kv events: metrics: %w", err)
	}
	// The engines' transport: requests, disaggregated hops and engine
	// tokenizers. An address no worker has any more (a worker removed or
	// moved: a workers file edit, a replaced pod) has its connections
	// closed as it leaves.
	d.tr = NewTransport()
	defer d.tr.Close()
	wo := workers.Options{
		Logger: d.log, Registerer: reg, ScrapeInterval: o.ScrapeInterval, BlockSize: r.BlockSizeOverride(),
		Streams: kvs.stream, IndexBlocks: kvs.indexBlocks, Departed: d.tr.CloseIdleConnectionsTo,
	}
	// The KV-event publishers the engines report, and the restarts their
	// metrics show, go to the subscribers.
	wo.KVSources, wo.EngineRestarted = kvs.SetSources, kvs.EngineRestarted
	mgr, err := workers.NewManager(kvs, wo)
	if err != nil {
		return err
	}
	defer mgr.Close()
	d.r, d.mgr, d.kvs = r, mgr, kvs
	// The workers file is watched from before its first load, so a change
	// made while the router starts is not lost.
	var workersWatch *filewatch.Watcher
	if o.WorkersFile != "" {
		if workersWatch, err = filewatch.New(o.WorkersFile, workers.DefaultDebounce); err != nil {
			return fmt.Errorf("workers file: %w", err)
		}
		defer func() { _ = workersWatch.Close() }()
	}
	if o.Pods == nil && o.StartPods != nil {
		// The workers file's errors before the pods' (syncWorkers reads
		// it again, and writes its diagnostics).
		if o.WorkersFile != "" {
			if _, fdiags := config.LoadWorkers(o.WorkersFile); fdiags.HasErrors() {
				d.diagnostics(fdiags)
				return fmt.Errorf("%s %w", o.WorkersFile, ErrNotLoaded)
			}
		}
		if o.Pods, err = o.StartPods(); err != nil {
			return err
		}
	}
	_, wdiags, err := d.syncWorkers()
	d.diagnostics(wdiags)
	if err != nil {
		return err
	}
	toks, err := d.tokenizers(b)
	if err != nil {
		return fmt.Errorf("%s %w: %w", o.PolicyFile, ErrNotLoaded, err)
	}
	if o.Listener == nil {
		if o.Listener, o.DebugListener, err = o.Listen(); err != nil {
			return err
		}
	}
	// Replicas share their bookings and prefix records (the cluster
	// block; read once at start, as the queue block is).
	var rep *cluster.Replica
	var sessions *cluster.Sessions
	if c := b.Cluster(); c != nil {
		rep, err = cluster.New(cluster.Options{Config: *c, Router: r, Registerer: reg, Logger: d.log,
			Capacity: int64(d.queue.MaxActiveRequests),
			Resolve: func(name string) (shared.WorkerID, bool) {
				st, ok := mgr.StatusOf(name)
				return st.ID, ok
			}})
		if err != nil {
			return err
		}
		// And their session-affinity bindings.
		if sessions, err = cluster.NewSessions(cluster.SessionsOptions{Config: *c, Router: r, Registerer: reg, Logger: d.log}); err != nil {
			return err
		}
		kvs.useCluster(rep)
	}
	opts := Options{
		Router: r, Queue: d.queue, Workers: mgr, Registry: reg, Logger: d.log, Tokenizers: toks,
		RequestTimeout: o.RequestTimeout, CharsPerToken: o.CharsPerToken, Streams: kvs.stream,
	}
	if rep != nil {
		opts.Observer, opts.Sessions = rep, sessions.For
	}
	if d.rt, err = New(opts); err != nil {
		return err
	}
	// After the face drained: nothing places requests any more.
	defer d.rt.Close()
	face, err := o.Face(d.rt, d.tr)
	if err != nil {
		return err
	}
	reloader, err := NewReloader(d.rl, ReloaderOptions{
		Path: o.PolicyFile, Watch: o.Watch, Logger: d.log, Signals: signals,
		OnReload: func(diags hcl.Diagnostics) { _ = d.afterReload(diags) },
	})
	if err != nil {
		return err
	}

	bg, stopBG := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stopBG()
		wg.Wait()
	}()
	reloadErr := make(chan error, 1)
	wg.Go(func() { reloadErr <- reloader.Run(bg) })
	// Reloads are armed (the signal read, the watch watching) before the
	// daemon is ready (OnReady): a change from then on is not lost.
	select {
	case <-reloader.Ready():
	case err := <-reloadErr:
		return fmt.Errorf("policy file: %w", err)
	}
	if workersWatch != nil {
		wg.Go(func() { d.watchWorkers(bg, workersWatch) })
	}
	if o.Pods != nil {
		wg.Go(func() { d.watchPods(bg) })
	}
	if rep != nil {
		wg.Go(func() {
			if err := rep.Run(bg); err != nil {
				d.log.Error("the cluster block's NATS cannot be used; this replica routes alone", "error", err)
			}
		})
		wg.Go(func() {
			if err := sessions.Run(bg); err != nil {
				d.log.Error("the cluster block's NATS cannot be used; session bindings stay local", "error", err)
			}
		})
	}
	// The dispatcher runs until the face has drained (bg ends after
	// Serve returns).
	wg.Go(func() { d.rt.Dispatcher(bg) })
	if o.DebugListener != nil {
		routes := map[string]http.Handler{
			"GET /debug/workers":               http.HandlerFunc(d.rt.debugWorkers),
			"GET /debug/workers/{name}/blocks": blocksView{status: mgr.StatusOf, kvs: kvs},
			"GET /debug/shadow":                http.HandlerFunc(d.rt.debugShadow),
		}
		maps.Copy(routes, face.DebugRoutes())
		wg.Go(func() { serveDebug(bg, o.DebugListener, d.log, routes) })
	}
	close(d.ready)
	if o.OnReady != nil {
		o.OnReady()
	}
	return face.Serve(ctx, o.Listener)
}

// Runtime returns the daemon's Runtime once Run has built it (from
// OnReady on, while Run runs); nil before. `router epp` places its
// requests with it (Runtime.Place).
func (d *Daemon) Runtime() *Runtime {
	select {
	case <-d.ready:
		return d.rt
	default:
		return nil
	}
}

// newRouter builds the Router over b with admission (b's queue; the
// classifier is taken from the current bundle at each request, so a
// reload that changes or removes request_classifier takes effect). b is
// closed when the Router cannot be built.
func (d *Daemon) newRouter(ctx context.Context, b *loader.Bundle, reg prometheus.Registerer, load loader.LoadOptions) (*router.Router, error) {
	closeBundle := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RouterCloseTimeout)
		defer cancel()
		_ = b.Close(cctx)
	}
	if _, err := b.Classifier(); err != nil {
		closeBundle()
		return nil, err
	}
	r, err := router.New(router.Options{Bundle: b.Bundle, Registerer: reg,
		Shadow: router.ShadowOptions{MaxInFlight: d.o.ShadowMaxInFlight, QueueLen: d.o.ShadowQueue, Logger: d.log.Named("shadow")},
		Canary: router.CanaryOptions{OnRollback: d.logRollback}})
	if err != nil {
		closeBundle()
		return nil, err
	}
	if d.rl, err = loader.NewReloader(r, loader.ReloadOptions{Load: load, Logger: d.log, Registerer: reg}); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RouterCloseTimeout)
		defer cancel()
		_ = r.Close(cctx)
		return nil, err
	}
	// The queue is built once (the Runtime's admission takes it): a reload
	// that changes it is warned about.
	d.queue = b.Queue()
	return r, nil
}

// logRollback logs a canary's rollback (router.CanaryOptions.OnRollback)
// at warning level: the candidate decides nothing until the policy file
// is loaded again.
func (d *Daemon) logRollback(rb router.CanaryRollback) {
	d.log.Warn("canary rolled back: the live policy decides every request until the policy file is reloaded",
		"role", string(rb.Role), "policy", rb.Policy, "candidate", rb.Candidate, "reason", rb.Reason,
		"window_decisions", rb.Window.Decisions, "window_fallbacks", rb.Window.Fallbacks,
		"window_ttfts", rb.Window.TTFTs, "window_ttft_p90", rb.Window.TTFTP90.String(),
		"candidate_decisions", rb.CandidateDecisions)
}

// Reload reloads the policy file, as a reload signal does, and waits for
// it: loader.Reloader.Reload (a new bundle with fresh plugins, applied once
// ready), then the workers are set from the new file's worker blocks and
// the workers file. It returns nil when both applied; an error wrapping
// ErrReloadFailed (with the diagnostics) when the file did not reload and
// nothing changed; one wrapping ErrPartialReload when the new policies
// decide but the workers could not be updated; ErrNotRunning outside
// Run. ctx bounds the new plugins' starts. Reloads are serialised with
// the signal's and the watch's.
func (d *Daemon) Reload(ctx context.Context) error {
	select {
	case <-d.stopped:
		return ErrNotRunning
	default:
	}
	select {
	case <-d.ready:
	default:
		return ErrNotRunning
	}
	d.log.Info("reloading the policy file", "path", d.o.PolicyFile, "cause", "Reload")
	return d.afterReload(d.rl.Reload(ctx, d.o.PolicyFile))
}

// afterReload finishes a reload whose diagnostics are diags (logged by
// loader.Reloader.Reload): it warns when the queue block changed, and sets the
// workers again. See Reload for the error.
func (d *Daemon) afterReload(diags hcl.Diagnostics) error {
	if diags.HasErrors() {
		return fmt.Errorf("%w: %s", ErrReloadFailed, strings.TrimSpace(config.FormatDiagnostics(diags)))
	}
	b := loader.Current(d.r)
	if b != nil && !reflect.DeepEqual(queueSettings(b.Queue()), queueSettings(d.queue)) {
		d.log.Warn("the queue block changed; the running queue keeps its settings until a restart", "path", d.o.PolicyFile)
	}
	if b != nil {
		if toks, err := d.tokenizers(b); err != nil {
			d.log.Error("the tokenizer blocks did not load; the previous tokenizers stay", "path", d.o.PolicyFile, "error", err)
		} else {
			d.rt.SetTokenizers(toks)
		}
	}
	_, wdiags, err := d.syncWorkers()
	if err != nil {
		err = withDiagnostics(err, wdiags)
		d.log.Error("policy reload half-applied: the new policies decide, but the workers were not updated; the previous workers stay",
			"path", d.o.PolicyFile, "error", err)
		return fmt.Errorf("%w: %w", ErrPartialReload, err)
	}
	d.warnWorkers(wdiags)
	d.rt.Wake()
	return nil
}

// tokenizers builds the tokenizers of b's tokenizer blocks, and for every
// other model the workers serve its engines' /tokenize (a LoRA adapter
// taking its base model's, when the workers know adapters' parents):
// tokenizer.NewSet with Defaults. An engine-sourced tokenizer calls the
// ready worker serving its model with the fewest requests in flight.
func (d *Daemon) tokenizers(b *loader.Bundle) (*tokenizer.Set, error) {
	var blocks []config.Tokenizer
	if pf := b.PolicyFile(); pf != nil {
		blocks = pf.Tokenizers
	}
	def := tokenizer.Defaults{Served: d.mgr.Serves}
	if p, ok := any(d.mgr).(interface{ Parent(model string) string }); ok {
		def.Parent = p.Parent
	}
	client := &http.Client{Transport: d.tr}
	return tokenizer.NewSet(blocks, d.tokenizerEngine, tokenizer.EngineOptions{Client: client}, def)
}

// tokenizerEngine returns the engine chooser of model's engine-sourced
// tokenizer: the base URL of the ready worker serving model (any role)
// with the fewest requests in flight, or an error naming the model when
// none is ready.
func (d *Daemon) tokenizerEngine(model string) tokenizer.EngineURL {
	return func(context.Context) (string, error) {
		var best *fleet.Worker
		for _, role := range []shared.Role{shared.RoleAggregated, shared.RolePrefill, shared.RoleDecode} {
			for _, w := range d.r.Workers(model, role) {
				if best == nil || w.ActiveRequests() < best.ActiveRequests() {
					best = w
				}
			}
		}
		if best != nil {
			if u, ok := d.mgr.URL(best.Name); ok {
				return u, nil
			}
		}
		return "", fmt.Errorf("no ready worker serves model %q", model)
	}
}

// watchWorkers sets the workers again after each change w reports of the
// workers file's content (router/filewatch: also a rename over it and a
// Kubernetes ConfigMap `..data` swap), until ctx ends. Watch errors are
// logged.
//
// workers.Manager.Watch is not used: it makes the workers file the whole
// membership, dropping the policy file's worker blocks; here the
// membership is both.
func (d *Daemon) watchWorkers(ctx context.Context, w *filewatch.Watcher) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.Changes():
			n, diags, err := d.syncWorkers()
			if err != nil {
				d.log.Error("workers file change not applied; the workers stay", "path", d.o.WorkersFile, "error", withDiagnostics(err, diags))
				continue
			}
			d.warnWorkers(diags)
			d.log.Info("workers file reloaded", "path", d.o.WorkersFile, "workers", n)
			d.rt.Wake()
		case err := <-w.Errors():
			d.log.Warn("watching the workers file", "path", d.o.WorkersFile, "error", err)
		}
	}
}

// watchPods sets the workers again after each change of DaemonOptions.Pods,
// until ctx ends.
func (d *Daemon) watchPods(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.o.Pods.Changes():
			n, diags, err := d.syncWorkers()
			if err != nil {
				d.log.Error("pod change not applied; the workers stay", "error", withDiagnostics(err, diags))
				continue
			}
			d.log.Info("workers set from pods", "workers", n)
			d.rt.Wake()
		}
	}
}

// syncWorkers makes the current bundle's worker blocks followed by the
// workers file's and DaemonOptions.Pods' the Manager's workers, and
// returns how many there are and the workers file's diagnostics, with a
// warning at each of its workers whose url a policy file's worker has
// (config.SameURLAcross). A
// workers file that does not load is an error wrapping ErrNotLoaded and
// changes nothing; so is a set the Manager refuses (a repeated name).
func (d *Daemon) syncWorkers() (int, hcl.Diagnostics, error) {
	d.syncMu.Lock()
	defer d.syncMu.Unlock()
	b := loader.Current(d.r)
	if b == nil {
		return 0, nil, router.ErrClosed
	}
	ws := b.Workers()
	var diags hcl.Diagnostics
	if d.o.WorkersFile != "" {
		var fw []config.Worker
		fw, diags = config.LoadWorkers(d.o.WorkersFile)
		if diags.HasErrors() {
			return 0, diags, fmt.Errorf("%s %w", d.o.WorkersFile, ErrNotLoaded)
		}
		// One engine in both files: warned as within one file.
		diags = append(diags, config.SameURLAcross(ws, fw)...)
		ws = append(ws, fw...)
	}
	if d.o.Pods != nil {
		ws = append(ws, d.o.Pods.Workers()...)
	}
	prev := d.kvs.expect(ws)
	if err := d.mgr.Sync(ws); err != nil {
		d.kvs.setWorkers(prev)
		return len(ws), diags, err
	}
	d.kvs.setWorkers(configured(ws))
	return len(ws), diags, nil
}

// warnWorkers logs the warnings of a workers file that loaded after a
// change of it or of the policy file (a worker at the url of another,
// config.SameURLAcross among them); those at start go to
// DaemonOptions.Diagnostics.
func (d *Daemon) warnWorkers(diags hcl.Diagnostics) {
	if len(diags) > 0 {
		d.log.Warn("workers file loaded with warnings", "path", d.o.WorkersFile, "diagnostics", strings.TrimSpace(config.FormatDiagnostics(diags)))
	}
}

// withDiagnostics adds the error diagnostics among diags to err's text.
func withDiagnostics(err error, diags hcl.Diagnostics) error {
	if !diags.HasErrors() {
		return err
	}
	return fmt.Errorf("%w\n%s", err, strings.TrimSpace(config.FormatDiagnostics(diags)))
}

// diagnostics writes load diagnostics to DaemonOptions.Diagnostics, or
// logs them.
func (d *Daemon) diagnostics(diags hcl.Diagnostics) {
	switch {
	case len(diags) == 0:
	case d.o.Diagnostics != nil:
		fmt.Fprint(d.o.Diagnostics, config.FormatDiagnostics(diags))
	case diags.HasErrors():
		d.log.Error("load failed", "diagnostics", strings.TrimSpace(config.FormatDiagnostics(diags)))
	default:
		d.log.Warn("loaded with warnings", "diagnostics", strings.TrimSpace(config.FormatDiagnostics(diags)))
	}
}

// serveDebug serves net/http/pprof's handlers and routes (pattern to
// handler: GET /debug/workers, GET /debug/workers/{name}/blocks,
// /debug/route) on ln
// until ctx ends. It is a listener of its own so that the profiler and
// the router's views are never reachable on the face's address.
func serveDebug(ctx context.Context, ln net.Listener, log hclog.Logger, routes map[string]http.Handler) {
	mux := http.NewServeMux()
	for pattern, h := range routes {
		mux.Handle(pattern, h)
	}
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	stop := context.AfterFunc(ctx, func() { _ = hs.Close() })
	defer stop()
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("profiler listener stopped", "error", err)
	}
}

// queueSettings is what of a queue block the running queue was built from
// (its source range aside).
func queueSettings(q config.Queue) config.Queue {
	q.Range = hcl.Range{}
	q.Classes = slices.Clone(q.Classes)
	for i := range q.Classes {
		q.Classes[i].Range = hcl.Range{}
	}
	return q
}
