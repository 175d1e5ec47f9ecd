package loader

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/shared"
)

// failedLoadShutdown bounds the shutdown of the plugins a failed
// LoadBundle had started.
const failedLoadShutdown = 5 * time.Second

// LoadOptions adjust LoadBundle.
type LoadOptions struct {
	// Catalog holds the built-in component types the file is resolved
	// against; nil means catalog.Default(). The plugins' types are added
	// to a clone, never to this one.
	Catalog *catalog.Catalog
	// Logger receives the plugin Host's logs and the plugins' stderr;
	// nil discards them.
	Logger hclog.Logger
	// ShutdownGrace bounds how long the Host lets in-flight plugin calls
	// finish when the bundle is closed (supervisor.DefaultShutdownGrace).
	ShutdownGrace time.Duration
	// Seed, when set, replaces the file's router.seed (config.Options.Seed).
	Seed *int64
	// DefaultSeed, when set, seeds the policies when neither Seed nor the
	// file gives a seed (config.Options.DefaultSeed).
	DefaultSeed *int64
	// SeedOffset moves every seed of the file (config.Options.SeedOffset).
	SeedOffset int64
	// Registerer, when set, receives the plugin metrics
	// (switchyard_plugin_*); the Hosts of successive bundles share their
	// collectors (supervisor.NewMetrics), so reloads do not collide.
	Registerer prometheus.Registerer
	// SimulatedTime sets the plugin Host up for a replay, where nothing
	// may depend on the wall clock (docs/replay.md, "Plugins in replay"):
	// a call waits up to supervisor.ReplayCallTimeout for its answer
	// instead of its call_timeout, no circuit breaker opens, and a failed
	// call's warning is rate-limited by count (every 1000th), not by time.
	SimulatedTime bool
}

// replayFailureLog rate-limits failed-call warnings under SimulatedTime:
// by count, so a replay logs the same every run.
var replayFailureLog = supervisor.FailureLogPolicy{Every: 1000}

// Bundle is what a policy file resolves to at run time: the policy of each
// role, compiled (or on the hosted path), as a router.Bundle a Router
// decides with, and the file and the plugin Host whose processes serve its
// out-of-process components. Closing the router.Bundle (Close, or the
// Router that owns it) closes the file's components and shuts the Host
// down.
type Bundle struct {
	*router.Bundle

	// file is the loaded policy file. Callers read it through methods
	// (Filename, PolicyName, Queue, Classifier...), or whole through
	// PolicyFile.
	file *config.PolicyFile
	// host runs the bundle's plugins.
	host *supervisor.Host
}

// Of is the loaded bundle b was built from (LoadBundle); nil when b is nil
// (a closed Router's) or was not loaded from a policy file
// (router.NewBundle).
func Of(b *router.Bundle) *Bundle {
	lb, _ := b.Source().(*Bundle)
	return lb
}

// Current is the loaded bundle r decides with now (router.Router.Bundle),
// for inspection; nil once r is closed or when its bundle was not loaded
// from a policy file. It may be swapped out at any time.
func Current(r *router.Router) *Bundle { return Of(r.Bundle()) }

