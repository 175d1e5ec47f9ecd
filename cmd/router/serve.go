package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/migrate"
	"github.com/switchyard-router/switchyard/router/serve"
)

// runtimeFlags are the flags of the live runtime that both `router serve`
// and `router epp` run on (live.Daemon: the policy file, the workers, the
// request intake, the debug listener): register puts the same flags, with
// the same defaults, usage and accepted values, on both commands, so that
// they cannot drift apart. Each command adds its face's own flags.
type runtimeFlags struct {
	policy         string
	workersFile    string
	watch          bool
	requestTimeout time.Duration
	drainTimeout   time.Duration
	charsPerToken  int
	debugListen    string
	shadowInFlight int
	shadowQueue    int
	// passThrough is --pass-through: unknown paths under /v1/ are
	// proxied to an engine serving the body's model.
	passThrough bool
	pods        podFlags
}

// register registers the runtime's flags on f.
func (r *runtimeFlags) register(f *pflag.FlagSet) {
	f.StringVar(&r.policy, "policy", "", "policy file (required)")
	f.StringVar(&r.workersFile, "workers-file", "", "file of worker blocks, watched: workers join and leave as it changes")
	f.BoolVar(&r.watch, "watch", false, "reload the policy file when it changes (SIGHUP always reloads it)")
	f.DurationVar(&r.requestTimeout, "request-timeout", live.DefaultRequestTimeout, "bound on each request: an HTTP API request's queue wait and streamed answer, an ext_proc request's wait in the queue")
	f.DurationVar(&r.drainTimeout, "drain-timeout", serve.DefaultDrainTimeout, "on SIGTERM or SIGINT, how long requests in flight (HTTP requests, ext_proc streams) may finish")
	f.IntVar(&r.charsPerToken, "chars-per-token", live.DefaultCharsPerToken, "bytes of text per token of text prompts' routing key (an approximation)")
	f.StringVar(&r.debugListen, "debug-listen", "", "serve Go's profiler (/debug/pprof/) and the router's debug views on this separate address; off when empty")
	f.IntVar(&r.shadowInFlight, "shadow-max-inflight", router.DefaultShadowInFlight, "shadow workers: most shadow decisions running at once (policies with a shadow); a shadow that cannot keep up with every decision is sampled")
	f.IntVar(&r.shadowQueue, "shadow-queue", router.DefaultShadowQueue, "most shadow decisions waiting for a shadow worker; one more is dropped (counted) until the sample rate adapts")
	f.BoolVar(&r.passThrough, "pass-through", true, "proxy a POST to a path under /v1/ the router does not route by its schema to an engine serving the body's \"model\" (admitted by load); --pass-through=false answers such paths 404")
	setWant(f, "request-timeout", positiveDurationWant)
	setWant(f, "drain-timeout", positiveDurationWant)
	setWant(f, "chars-per-token", charsPerTokenWant)
	setWant(f, "shadow-max-inflight", shadowInFlightWant)
	setWant(f, "shadow-queue", shadowQueueWant)
	r.pods.register(f)
}

// check checks the runtime's flags as f parsed them: the first value out
// of its range is the error, naming the flag and what it accepts.
func (r *runtimeFlags) check(f *pflag.FlagSet) error {
	switch {
	case r.policy == "":
		return errors.New("--policy FILE is required")
	case r.requestTimeout <= 0:
		return fmt.Errorf("--request-timeout %v: want %s", r.requestTimeout, positiveDurationWant)
	case r.drainTimeout <= 0:
		return fmt.Errorf("--drain-timeout %v: want %s", r.drainTimeout, positiveDurationWant)
	case r.charsPerToken < 1:
		return fmt.Errorf("--chars-per-token %d: want %s", r.charsPerToken, charsPerTokenWant)
	case r.shadowInFlight < 1 || r.shadowInFlight > maxShadowInFlight:
		return fmt.Errorf("--shadow-max-inflight %d: want %s", r.shadowInFlight, shadowInFlightWant)
	case r.shadowQueue < 1 || r.shadowQueue > maxShadowQueue:
		return fmt.Errorf("--shadow-queue %d: want %s", r.shadowQueue, shadowQueueWant)
	}
	return r.pods.check(f)
}

