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
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/switchyard-router/switchyard/router/epp"
	"github.com/switchyard-router/switchyard/router/serve"
)

type eppOptions struct {
	policy       string
	listen       string
	httpListen   string
	workersFile  string
	drainTimeout time.Duration
	pods         podFlags
}

func newEPPCmd() *cobra.Command {
	o := eppOptions{}
	cmd := &cobra.Command{
		Use:   "epp --policy FILE --listen ADDR",
		Short: "Serve as an Endpoint Picker (ext_proc) for Envoy-based gateways",
		Long: `epp serves the Gateway API Inference Extension's Endpoint Picker Protocol:
an Envoy external-processing (envoy.service.ext_proc.v3) gRPC service on
--listen that picks, for each request, the worker the policy file's
aggregated policy chooses (queueing at the queue block's capacity) and
answers its URL's host:port as x-gateway-destination-endpoint. The workers
are the policy file's worker blocks and those of --workers-file (watched),
as for serve. The gRPC health services liveness, readiness and
envoy.service.ext_proc.v3.ExternalProcessor answer on --listen.

--http-listen serves serve's HTTP API beside it (/metrics, /healthz,
/readyz, and the OpenAI routes).

SIGHUP reloads the policy file. SIGTERM or SIGINT makes readiness
NOT_SERVING, lets the streams in flight end for up to --drain-timeout,
stops the plugins and exits 0.

It prints "router epp listening on grpc://ADDR" once it accepts streams.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.policy == "" {
				return errors.New("--policy FILE is required")
			}
			if o.drainTimeout <= 0 {
				return fmt.Errorf("--drain-timeout %v: want %s", o.drainTimeout, positiveDurationWant)
			}
			if err := o.pods.check(cmd.Flags()); err != nil {
				return err
			}
			level := logLevel(cmd.Context(), hclog.Info)
			return runEPP(cmd.Context(), o, level, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.policy, "policy", "", "policy file (required)")
	f.StringVar(&o.listen, "listen", "127.0.0.1:9002", "address of the ext_proc gRPC service")
	f.StringVar(&o.httpListen, "http-listen", "127.0.0.1:0", "address of the HTTP API (/metrics, /readyz)")
	f.StringVar(&o.workersFile, "workers-file", "", "file of worker blocks, watched: workers join and leave as it changes")
	f.DurationVar(&o.drainTimeout, "drain-timeout", serve.DefaultDrainTimeout, "on SIGTERM, how long streams in flight may finish")
	setWant(f, "drain-timeout", positiveDurationWant)
	o.pods.register(f)
	return cmd
}

// runEPP runs `router epp` until ctx ends: a serve.Daemon (policy file,
// workers, the HTTP API) and, once it is ready, the ext_proc gRPC server
// over its Server. On shutdown the gRPC server stops first (readiness
// NOT_SERVING, streams drained up to the drain timeout), then the daemon.
func runEPP(ctx context.Context, o eppOptions, level hclog.Level, stdout, stderr io.Writer) error {
	gln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return &exitError{code: 1, err: fmt.Errorf("--listen %s: %w", o.listen, err)}
	}
	hln, err := net.Listen("tcp", o.httpListen)
	if err != nil {
		_ = gln.Close()
		return &exitError{code: 1, err: fmt.Errorf("--http-listen %s: %w", o.httpListen, err)}
	}
	gs := grpc.NewServer()
	var grpcDone sync.WaitGroup
	// The daemon outlives the gRPC server: its context ends once the
	// streams are drained.
	dctx, stopDaemon := context.WithCancel(context.WithoutCancel(ctx))
	defer stopDaemon()
	logger := hclog.New(&hclog.LoggerOptions{Name: "router", Output: stderr, Level: level})
	// The pods' watch lives as long as the daemon; a signal while the
	// pods are first listed ends it.
	unlink := context.AfterFunc(ctx, stopDaemon)
	pods, podsDone, err := o.pods.start(dctx, logger)
	unlink()
	if err != nil {
		_ = gln.Close()
		_ = hln.Close()
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return nil // stopped while listing the pods
		}
		return &exitError{code: 1, err: err}
	}
	var d *serve.Daemon
	d, err = serve.NewDaemon(serve.DaemonOptions{
		PolicyFile: o.policy, WorkersFile: o.workersFile, Pods: pods, Listener: hln, DrainTimeout: o.drainTimeout,
		Logger:      logger,
		Diagnostics: stderr,
		OnReady: func() {
			health := epp.Register(gs, &epp.Server{Picker: &epp.RouterPicker{Server: d.Server()}})
			health.SetReady(true)
			grpcDone.Go(func() { _ = gs.Serve(gln) })
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
			fmt.Fprintf(stdout, "router epp http api on http://%s\n", hln.Addr())
			fmt.Fprintf(stdout, "router epp listening on grpc://%s\n", gln.Addr())
		},
	})
	if err == nil {
		err = d.Run(dctx)
	}
	// Run returns at once when it failed before OnReady: nothing serves
	// gRPC then. Otherwise it returns after the gRPC server stopped.
	stopDaemon()
	gs.Stop()
	_ = gln.Close()
	grpcDone.Wait()
	<-podsDone
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	return nil
}