// LoadBundle loads the policy file at path with a new plugin Host: the
// file's plugins are started and their components configured, and each
// role's policy is compiled. An empty path loads the built-in default
// policy (config.DefaultPolicyName, diagnostics under that name), as
// `router replay` without --policy does. On success the bundle is ready
// to decide with (router.Options.Bundle, or Router.Apply of its Bundle),
// or to inspect, and the diagnostics hold warnings only. On any
// error the Host is shut down before LoadBundle returns (nothing is left
// running), the bundle is nil and the diagnostics, each at file:line:col,
// say why.
//
// Every command that runs a policy file loads it here (`router
// validate`, `replay`, `serve`, `epp` and their reloads), so they accept
// and refuse the same files. The caller closes the bundle (Close), or hands it to a
// Router that does.
//
// ctx bounds the plugins' starts and configurations only; the processes
// live until the bundle is closed.
func LoadBundle(ctx context.Context, path string, o LoadOptions) (*Bundle, hcl.Diagnostics) {
	if o.Catalog == nil {
		o.Catalog = catalog.Default()
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	ho := supervisor.Options{Logger: o.Logger, ShutdownGrace: o.ShutdownGrace, Registerer: o.Registerer}
	if o.SimulatedTime {
		ho.CallTimeout = supervisor.ReplayCallTimeout
		ho.Breaker = supervisor.BreakerPolicy{Disabled: true}
		ho.FailureLog = replayFailureLog
	}
	host := supervisor.NewHost(ho)
	var diags hcl.Diagnostics
	fail := func(diags hcl.Diagnostics) (*Bundle, hcl.Diagnostics) {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), failedLoadShutdown)
		defer cancel()
		if err := host.Shutdown(sctx); err != nil {
			diags = append(diags, &hcl.Diagnostic{
				Severity: hcl.DiagWarning,
				Summary:  "Plugins did not stop cleanly",
				Detail:   fmt.Sprintf("Stopping the plugins of the failed load: %v.", err),
				Subject:  &hcl.Range{Filename: path, Start: hcl.InitialPos, End: hcl.InitialPos},
			})
		}
		return nil, diags
	}
	co := config.Options{Plugins: host, Context: ctx, Seed: o.Seed, DefaultSeed: o.DefaultSeed, SeedOffset: o.SeedOffset}
	var cb *config.PolicyFile
	if path == "" {
		cb, diags = config.LoadWith(config.DefaultPolicyName, nil, o.Catalog, co)
	} else {
		cb, diags = config.LoadFileWith(path, o.Catalog, co)
	}
	if diags.HasErrors() || cb == nil {
		return fail(diags)
	}
	b := &Bundle{file: cb, host: host}
	rb, err := router.NewBundle(cb.Roles, router.BundleOptions{
		Policies:          filePolicies(cb),
		Classifier:        classifierInstance(cb),
		Owned:             true,
		BlockSize:         cb.BlockSize,
		BlockSizeOverride: blockSizeOverride(cb),
		Close:             host.Shutdown,
		Source:            b,
	})
	if err != nil {
		// NewBundle closed the file's components.
		subject := hcl.Range{Filename: cb.Filename, Start: hcl.InitialPos, End: hcl.InitialPos}
		detail := err.Error()
		var re *router.RoleError
		if errors.As(err, &re) {
			for _, d := range cb.Decls {
				if d.Name == cb.RolePolicies[re.Role] && !d.Builtin {
					subject = d.Range
				}
			}
			detail = fmt.Sprintf("Role %s: %v", re.Role, re.Err)
		}
		diags = append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Policy cannot run",
			Detail:   detail + ".",
			Subject:  &subject,
		})
		return fail(diags)
	}
	b.Bundle = rb
	return b, diags
}

