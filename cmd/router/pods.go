package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/pflag"

	"github.com/switchyard-router/switchyard/router/kubepods"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/shared"
)

// podFlags are the --pool-* flags of `router epp` and `router serve`:
// workers from the Kubernetes pods an InferencePool names (its
// spec.selector and target port), followed by router/kubepods.
type podFlags struct {
	selector     string
	port         int
	namespace    string
	kubeconfig   string
	role         string
	models       []string
	kvPort       int
	kvTopic      string
	kvReplayPort int
}

// portWant words the values a port flag accepts.
const portWant = "a port number from 1 to 65535"

// register adds the flags to f.
func (p *podFlags) register(f *pflag.FlagSet) {
	f.StringVar(&p.selector, "pool-selector", "", "workers are also the ready pods matching this label selector, such as app=vllm,tier=gpu (an InferencePool's spec.selector); needs --pool-port")
	f.IntVar(&p.port, "pool-port", 0, "the engines' HTTP port on the --pool-selector pods (an InferencePool's target port)")
	f.StringVar(&p.namespace, "pool-namespace", "", "namespace of the --pool-selector pods (default: the router's own namespace in a cluster, else \"default\")")
	f.StringVar(&p.kubeconfig, "kubeconfig", "", "kubeconfig file for --pool-selector (default: the pod's service account in a cluster, else $KUBECONFIG or ~/.kube/config)")
	f.StringVar(&p.role, "pool-role", string(shared.RoleAggregated), "role of the --pool-selector pods' workers: aggregated, prefill or decode")
	f.StringSliceVar(&p.models, "pool-models", nil, "models the --pool-selector pods serve, comma-separated (default: each engine's GET /v1/models)")
	f.IntVar(&p.kvPort, "pool-kv-events-port", 0, "port of the --pool-selector engines' KV-event PUB socket (tcp://PODIP:PORT); 0: no KV events")
	f.StringVar(&p.kvTopic, "pool-kv-events-topic", "", "topic prefix of the pods' KV events (default: every topic)")
	f.IntVar(&p.kvReplayPort, "pool-kv-events-replay-port", 0, "port of the pods' KV-event replay socket; 0: none")
	setWant(f, "pool-port", portWant)
	setWant(f, "pool-kv-events-port", portWant)
	setWant(f, "pool-kv-events-replay-port", portWant)
}

// check checks the flags as given in f; every error names its flag.
func (p *podFlags) check(f *pflag.FlagSet) error {
	if p.selector == "" {
		for _, name := range []string{"pool-port", "pool-namespace", "kubeconfig", "pool-role", "pool-models",
			"pool-kv-events-port", "pool-kv-events-topic", "pool-kv-events-replay-port"} {
			if f.Changed(name) {
				return fmt.Errorf("--%s needs --pool-selector", name)
			}
		}
		return nil
	}
	if _, err := kubepods.ParseSelector(p.selector); err != nil {
		return fmt.Errorf("--pool-selector %q: %w", p.selector, err)
	}
	switch {
	case !f.Changed("pool-port"):
		return errors.New("--pool-selector needs --pool-port, the engines' HTTP port on the pods")
	case p.port < 1 || p.port > 65535:
		return fmt.Errorf("--pool-port %d: want %s", p.port, portWant)
	case f.Changed("pool-kv-events-port") && (p.kvPort < 1 || p.kvPort > 65535):
		return fmt.Errorf("--pool-kv-events-port %d: want %s", p.kvPort, portWant)
	case f.Changed("pool-kv-events-replay-port") && (p.kvReplayPort < 1 || p.kvReplayPort > 65535):
		return fmt.Errorf("--pool-kv-events-replay-port %d: want %s", p.kvReplayPort, portWant)
	case p.kvPort == 0 && (f.Changed("pool-kv-events-topic") || f.Changed("pool-kv-events-replay-port")):
		return errors.New("--pool-kv-events-topic and --pool-kv-events-replay-port need --pool-kv-events-port")
	case !shared.Role(p.role).Valid():
		return fmt.Errorf("--pool-role %q: want %s, %s or %s", p.role, shared.RoleAggregated, shared.RolePrefill, shared.RoleDecode)
	case f.Changed("pool-models") && len(p.models) == 0:
		return errors.New("--pool-models: want at least one model name, such as llama")
	}
	for i, m := range p.models {
		if strings.TrimSpace(m) == "" || slices.Contains(p.models[:i], m) {
			return fmt.Errorf("--pool-models %q: want distinct, non-empty model names", strings.Join(p.models, ","))
		}
	}
	return nil
}

// closedChan returns a closed channel: the done of a pods' watch that
// never started.
func closedChan() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// starter returns a live.DaemonOptions.StartPods that starts watching
// the pods with ctx (start) and sets *done to the watch's done; nil
// without --pool-selector (the daemon then lists none).
func (p *podFlags) starter(ctx context.Context, log hclog.Logger, done *<-chan struct{}) func() (live.WorkerSource, error) {
	if p.selector == "" {
		return nil
	}
	return func() (live.WorkerSource, error) {
		pods, d, err := p.start(ctx, log)
		if err != nil {
			return nil, err
		}
		*done = d
		return pods, nil
	}
}

// start starts watching the pods when --pool-selector is set, and waits
// for their first list (or ctx's end); the watch runs until ctx ends,
// and done is closed after it stopped. Without --pool-selector it
// returns a nil source and a closed done.
func (p *podFlags) start(ctx context.Context, log hclog.Logger) (src live.WorkerSource, done <-chan struct{}, err error) {
	if p.selector == "" {
		return nil, closedChan(), nil
	}
	ns := p.namespace
	if ns == "" {
		ns = kubepods.DefaultNamespace()
	}
	client, err := kubepods.NewClient(p.kubeconfig, ns)
	if err != nil {
		return nil, nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	pods, err := kubepods.New(kubepods.Options{
		Client: client, Namespace: ns, Selector: p.selector, Logger: log,
		Template: kubepods.Template{
			Port: p.port, Role: shared.Role(p.role), Models: p.models,
			KVEventsPort: p.kvPort, KVEventsTopic: p.kvTopic, KVEventsReplayPort: p.kvReplayPort,
		},
	})
	if err != nil {
		return nil, nil, err
	}
	if err := pods.Start(ctx); err != nil {
		<-pods.Done()
		return nil, nil, err
	}
	return pods, pods.Done(), nil
}