// listenFace opens the face's listener on addr, given by flag (serve's
// --listen, epp's --http-listen), and --debug-listen's (listenDebug),
// closing the first when the second fails.
func (r *runtimeFlags) listenFace(flag, addr string) (ln, debug net.Listener, err error) {
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", flag, addr, err)
	}
	if debug, err = r.listenDebug(); err != nil {
		_ = ln.Close()
		return nil, nil, err
	}
	return ln, debug, nil
}

// listenDebug opens --debug-listen's listener; nil when the flag is empty.
func (r *runtimeFlags) listenDebug() (net.Listener, error) {
	if r.debugListen == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", r.debugListen)
	if err != nil {
		return nil, fmt.Errorf("--debug-listen %s: %w", r.debugListen, err)
	}
	return ln, nil
}

// daemonOptions returns the DaemonOptions the runtime's flags set, with
// serve's HTTP face (serve.Face) as the face, draining for
// --drain-timeout, passing unknown paths through unless
// --pass-through=false, reporting the router's version on GET /version;
// the caller adds its listeners, pods, logger and the rest.
func (r *runtimeFlags) daemonOptions(face serve.Options) live.DaemonOptions {
	face.DrainTimeout = r.drainTimeout
	face.DisablePassThrough = !r.passThrough
	face.Version = routerVersion()
	return live.DaemonOptions{
		PolicyFile: r.policy, WorkersFile: r.workersFile, Watch: r.watch,
		RequestTimeout: r.requestTimeout, CharsPerToken: r.charsPerToken,
		ShadowMaxInFlight: r.shadowInFlight, ShadowQueue: r.shadowQueue, Face: serve.Face(face),
	}
}

// serveOptions are `router serve`'s flags: the runtime's and the HTTP
// face's.
type serveOptions struct {
	runtimeFlags
	listen string
	// bodyPerClient is --max-body-bytes-per-client; 0: no bound per
	// client address.
	bodyPerClient byteSize
	// migrationLimit is --migration-limit (0: none); stall is
	// --stall-timeout (0: never).
	migrationLimit int
	stall          time.Duration
	// grace is --worker-drain-grace (0: never move).
	grace time.Duration
}