// filePolicies lists the policies of f whose components belong to its
// bundle besides the roles' (router.BundleOptions.Policies): every role's
// instance, the instance by name and every declared policy's per-role
// instances.
func filePolicies(f *config.PolicyFile) []*policy.Policy {
	var ps []*policy.Policy
	for _, role := range config.Roles {
		if p := f.Roles[role]; p != nil {
			ps = append(ps, p)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(f.Policies)) {
		ps = append(ps, f.Policies[name])
	}
	for _, d := range f.Decls {
		for _, role := range slices.Sorted(maps.Keys(d.Instances)) {
			ps = append(ps, d.Instances[role])
		}
	}
	return ps
}

// classifierInstance is f's request_classifier component; nil without one.
func classifierInstance(f *config.PolicyFile) any {
	if f.Classifier == nil {
		return nil
	}
	return f.Classifier.Instance
}

// blockSizeOverride is f's router.block_size when f sets it, else 0.
func blockSizeOverride(f *config.PolicyFile) int {
	if !f.BlockSizeSet {
		return 0
	}
	return f.BlockSize
}

// PolicyFile is the loaded policy file, for inspection of the whole file
// (`router validate` prints it). It is the bundle's own: the caller must not modify it.
func (b *Bundle) PolicyFile() *config.PolicyFile { return b.file }

// Filename is the name of the policy file the bundle was loaded from
// (config.DefaultPolicyName for the built-in default policy).
func (b *Bundle) Filename() string {
	return b.file.Filename
}

// PolicyName is the name of the policy the file's worker_selection gives
// role (config.DefaultPolicyName when it names none).
func (b *Bundle) PolicyName(role shared.Role) string {
	return b.file.RolePolicies[role]
}

// RolePolicies returns a copy of the name of each role's policy (see
// PolicyName).
func (b *Bundle) RolePolicies() map[shared.Role]string {
	return maps.Clone(b.file.RolePolicies)
}

// ReplayDecisionLatency is the simulated time a replay charges for the
// bundle's plugin calls (docs/replay.md, "Plugins in replay"): per decision
// of each policy that calls a plugin, by policy name
// (config.PolicyFile.ReplayDecisionLatency; a policy of built-in
// components only is not listed), and per call of the request classifier
// (config.PolicyFile.ReplayClassifierLatency). They are replay.DecisionLatency's Policies and Classifier.
func (b *Bundle) ReplayDecisionLatency() (policies map[string]time.Duration, classifier time.Duration) {
	for _, d := range b.file.Decls {
		if l := b.file.ReplayDecisionLatency(d.Name); l > 0 {
			if policies == nil {
				policies = make(map[string]time.Duration)
			}
			policies[d.Name] = l
		}
	}
	return policies, b.file.ReplayClassifierLatency()
}

// Workers returns a copy of the file's worker blocks, in file order.
func (b *Bundle) Workers() []config.Worker {
	return slices.Clone(b.file.Workers)
}

// Cluster is the file's cluster block (replicas sharing over NATS), nil
// when it has none.
func (b *Bundle) Cluster() *config.Cluster {
	if b.file.Cluster == nil {
		return nil
	}
	c := *b.file.Cluster
	return &c
}

// Queue is the file's queue block, or config.DefaultQueue when the file
// has none.
func (b *Bundle) Queue() config.Queue {
	return b.file.Queue
}

// Classifier returns the factory of the file's request_classifier; nil,
// nil when the file has none. The error says
// that the block's instance is not a shared.ClassifierFactory.
func (b *Bundle) Classifier() (shared.ClassifierFactory, error) {
	if b.file.Classifier == nil || b.file.Classifier.Instance == nil {
		return nil, nil
	}
	f, ok := b.file.Classifier.Instance.(shared.ClassifierFactory)
	if !ok {
		return nil, fmt.Errorf("%s: request_classifier: %T is not a classifier factory", b.file.Filename, b.file.Classifier.Instance)
	}
	return f, nil
}

// PluginState is one plugin block's state in a bundle (Bundle.Plugins).
type PluginState struct {
	// Name is the plugin block's name.
	Name string
	// Started is false for a plugin whose start failed under
	// on_start_failure = "fallback": its components are unavailable and
	// their policies decide by fallback.
	Started bool
	// Status is the supervisor's status (up, restarting, backoff,
	// failed...); supervisor.StatusUnknown when not started.
	Status supervisor.Status
	// BreakerOpen is true while the plugin is up with its circuit breaker
	// open or half-open (supervisor.Host.BreakerOpen): most of its
	// policies' decisions are made by their fallbacks.
	BreakerOpen bool
	// Stats are the plugin's decision-call counters since the bundle was
	// loaded (calls, fallbacks, restarts...).
	Stats supervisor.Stats
	// Info is what the plugin's current process runs (version, file
	// checksums, start time: supervisor.Host.Info); zero, with Running
	// false, while it has no process.
	Info supervisor.PluginInfo
	// Running is true while the plugin has a process (Info is set).
	Running bool
}

// Plugins returns the state of each of the file's plugin blocks, in file
// order; nil for a file without plugins. Each call
// reads the current state.
func (b *Bundle) Plugins() []PluginState {
	if len(b.file.Plugins) == 0 {
		return nil
	}
	out := make([]PluginState, len(b.file.Plugins))
	for i, p := range b.file.Plugins {
		ps := PluginState{Name: p.Name, Started: p.Failed == nil, Status: supervisor.StatusUnknown}
		ps.Status = b.host.Status(p.Name)
		ps.BreakerOpen = b.host.BreakerOpen(p.Name)
		ps.Stats = b.host.Stats(p.Name)
		ps.Info, ps.Running = b.host.Info(p.Name)
		out[i] = ps
	}
	return out
}

// PluginFiles lists the files the bundle's plugins run, absolute and each
// once, in file order (config.Plugin.Files of each plugin block, also of
// one that failed to start): the executables, the files among their args
// and those their sha256_files pin. `--watch` watches them
// (live.ReloaderOptions.Watch). Each call looks at the file system again
// (which args name existing files).
func (b *Bundle) PluginFiles() []string {
	var out []string
	for _, p := range b.file.Plugins {
		for _, f := range p.Files() {
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	return out
}
