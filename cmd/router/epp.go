package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/epp"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/serve"
)

// eppOptions are `router epp`'s flags: the runtime's and the ext_proc
// face's.
type eppOptions struct {
	runtimeFlags
	listen      string
	httpListen  string
	fallbacks   int
	maxBody     int64
	maxInFlight int64
}

func newEPPCmd() *cobra.Command {
	o := eppOptions{}
	cmd := &cobra.Command{
		Use:   "epp --policy FILE [--listen ADDR]",
		Short: "Serve as an Endpoint Picker (ext_proc) for Envoy-based gateways",
		Long: `epp serves the Gateway API Inference Extension's Endpoint Picker Protocol:
an Envoy external-processing (envoy.service.ext_proc.v3) gRPC service on
--listen that picks, for each request, the worker the policy file's
aggregated policy chooses (queueing at the queue block's capacity) and
answers its URL's host:port as x-gateway-destination-endpoint, followed by
up to --fallbacks of the policy's runners-up. A disaggregated model (prefill
and decode workers, no aggregated one) gets a decode worker, by the decode
policy, and a prefill worker, by the prefill policy, named in
x-prefiller-host-port for the decode pod's routing sidecar (router
pd-sidecar, llm-d's protocol). Every engine endpoint is routed as serve
routes it: Responses and Messages like chat (a Responses request continuing
a stored response goes to the engine that holds it, and so do GET and
cancel of /v1/responses/{id}); embeddings, pooling, classify, score and
rerank by load; tokenize and detokenize to the least busy engine, not
booked; other POSTs under /v1/ naming a model are passed through
(--pass-through=false: 404). The workers are the policy
file's worker blocks and those of --workers-file (watched), as for serve.
With --pool-selector and --pool-port the workers also come from the
Kubernetes pods an InferencePool selects (see --pool-* and --kubeconfig).
The gRPC health services liveness, readiness and
envoy.service.ext_proc.v3.ExternalProcessor answer on --listen; readiness
is SERVING once every worker's first probe has answered.

A request body is at most --max-body-bytes (over it: 413); the streams
receiving their request reserve one message's bound each (the body bound
plus 1 MiB) of --max-body-bytes-in-flight, which also counts the bodies
held until picked, and wait for it: the bodies take at most 6 times
--max-body-bytes-in-flight of memory (docs/epp.md, "Memory").

--http-listen serves serve's HTTP API beside it (/metrics, /healthz,
/readyz, and the OpenAI routes); --debug-listen, as for serve, Go's
profiler and the router's debug views on an address of their own.

SIGHUP reloads the policy file. SIGTERM or SIGINT makes readiness
NOT_SERVING, lets the streams in flight end for up to --drain-timeout,
stops the plugins and exits 0.

It prints "router epp listening on grpc://ADDR" once it accepts streams.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(cmd.Flags()); err != nil {
				return err
			}
			if o.fallbacks < 0 || o.fallbacks > router.MaxAlternates {
				return fmt.Errorf("--fallbacks %d: want %s", o.fallbacks, fallbacksWant)
			}
			if o.maxBody < minBodyBound || o.maxBody > live.DefaultMaxBodyBytes {
				return fmt.Errorf("--max-body-bytes %d: want %s", o.maxBody, maxBodyWant)
			}
			if o.maxInFlight < o.maxBody {
				return fmt.Errorf("--max-body-bytes-in-flight %d: want %s (--max-body-bytes is %d)", o.maxInFlight, maxInFlightWant, o.maxBody)
			}
			level := logLevel(cmd.Context(), hclog.Info)
			return runEPP(cmd.Context(), o, level, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	o.register(f)
	f.StringVar(&o.listen, "listen", "127.0.0.1:9002", "address of the ext_proc gRPC service")
	f.StringVar(&o.httpListen, "http-listen", "127.0.0.1:0", "address of the HTTP API (/metrics, /healthz, /readyz, /v1/models and the OpenAI routes)")
	f.IntVar(&o.fallbacks, "fallbacks", DefaultFallbacks, "how many of the policy's runners-up follow the pick in x-gateway-destination-endpoint, best first")
	f.Int64Var(&o.maxBody, "max-body-bytes", live.DefaultMaxBodyBytes, "bound on a request body, in bytes: a larger one is answered 413")
	f.Int64Var(&o.maxInFlight, "max-body-bytes-in-flight", live.DefaultMaxBodyBytesInFlight, "bound on the request body bytes the picker holds and receives at once, all streams together")
	setWant(f, "fallbacks", fallbacksWant)
	setWant(f, "max-body-bytes", maxBodyWant)
	setWant(f, "max-body-bytes-in-flight", maxInFlightWant)
	return cmd
}

// DefaultFallbacks is --fallbacks' default: two runners-up, enough for a
// proxy retry policy of up to two retries (Envoy's default is one).
const DefaultFallbacks = 2

// fallbacksWant words the values --fallbacks accepts.
var fallbacksWant = fmt.Sprintf("a whole number from 0 to %d", router.MaxAlternates)

// minBodyBound is the least --max-body-bytes: 1 KiB, a short chat
// request; a smaller bound would refuse ordinary requests.
const minBodyBound = 1 << 10

// maxBodyWant words the values --max-body-bytes accepts: at most serve's
// parser bound (live.DefaultMaxBodyBytes), which the Picker's parsing
// applies again.
var maxBodyWant = fmt.Sprintf("a whole number of bytes from %d to %d", minBodyBound, live.DefaultMaxBodyBytes)

// maxInFlightWant words the values --max-body-bytes-in-flight accepts.
const maxInFlightWant = "a whole number of bytes, at least --max-body-bytes"

// probeWait bounds how long `router epp` waits for the workers' first
// probes before it reports ready anyway (epp.ReadyWhenProbed): a probe
// is bounded by its timeout, the scrape interval (1 s by default).
const probeWait = 10 * time.Second

// runEPP runs `router epp` until ctx ends: a live.Daemon (policy file,
// workers, serve's HTTP API) and, once it is ready, the ext_proc gRPC
// server over its Runtime. On shutdown the gRPC server stops first (readiness
// NOT_SERVING, streams drained up to the drain timeout), then the daemon.
// The listeners are opened once the daemon has loaded the policy file and
// the workers (live.DaemonOptions.Listen), so that a file's errors are
// reported before an address in use; a start with no workers is warned of
// on stderr then, as serve does (runtimeFlags.noWorkersWarning).
func runEPP(ctx context.Context, o eppOptions, level hclog.Level, stdout, stderr io.Writer) error {
	var gln, hln, debug net.Listener // opened by do.Listen
	gs := grpc.NewServer(epp.GRPCServerOptions(o.maxBody)...)
	var grpcDone sync.WaitGroup
	// The daemon outlives the gRPC server: its context ends once the
	// streams are drained.
	dctx, stopDaemon := context.WithCancel(context.WithoutCancel(ctx))
	defer stopDaemon()
	// The daemon's registry, with the EPP's own family beside serve's.
	reg := prometheus.NewRegistry()
	decisions := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "switchyard_epp_decision_duration_seconds",
		Help:    "Endpoint picker decisions: from the whole request held to the answer with its destination handed to gRPC (epp.Server.Decisions).",
		Buckets: prometheus.ExponentialBuckets(1e-5, 2, 18), // 10us to about 1.3 s
	})
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), decisions)
	logger := hclog.New(&hclog.LoggerOptions{Name: "router", Output: stderr, Level: level})
	// The pods' watch lives as long as the daemon; they are first listed
	// once the files have loaded (StartPods, as serve does), and a signal
	// while they are ends it.
	podsDone := closedChan()
	var d *live.Daemon
	do := o.daemonOptions(serve.Options{})
	if start := o.pods.starter(dctx, logger, &podsDone); start != nil {
		do.StartPods = func() (live.WorkerSource, error) {
			unlink := context.AfterFunc(ctx, stopDaemon)
			defer unlink()
			return start()
		}
	}
	do.Listen = func() (net.Listener, net.Listener, error) {
		if w := o.noWorkersWarning(); w != "" {
			logger.Warn(w) // as serve does (runServe)
		}
		l, err := net.Listen("tcp", o.listen)
		if err != nil {
			return nil, nil, fmt.Errorf("--listen %s: %w", o.listen, err)
		}
		if hln, debug, err = o.listenFace("--http-listen", o.httpListen); err != nil {
			_ = l.Close()
			return nil, nil, err
		}
		gln = l
		return hln, debug, nil
	}
	do.Logger, do.Diagnostics, do.Registry = logger, stderr, reg
	do.OnReady = func() {
		picker := &epp.RouterPicker{Runtime: d.Runtime(), Fallbacks: o.fallbacks, DisablePassThrough: !o.passThrough}
		health := epp.Register(gs, &epp.Server{Picker: picker, Decisions: decisions,
			MaxBodyBytes: o.maxBody, MaxBodyBytesInFlight: o.maxInFlight})
		grpcDone.Go(func() { _ = gs.Serve(gln) })
		grpcDone.Go(func() {
			// Readiness once the workers' first probes are in: the
			// datastore has synced (proposal 004); and, for a replica,
			// once it has caught up with its cluster (bounded by the
			// cluster block's warm_timeout).
			for !d.Runtime().ClusterReady() {
				select {
				case <-dctx.Done():
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
			if probed, err := epp.ReadyWhenProbed(dctx, health, d.Runtime().Workers(), 20*time.Millisecond, probeWait); err == nil && !probed {
				logger.Warn("ready before every worker's first probe answered", "waited", probeWait)
			}
		})
		grpcDone.Go(func() {
			select {
			case <-ctx.Done():
			case <-dctx.Done(): // Run failed while serving
			}
			health.Shutdown()
			drained := make(chan struct{})
			go func() { gs.GracefulStop(); close(drained) }()
			select {
			case <-drained:
			case <-time.After(o.drainTimeout):
				gs.Stop()
				<-drained
			}
			stopDaemon()
		})
		if debug != nil {
			fmt.Fprintf(stdout, "router epp profiler on http://%s/debug/pprof/\n", debug.Addr())
		}
		fmt.Fprintf(stdout, "router epp http api on http://%s\n", hln.Addr())
		fmt.Fprintf(stdout, "router epp listening on grpc://%s\n", gln.Addr())
	}
	d, err := live.NewDaemon(do)
	if err == nil {
		err = d.Run(dctx)
	}
	// Run returns at once when it failed before OnReady: nothing serves
	// gRPC then. Otherwise it returns after the gRPC server stopped.
	stopDaemon()
	gs.Stop()
	if gln != nil {
		_ = gln.Close()
	}
	grpcDone.Wait()
	<-podsDone
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return nil // stopped while listing the pods
		}
		return &exitError{code: 1, err: err}
	}
	return nil
}
