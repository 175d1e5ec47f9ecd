package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/filewatch"
	"github.com/switchyard-router/switchyard/router/serve"
	"github.com/switchyard-router/switchyard/router/workers"
)

// routerCloseTimeout bounds the Router's close (the bundle's drain and
// its plugins' shutdown) once the server has drained.
const routerCloseTimeout = 10 * time.Second

type serveOptions struct {
	policy         string
	listen         string
	workersFile    string
	watch          bool
	requestTimeout time.Duration
	drainTimeout   time.Duration
	charsPerToken  int
	logLevel       string
	debugListen    string
}

func newServeCmd() *cobra.Command {
	o := serveOptions{}
	cmd := &cobra.Command{
		Use:   "serve --policy FILE",
		Short: "Route live OpenAI-compatible traffic to inference engines by policy",
		Long: `serve routes OpenAI-compatible requests (POST /v1/chat/completions and
/v1/completions, streamed or not) to the workers of the policy file's worker
blocks and of --workers-file, choosing each request's worker by the policy
(queueing at the queue block's capacity), and proxies the answer back
chunk by chunk. GET /v1/models lists the workers' models, /metrics the
router's Prometheus metrics, /healthz liveness and /readyz readiness: 200
when the policy is loaded and at least one worker is ready, with JSON
saying, per worker, ready or not and why, and each plugin's state (a
plugin that is down degrades its policies to their fallbacks; it does not
make the router unready). Why a worker is not ready is also logged.

SIGHUP reloads the policy file (and, with --watch, so does every change to
it); the workers file is always watched. SIGTERM or SIGINT stops accepting,
lets the requests in flight finish for up to --drain-timeout, stops the
plugins and exits 0.

It prints "router serve listening on http://ADDR" once it accepts
connections (useful with --listen 127.0.0.1:0).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.policy == "" {
				return errors.New("--policy FILE is required")
			}
			if o.charsPerToken < 1 {
				return fmt.Errorf("--chars-per-token %d: want %s", o.charsPerToken, charsPerTokenWant)
			}
			if o.requestTimeout <= 0 {
				return fmt.Errorf("--request-timeout %v: want %s", o.requestTimeout, positiveDurationWant)
			}
			if o.drainTimeout <= 0 {
				return fmt.Errorf("--drain-timeout %v: want %s", o.drainTimeout, positiveDurationWant)
			}
			level := hclog.LevelFromString(o.logLevel)
			if level == hclog.NoLevel {
				return fmt.Errorf("--log-level %q, want trace, debug, info, warn, error or off", o.logLevel)
			}
			return runServe(cmd.Context(), o, level, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.policy, "policy", "", "policy file (required)")
	f.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to serve on")
	f.StringVar(&o.workersFile, "workers-file", "", "file of worker blocks, watched: workers join and leave as it changes")
	f.BoolVar(&o.watch, "watch", false, "reload the policy file when it changes (SIGHUP always reloads it)")
	f.DurationVar(&o.requestTimeout, "request-timeout", serve.DefaultRequestTimeout, "bound on each request, queue wait and streamed answer included")
	f.DurationVar(&o.drainTimeout, "drain-timeout", serve.DefaultDrainTimeout, "on SIGTERM, how long requests in flight may finish")
	f.IntVar(&o.charsPerToken, "chars-per-token", serve.DefaultCharsPerToken, "characters per token of text prompts' routing key (an approximation)")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: trace, debug, info, warn, error, off")
	f.StringVar(&o.debugListen, "debug-listen", "", "serve Go's profiler (/debug/pprof/) on this separate address; off when empty")
	setWant(f, "request-timeout", positiveDurationWant)
	setWant(f, "drain-timeout", positiveDurationWant)
	setWant(f, "chars-per-token", charsPerTokenWant)
	return cmd
}

// charsPerTokenWant words the values --chars-per-token accepts.
var charsPerTokenWant = fmt.Sprintf("a whole number from 1 to %d", math.MaxInt)

// positiveDurationWant words the values of a duration flag that must be
// positive; 2562047h is about the largest time.Duration.
const positiveDurationWant = "a duration greater than 0 with a unit, such as 500ms, 30s, 5m or 1h30m (at most 2562047h)"

// runServe runs `router serve` until ctx ends.
func runServe(ctx context.Context, o serveOptions, level hclog.Level, stdout, stderr io.Writer) error {
	log := hclog.New(&hclog.LoggerOptions{Name: "router", Output: stderr, Level: level})
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	b, diags := router.LoadBundle(ctx, o.policy, router.LoadOptions{Logger: log, Registerer: reg})
	if diags.HasErrors() || b == nil {
		fmt.Fprint(stderr, config.FormatDiagnostics(diags))
		return &exitError{code: 1, err: fmt.Errorf("%s does not load", o.policy)}
	}
	if len(diags) > 0 {
		fmt.Fprint(stderr, config.FormatDiagnostics(diags))
	}
	r, err := router.New(router.Options{Bundle: b, Registerer: reg, Logger: log, Load: router.LoadOptions{Logger: log, Registerer: reg}})
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), routerCloseTimeout)
		defer cancel()
		_ = b.Close(cctx)
		return &exitError{code: 1, err: err}
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), routerCloseTimeout)
		defer cancel()
		if err := r.Close(cctx); err != nil {
			log.Warn("plugins did not stop cleanly", "error", err)
		}
	}()
	// The classifier is not handed to the server: admission takes it from
	// the Router's current bundle, so a reload that changes or removes the
	// request_classifier block takes effect (admission checks its type).
	// The queue is built once: a reload that changes it is warned about.
	queue, _, err := admission(o.policy, b.Config)
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	mgr, err := workers.NewManager(r, workers.Options{Logger: log, Registerer: reg})
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	defer mgr.Close()
	// The workers file is watched from before its first load, so a change
	// made while the router starts is not lost.
	var workersWatch *filewatch.Watcher
	if o.workersFile != "" {
		if workersWatch, err = filewatch.New(o.workersFile, workers.DefaultDebounce); err != nil {
			return &exitError{code: 1, err: fmt.Errorf("--workers-file: %w", err)}
		}
		defer func() { _ = workersWatch.Close() }()
	}
	ws, err := serveWorkers(b.Config, o.workersFile, stderr)
	if err != nil {
		return err
	}
	if err := mgr.Sync(ws); err != nil {
		return &exitError{code: 1, err: err}
	}
	srv, err := serve.New(serve.Options{
		Router: r, Queue: queue, Workers: mgr, Registry: reg, Logger: log,
		RequestTimeout: o.requestTimeout, DrainTimeout: o.drainTimeout, CharsPerToken: o.charsPerToken,
	})
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	// SIGHUP is caught for the process's whole life, not only while the
	// reloader runs: its default action would end the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	reloader, err := router.NewReloader(r, router.ReloaderOptions{
		Path: o.policy, Watch: o.watch, Logger: log, Signals: hup,
		OnReload: func(d hcl.Diagnostics) {
			if d.HasErrors() {
				return
			}
			if q, _, err := admission(o.policy, r.Bundle().Config); err == nil && !reflect.DeepEqual(queueSettings(q), queueSettings(queue)) {
				log.Warn("the queue block changed; the running queue keeps its settings until a restart", "path", o.policy)
			}
			// The reloaded file's worker blocks (and the workers file) are
			// the membership now.
			var diags strings.Builder
			ws, err := serveWorkers(r.Bundle().Config, o.workersFile, &diags)
			if err != nil {
				err = fmt.Errorf("%w\n%s", err, strings.TrimSpace(diags.String()))
			}
			if err == nil {
				err = mgr.Sync(ws)
			}
			if err != nil {
				log.Error("workers not updated after the policy reload", "error", err)
			}
			srv.Wake()
		},
	})
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return &exitError{code: 1, err: fmt.Errorf("--listen %s: %w", o.listen, err)}
	}
	bg, stopBG := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stopBG()
		wg.Wait()
	}()
	reloadErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		reloadErr <- reloader.Run(bg)
	}()
	// Reloads are armed (SIGHUP read, --watch watching) before the
	// listening line: a change from then on is not lost.
	select {
	case <-reloader.Ready():
	case err := <-reloadErr:
		_ = ln.Close()
		return &exitError{code: 1, err: fmt.Errorf("--watch: %w", err)}
	}
	if o.workersFile != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resync := func() {
				b := r.Bundle()
				if b == nil {
					return
				}
				var diags strings.Builder
				ws, err := serveWorkers(b.Config, o.workersFile, &diags)
				if err != nil {
					err = fmt.Errorf("%w\n%s", err, strings.TrimSpace(diags.String()))
				}
				if err == nil {
					err = mgr.Sync(ws)
				}
				if err != nil {
					log.Error("workers file change not applied; the workers stay", "path", o.workersFile, "error", err)
					return
				}
				log.Info("workers file reloaded", "path", o.workersFile, "workers", len(ws))
				srv.Wake()
			}
			warn := func(err error) { log.Warn("watching the workers file", "path", o.workersFile, "error", err) }
			watchFile(bg, workersWatch, resync, warn)
		}()
	}
	if o.debugListen != "" {
		dln, err := net.Listen("tcp", o.debugListen)
		if err != nil {
			_ = ln.Close()
			return &exitError{code: 1, err: fmt.Errorf("--debug-listen %s: %w", o.debugListen, err)}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			serveDebug(bg, dln, log)
		}()
		fmt.Fprintf(stdout, "router serve profiler on http://%s/debug/pprof/\n", dln.Addr())
	}
	fmt.Fprintf(stdout, "router serve listening on http://%s\n", ln.Addr())
	if err := srv.Serve(ctx, ln); err != nil {
		return &exitError{code: 1, err: err}
	}
	return nil
}

// watchFile calls changed after each change w reports of its file's
// content (router/filewatch: also a rename over it and a Kubernetes
// ConfigMap `..data` swap), until ctx ends. Watch errors go to warn.
//
// serve does not use workers.Manager.Watch: that makes the workers file
// the whole membership, dropping the policy file's worker blocks; here the
// membership is both.
func watchFile(ctx context.Context, w *filewatch.Watcher, changed func(), warn func(error)) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.Changes():
			changed()
		case err := <-w.Errors():
			warn(err)
		}
	}
}

// serveWorkers is the policy file's worker blocks followed by the
// workers file's.
func serveWorkers(b *config.Bundle, workersFile string, stderr io.Writer) ([]config.Worker, error) {
	ws := append([]config.Worker(nil), b.Workers...)
	if workersFile == "" {
		return ws, nil
	}
	fw, diags := config.LoadWorkers(workersFile)
	if diags.HasErrors() {
		fmt.Fprint(stderr, config.FormatDiagnostics(diags))
		return nil, &exitError{code: 1, err: fmt.Errorf("%s does not load", workersFile)}
	}
	return append(ws, fw...), nil
}

// serveDebug serves net/http/pprof's handlers on ln until ctx ends. It is
// a listener of its own so that the profiler is never reachable on the
// API address.
func serveDebug(ctx context.Context, ln net.Listener, log hclog.Logger) {
	mux := http.NewServeMux()
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