func newServeCmd() *cobra.Command {
	o := serveOptions{bodyPerClient: serve.DefaultMaxBodyBytesPerClient}
	cmd := &cobra.Command{
		Use:   "serve --policy FILE",
		Short: "Route live OpenAI-compatible traffic to inference engines by policy",
		Long: `serve routes OpenAI-compatible requests (POST /v1/chat/completions,
/v1/completions, /v1/responses and Anthropic's /v1/messages, streamed or not;
embeddings, pooling, classify, score and rerank, admitted by load; tokenize and
detokenize, not counted as load) to the workers of the policy file's worker
blocks, of --workers-file and, with --pool-selector, of the ready Kubernetes
pods it matches (at --pool-port), choosing each request's worker by the policy
(queueing at the queue block's capacity), and proxies the answer back
chunk by chunk. A Responses request continuing a stored response goes to the
engine that holds it. Other POSTs under /v1/ naming a model are passed through
(--pass-through=false: 404). docs/serve.md lists every endpoint.
GET /v1/models lists the engines' models as they describe them, /health,
/ping and /version answer as vLLM's do, /metrics the
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
			if err := o.check(cmd.Flags()); err != nil {
				return err
			}
			if _, err := o.migrationOptions(serve.Options{}); err != nil {
				return err
			}
			level := logLevel(cmd.Context(), hclog.Info)
			return runServe(cmd.Context(), o, level, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	o.register(f)
	f.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to serve on")
	f.Var(&o.bodyPerClient, "max-body-bytes-per-client", "most request body bytes held at once for one client address (IPv6: its /64); 0: no bound per address. Raise it behind a proxy or NAT")
	setWant(f, "max-body-bytes-per-client", byteSizeWant)
	f.IntVar(&o.migrationLimit, "migration-limit", migrate.DefaultLimit, "times a streamed chat or completions answer cut mid-stream (engine died, hung or reset) is continued on another worker; 0: none (a cut stream ends with an error event)")
	f.DurationVar(&o.stall, "stall-timeout", serve.DefaultStallTimeout, "how long a streamed answer may send no byte before its engine is taken for hung and the request migrates; 0: never")
	setWant(f, "migration-limit", migrationLimitWant)
	setWant(f, "stall-timeout", offDurationWant)
	f.DurationVar(&o.grace, "worker-drain-grace", serve.DefaultWorkerDrainGrace, "how long a generation request in flight on a worker that left the fleet (draining, removed, not ready) may run there before it moves to another worker; 0: never")
	setWant(f, "worker-drain-grace", offDurationWant)
	return cmd
}

// migrationLimitWant words the values --migration-limit takes.
const migrationLimitWant = "a whole number >= 0 (0: no migration)"

// offDurationWant words a duration flag whose 0 turns it off.
const offDurationWant = "0 (never) or a duration with a unit, such as 500ms, 30s or 5m"

// migrationOptions returns the HTTP face's migration settings from
// --migration-limit, --stall-timeout and --worker-drain-grace.
func (o *serveOptions) migrationOptions(so serve.Options) (serve.Options, error) {
	switch {
	case o.migrationLimit < 0:
		return so, fmt.Errorf("--migration-limit %d: want %s", o.migrationLimit, migrationLimitWant)
	case o.stall < 0:
		return so, fmt.Errorf("--stall-timeout %v: want %s", o.stall, offDurationWant)
	case o.grace < 0:
		return so, fmt.Errorf("--worker-drain-grace %v: want %s", o.grace, offDurationWant)
	}
	so.MigrationLimit, so.StallTimeout, so.WorkerDrainGrace = o.migrationLimit, o.stall, o.grace
	if o.grace == 0 {
		so.WorkerDrainGrace = -1
	}
	if o.migrationLimit == 0 {
		so.MigrationLimit = -1
	}
	if o.stall == 0 {
		so.StallTimeout = -1
	}
	return so, nil
}

// maxShadowInFlight bounds --shadow-max-inflight: each shadow worker is a
// goroutine for the router's life, and each running shadow decision holds
// a copy of its candidates.
const maxShadowInFlight = 4096

// shadowInFlightWant words the values --shadow-max-inflight accepts.
var shadowInFlightWant = fmt.Sprintf("a whole number from 1 to %d", maxShadowInFlight)

// maxShadowQueue bounds --shadow-queue: each queued shadow decision holds
// a copy of its request and candidates' columns.
const maxShadowQueue = 1 << 20

// shadowQueueWant words the values --shadow-queue accepts.
var shadowQueueWant = fmt.Sprintf("a whole number from 1 to %d", maxShadowQueue)

// charsPerTokenWant words the values --chars-per-token accepts.
var charsPerTokenWant = fmt.Sprintf("a whole number from 1 to %d", math.MaxInt)

// positiveDurationWant words the values of a duration flag that must be
// positive; 2562047h is about the largest time.Duration.
const positiveDurationWant = "a duration greater than 0 with a unit, such as 500ms, 30s, 5m or 1h30m (at most 2562047h)"

// byteSize is a pflag.Value of a size in bytes: a whole number, alone
// (bytes) or followed by KiB, MiB or GiB (powers of 1024), from 0 to
// maxByteSize.
type byteSize int64

// maxByteSize bounds a byteSize: 1 TiB, more than any body budget this
// machine could hold.
const maxByteSize = 1 << 40

// byteSizeWant words the values a byteSize flag accepts.
const byteSizeWant = "a size in bytes from 0 to 1TiB, such as 1048576, 64MiB or 1GiB (KiB, MiB and GiB are powers of 1024)"

var byteUnits = []struct {
	suffix string
	shift  uint
}{{"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"", 0}}

func (b *byteSize) Set(v string) error {
	for _, u := range byteUnits {
		num, ok := strings.CutSuffix(v, u.suffix)
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return err
		}
		if n < 0 || n > maxByteSize>>u.shift {
			return strconv.ErrRange
		}
		*b = byteSize(n << u.shift)
		return nil
	}
	return strconv.ErrSyntax // not reached: the last unit is empty
}

func (b *byteSize) String() string {
	for _, u := range byteUnits {
		if n := int64(*b); u.shift > 0 && n > 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(*b), 10)
}

func (*byteSize) Type() string { return "size" }

// perClient is the size as serve's MaxBodyBytesPerClient: 0 (no bound)
// is negative there.
func (b byteSize) perClient() int64 {
	if b == 0 {
		return -1
	}
	return int64(b)
}

// noWorkersWarning is the warning for a runtime started with no worker
// at all: the policy file declares no worker block (read with
// config.LoadClusterWorkers, which starts nothing) and neither
// --workers-file nor --pool-selector gives any. Every model is then
// unknown (404 model_not_found) and /readyz says "no worker ready: none
// is configured". It is "" when workers may come from somewhere, or when
// the policy file does not load (the daemon reports that).
func (r *runtimeFlags) noWorkersWarning() string {
	if r.workersFile != "" || r.pods.selector != "" {
		return ""
	}
	_, ws, diags := config.LoadClusterWorkers(r.policy)
	if diags.HasErrors() || len(ws) > 0 {
		return ""
	}
	return fmt.Sprintf("no workers: %s declares no worker block and neither --workers-file nor --pool-selector is given, "+
		"so every request is refused (404 model_not_found) and /readyz is 503 until workers are given: "+
		"add worker \"NAME\" { url = \"http://HOST:PORT\" } blocks to the policy file (then SIGHUP, or run with --watch), "+
		"or start with --workers-file FILE (watched) or --pool-selector SELECTOR --pool-port PORT (Kubernetes pods); docs/serve.md",
		r.policy)
}

// runServe runs `router serve` until ctx ends: live.Daemon with serve's
// HTTP face, which loads the policy file and the workers, then opens the
// listeners (listen), so that a file's errors are reported before an
// address in use. A start with no workers is warned of in the log, on
// stderr (noWorkersWarning), once the policy file has loaded.
func runServe(ctx context.Context, o serveOptions, level hclog.Level, stdout, stderr io.Writer) error {
	logger := hclog.New(&hclog.LoggerOptions{Name: "router", Output: stderr, Level: level})
	so, err := o.migrationOptions(serve.Options{MaxBodyBytesPerClient: o.bodyPerClient.perClient()})
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	// The pods' watch lives as long as the daemon; the pods are first
	// listed once the files have loaded (StartPods), so a file's errors
	// come before a Kubernetes error.
	pctx, stopPods := context.WithCancel(ctx)
	defer stopPods()
	podsDone := closedChan()
	var ln, debug net.Listener
	do := o.daemonOptions(so)
	do.StartPods = o.pods.starter(pctx, logger, &podsDone)
	do.Listen = func() (net.Listener, net.Listener, error) {
		if w := o.noWorkersWarning(); w != "" {
			logger.Warn(w)
		}
		var err error
		if ln, debug, err = o.listenFace("--listen", o.listen); err != nil {
			return nil, nil, err
		}
		return ln, debug, nil
	}
	do.Logger, do.Diagnostics = logger, stderr
	do.OnReady = func() {
		if debug != nil {
			fmt.Fprintf(stdout, "router serve profiler on http://%s/debug/pprof/\n", debug.Addr())
		}
		fmt.Fprintf(stdout, "router serve listening on http://%s\n", ln.Addr())
	}
	d, err := live.NewDaemon(do)
	if err == nil {
		err = d.Run(ctx)
	}
	stopPods()
	<-podsDone
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return nil // stopped while listing the pods
		}
		return &exitError{code: 1, err: err}
	}
	return nil
}
