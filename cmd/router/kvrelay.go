package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/switchyard-router/switchyard/router/cluster"
	"github.com/switchyard-router/switchyard/router/config"
)

type kvRelayOptions struct {
	policy        string
	workersFile   string
	workers       []string
	ranks         int
	metricsListen string
}

// maxRanks bounds --ranks: vLLM's data-parallel sizes are a few dozen.
const maxRanks = 1024

var ranksWant = fmt.Sprintf("a whole number from 1 to %d", maxRanks)

func newKVRelayCmd() *cobra.Command {
	o := kvRelayOptions{}
	cmd := &cobra.Command{
		Use:   "kv-relay --policy FILE",
		Short: "Relay engines' KV events into the cluster's NATS stream, as a sidecar",
		Long: `kv-relay relays the KV events of the workers with a kv_events block into
the NATS JetStream stream that router serve replicas with the same cluster
block read them from (docs/replicas.md, "KV events through a relay"): one
relay per engine rank, run by whoever holds the rank's lease, a replica or
a kv-relay. It competes for the same leases as the replicas: run it beside
them (a sidecar) and it relays the engines whose lease it takes.

The cluster block and the worker blocks are read from --policy (and
--workers-file) once, at start; --worker limits the relays to the named
workers (all those with a kv_events block by default), --ranks to ranks 0
to N-1 of each (data-parallel engines publish rank N on port + N).

SIGTERM or SIGINT stops the relays, gives their leases up (another relay
takes each within a heartbeat) and exits 0. With --metrics-listen it
serves its Prometheus metrics on /metrics there and prints "router kv-relay
metrics listening on http://ADDR". It prints "router kv-relay competing
for N relay leases" once it has started.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.policy == "" {
				return errors.New("--policy FILE is required")
			}
			if o.ranks < 1 || o.ranks > maxRanks {
				return fmt.Errorf("--ranks %d: want %s", o.ranks, ranksWant)
			}
			return runKVRelay(cmd.Context(), o, logLevel(cmd.Context(), hclog.Info), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.policy, "policy", "", "policy file with the cluster block (required); its worker blocks are relayed")
	f.StringVar(&o.workersFile, "workers-file", "", "file of more worker blocks to relay")
	f.StringSliceVar(&o.workers, "worker", nil, "relay only these workers (repeatable or comma-separated; default: every worker with a kv_events block)")
	f.IntVar(&o.ranks, "ranks", 1, "data-parallel ranks relayed per worker: 0 to N-1")
	f.StringVar(&o.metricsListen, "metrics-listen", "", "serve Prometheus metrics on /metrics at this address; off when empty")
	setWant(f, "ranks", ranksWant)
	return cmd
}

// relayTargets returns the relay targets of ws: ranks 0..ranks-1 of each
// worker with a kv_events block, only those named in only when it is not
// empty. A name in only that is not a worker with a kv_events block is an
// error.
func relayTargets(ws []config.Worker, only []string, ranks int) ([]cluster.RelayTarget, error) {
	var out []cluster.RelayTarget
	seen := map[string]bool{}
	for _, w := range ws {
		if w.KVEvents == nil || len(only) > 0 && !slices.Contains(only, w.Name) {
			continue
		}
		seen[w.Name] = true
		for r := range ranks {
			out = append(out, cluster.RelayTarget{Worker: w.Name, Rank: uint32(r), KVEvents: *w.KVEvents})
		}
	}
	for _, n := range only {
		if !seen[n] {
			return nil, fmt.Errorf("--worker %s: no worker of that name has a kv_events block", n)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no worker has a kv_events block: nothing to relay")
	}
	return out, nil
}

// runKVRelay runs `router kv-relay` until ctx ends.
func runKVRelay(ctx context.Context, o kvRelayOptions, level hclog.Level, stdout, stderr io.Writer) error {
	// Only the cluster and worker blocks are read: no plugin is started
	// and no policy resolved (the relay's host may lack their binaries).
	c, ws, diags := config.LoadClusterWorkers(o.policy)
	if len(diags) > 0 {
		fmt.Fprint(stderr, config.FormatDiagnostics(diags))
	}
	if diags.HasErrors() {
		return &exitError{code: 1, err: errNotLoaded}
	}
	if c == nil {
		return &exitError{code: 1, err: fmt.Errorf("%s has no cluster block: nothing to relay to", o.policy)}
	}
	if o.workersFile != "" {
		fw, diags := config.LoadWorkers(o.workersFile)
		if len(diags) > 0 {
			fmt.Fprint(stderr, config.FormatDiagnostics(diags))
		}
		if diags.HasErrors() {
			return &exitError{code: 1, err: fmt.Errorf("%s does not load", o.workersFile)}
		}
		ws = append(ws, fw...)
	}
	targets, err := relayTargets(ws, o.workers, o.ranks)
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "router", Output: stderr, Level: level})
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if o.metricsListen != "" {
		ln, err := net.Listen("tcp", o.metricsListen)
		if err != nil {
			return &exitError{code: 1, err: fmt.Errorf("--metrics-listen %s: %w", o.metricsListen, err)}
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = hs.Serve(ln) }()
		defer func() { _ = hs.Close() }()
		fmt.Fprintf(stdout, "router kv-relay metrics listening on http://%s\n", ln.Addr())
	}
	names := make([]string, 0, len(targets))
	for _, t := range targets {
		names = append(names, fmt.Sprintf("%s/%d", t.Worker, t.Rank))
	}
	logger.Info("competing for the relay leases", "cluster", c.Name, "nats", config.RedactNATS(c.NATS), "ranks", strings.Join(names, " "))
	fmt.Fprintf(stdout, "router kv-relay competing for %d relay leases\n", len(targets))
	if err := cluster.RunRelays(ctx, cluster.RelayOptions{Config: *c, Targets: targets, Registerer: reg, Logger: logger}); err != nil {
		return &exitError{code: 1, err: err}
	}
	return nil
}
