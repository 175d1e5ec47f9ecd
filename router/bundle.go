package router

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/shared"
)

// Errors of bundles and of swapping them.
var (
	// ErrBundleInUse: Close on a bundle a Router is deciding with, or Apply
	// of a bundle that is already applied or was retired.
	ErrBundleInUse = errors.New("bundle is in use by a router")
	// ErrClosed: the Router was closed.
	ErrClosed = errors.New("router closed")
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
// role, compiled (or on the hosted path), and the plugin Host whose
// processes serve their out-of-process components. A Router decides with
// one bundle at a time (Apply swaps them) and counts the decisions in
// flight on each, so a bundle that was swapped out is drained before its
// plugins are stopped (Close).
//
// A Bundle is applied to at most one Router, once.
type Bundle struct {
	// file is the loaded policy file; nil for NewBundle. Callers read it
	// through methods (Filename, PolicyName, Roles, Queue, Classifier...),
	// or whole through PolicyFile.
	file *config.PolicyFile

	// host runs the bundle's plugins; nil for NewBundle. Close shuts it
	// down.
	host *supervisor.Host

	roles map[shared.Role]*rolePolicy
	// owned is true when the bundle built its policies' components (a
	// loaded file) and so closes those implementing shared.Closer.
	owned bool

	// inflight counts the selections deciding with the bundle, striped
	// over cache lines so that concurrent selections do not contend on
	// one counter; the count is the sum.
	inflight [inflightStripes]inflightStripe
	// state is bundleNew, bundleActive or bundleRetired.
	state     atomic.Int32
	drained   chan struct{} // closed once retired with nothing in flight
	drainOnce sync.Once

	closeOnce sync.Once
	closed    chan struct{}
	closeErr  error

	listenersOnce sync.Once
	listeners     []shared.EventListener
}

const (
	bundleNew int32 = iota
	bundleActive
	bundleRetired
)

func newBundle() *Bundle {
	return &Bundle{
		roles:   make(map[shared.Role]*rolePolicy),
		drained: make(chan struct{}),
		closed:  make(chan struct{}),
	}
}

// NewBundle returns a bundle of policies built by the caller, with no
// plugin Host: what Options.Roles makes. The caller keeps ownership of the
// policies' components (Close does not close them).
func NewBundle(roles map[shared.Role]*policy.Policy) (*Bundle, error) {
	b := newBundle()
	for role, p := range roles {
		if !role.Valid() {
			return nil, fmt.Errorf("router: invalid role %q", role)
		}
		if p == nil {
			return nil, fmt.Errorf("router: role %s: no policy", role)
		}
		rp, err := resolve(p, 0)
		if err != nil {
			return nil, fmt.Errorf("router: role %s: %w", role, err)
		}
		b.roles[role] = rp
	}
	return b, nil
}

// LoadBundle loads the policy file at path with a new plugin Host: the
// file's plugins are started and their components configured, and each
// role's policy is compiled. An empty path loads the built-in default
// policy (config.DefaultPolicyName, diagnostics under that name), as
// `router replay` without --policy does. On success the bundle is ready
// to Apply (or to inspect) and the diagnostics hold warnings only. On any
// error the Host is shut down before LoadBundle returns (nothing is left
// running), the bundle is nil and the diagnostics, each at file:line:col,
// say why.
//
// Every command that reads a policy file loads it here (`router
// validate`, `replay`, `serve` and its reloads), so they accept and refuse
// the same files. The caller closes the bundle (Close), or hands it to a
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
	b := newBundle()
	b.file, b.host, b.owned = cb, host, true
	for _, role := range config.Roles {
		p := cb.Roles[role]
		if p == nil {
			continue
		}
		rp, err := resolve(p, 0)
		if err != nil {
			subject := hcl.Range{Filename: cb.Filename, Start: hcl.InitialPos, End: hcl.InitialPos}
			for _, d := range cb.Decls {
				if d.Name == cb.RolePolicies[role] && !d.Builtin {
					subject = d.Range
				}
			}
			diags = append(diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Policy cannot run",
				Detail:   fmt.Sprintf("Role %s: %v.", role, err),
				Subject:  &subject,
			})
			b.closeComponents()
			return fail(diags)
		}
		b.roles[role] = rp
	}
	return b, diags
}

// BlockSize is the tokens per KV block of the bundle's file
// (router.block_size, config.DefaultBlockSize when the file leaves it
// unset): the default block size of a Router built on it, and router
// replay's. 0 for a NewBundle bundle (which fits any Router).
func (b *Bundle) BlockSize() int {
	if b.file == nil {
		return 0
	}
	return b.file.BlockSize
}

// BlockSizeOverride is the file's router.block_size when the file sets it
// (config.PolicyFile.BlockSizeSet), else 0: the live router then keys each
// model at its engines' own block size. 0 for a NewBundle bundle.
func (b *Bundle) BlockSizeOverride() int {
	if b.file == nil || !b.file.BlockSizeSet {
		return 0
	}
	return b.file.BlockSize
}

// PolicyFile is the loaded policy file, for inspection of the whole file
// (`router validate` prints it); nil for a NewBundle bundle. It is the
// bundle's own: the caller must not modify it.
func (b *Bundle) PolicyFile() *config.PolicyFile { return b.file }

// Filename is the name of the policy file the bundle was loaded from;
// "" for a NewBundle bundle.
func (b *Bundle) Filename() string {
	if b.file == nil {
		return ""
	}
	return b.file.Filename
}

// PolicyName is the name of the policy the file's worker_selection gives
// role (config.DefaultPolicyName when it names none); "" for a NewBundle
// bundle, whose policies have no file names.
func (b *Bundle) PolicyName(role shared.Role) string {
	if b.file == nil {
		return ""
	}
	return b.file.RolePolicies[role]
}

// Roles returns each role's policy in a new map: the file's instances for
// a loaded bundle (config.PolicyFile.Roles), the given ones for NewBundle.
// The policies are the bundle's, not copies: a replay runs them in a
// Router of its own (router.Options.Roles).
func (b *Bundle) Roles() map[shared.Role]*policy.Policy {
	out := make(map[shared.Role]*policy.Policy, len(b.roles))
	for role, rp := range b.roles {
		out[role] = rp.policy
	}
	return out
}

// RolePolicies returns a copy of the name of each role's policy (see
// PolicyName); nil for a NewBundle bundle.
func (b *Bundle) RolePolicies() map[shared.Role]string {
	if b.file == nil {
		return nil
	}
	return maps.Clone(b.file.RolePolicies)
}

// ReplayDecisionLatency is the simulated time a replay charges for the
// bundle's plugin calls (docs/replay.md, "Plugins in replay"): per decision
// of each policy that calls a plugin, by policy name
// (config.PolicyFile.ReplayDecisionLatency; a policy of built-in
// components only is not listed), and per call of the request classifier
// (config.PolicyFile.ReplayClassifierLatency). Nil and 0 for a NewBundle
// bundle. They are replay.DecisionLatency's Policies and Classifier.
func (b *Bundle) ReplayDecisionLatency() (policies map[string]time.Duration, classifier time.Duration) {
	if b.file == nil {
		return nil, 0
	}
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

// Workers returns a copy of the file's worker blocks, in file order; nil
// for a NewBundle bundle.
func (b *Bundle) Workers() []config.Worker {
	if b.file == nil {
		return nil
	}
	return slices.Clone(b.file.Workers)
}

// Cluster is the file's cluster block (replicas sharing over NATS), nil
// when it has none or the bundle is a NewBundle bundle.
func (b *Bundle) Cluster() *config.Cluster {
	if b.file == nil || b.file.Cluster == nil {
		return nil
	}
	c := *b.file.Cluster
	return &c
}

// Queue is the file's queue block, or config.DefaultQueue when the file
// has none or the bundle is a NewBundle bundle.
func (b *Bundle) Queue() config.Queue {
	if b.file == nil {
		return config.DefaultQueue()
	}
	return b.file.Queue
}

// Classifier returns the factory of the file's request_classifier; nil,
// nil when the file has none (or for a NewBundle bundle). The error says
// that the block's instance is not a shared.ClassifierFactory.
func (b *Bundle) Classifier() (shared.ClassifierFactory, error) {
	if b.file == nil || b.file.Classifier == nil || b.file.Classifier.Instance == nil {
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
}

// Plugins returns the state of each of the file's plugin blocks, in file
// order; nil for a NewBundle bundle or a file without plugins. Each call
// reads the current state.
func (b *Bundle) Plugins() []PluginState {
	if b.file == nil || len(b.file.Plugins) == 0 {
		return nil
	}
	out := make([]PluginState, len(b.file.Plugins))
	for i, p := range b.file.Plugins {
		ps := PluginState{Name: p.Name, Started: p.Failed == nil, Status: supervisor.StatusUnknown}
		if b.host != nil {
			ps.Status = b.host.Status(p.Name)
			ps.BreakerOpen = b.host.BreakerOpen(p.Name)
			ps.Stats = b.host.Stats(p.Name)
		}
		out[i] = ps
	}
	return out
}

// inflightStripes is how many counters Bundle.inflight is striped over.
const inflightStripes = 16

// inflightStripe is one counter of Bundle.inflight on its own cache line.
type inflightStripe struct {
	n atomic.Int64
	_ [56]byte
}

// InFlight is the number of selections deciding with the bundle now.
func (b *Bundle) InFlight() int64 {
	var n int64
	for i := range b.inflight {
		n += b.inflight[i].n.Load()
	}
	return n
}

// enter counts one selection in flight on b and returns the stripe it
// counted in, for release.
func (b *Bundle) enter() int {
	i := int(rand.Uint32() % inflightStripes)
	b.inflight[i].n.Add(1)
	return i
}

// release ends one selection on b, counted in stripe i. A retired bundle
// is drained when the sum reaches 0: no selection starts on it after it
// was retired (acquire re-checks the current bundle after counting
// itself), so a sum of 0 read after retirement stays 0.
func (b *Bundle) release(i int) {
	b.inflight[i].n.Add(-1)
	if b.state.Load() == bundleRetired && b.InFlight() == 0 {
		b.drainOnce.Do(func() { close(b.drained) })
	}
}

// retire marks b as swapped out: it drains once nothing is in flight.
func (b *Bundle) retire() {
	b.state.Store(bundleRetired)
	if b.InFlight() == 0 {
		b.drainOnce.Do(func() { close(b.drained) })
	}
}

// Close drains the bundle and stops it: it waits until no selection is
// deciding with it (or ctx ends), then closes its components that
// implement shared.Closer (for a loaded bundle) and shuts its plugin Host
// down, killing the plugins' process groups (with no grace left once ctx
// has ended). A bundle a Router is deciding with cannot be closed
// (ErrBundleInUse); one Apply returned, or one never applied, can. A
// second Close waits for the first (sync.Once) and returns its result. The error
// reports decisions still in flight when ctx ended and plugins that did
// not stop cleanly.
func (b *Bundle) Close(ctx context.Context) error {
	for {
		s := b.state.Load()
		if s == bundleActive {
			return ErrBundleInUse
		}
		if s == bundleRetired || b.state.CompareAndSwap(bundleNew, bundleRetired) {
			break
		}
	}
	b.closeOnce.Do(func() {
		defer close(b.closed)
		b.retire()
		var errs []error
		select {
		case <-b.drained:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("router: bundle drain: %d decisions still in flight: %w", b.InFlight(), ctx.Err()))
		}
		if b.owned {
			errs = append(errs, b.closeComponents())
		}
		if b.host != nil {
			errs = append(errs, b.host.Shutdown(ctx))
		}
		b.closeErr = errors.Join(errs...)
	})
	return b.closeErr
}

// closeComponents closes, once each, every component instance of the
// loaded file that implements shared.Closer.
func (b *Bundle) closeComponents() error {
	if b.file == nil {
		return nil
	}
	var errs []error
	b.eachComponent(func(c any) {
		if cl, ok := c.(shared.Closer); ok {
			if err := cl.Close(); err != nil {
				errs = append(errs, err)
			}
		}
	})
	return errors.Join(errs...)
}

// eachComponent calls f once for each distinct component instance of the
// bundle's policies (every role's, fallbacks and shadows included) and its
// classifier.
func (b *Bundle) eachComponent(f func(c any)) {
	seen := map[any]bool{}
	visit := func(c any) {
		if c == nil {
			return
		}
		if reflect.TypeOf(c).Comparable() {
			if seen[c] {
				return
			}
			seen[c] = true
		}
		f(c)
	}
	var walk func(p *policy.Policy, depth int)
	walk = func(p *policy.Policy, depth int) {
		if p == nil || depth > maxFallbackDepth {
			return
		}
		for _, fl := range p.Filters {
			visit(fl.Filter)
		}
		for _, s := range p.Scorers {
			visit(s.Scorer)
		}
		visit(p.Picker)
		walk(p.Fallback, depth+1)
		walk(p.Shadow, depth+1)
	}
	for _, rp := range b.roles {
		walk(rp.policy, 0)
	}
	if b.file == nil {
		return
	}
	for _, p := range b.file.Roles {
		walk(p, 0)
	}
	for _, p := range b.file.Policies {
		walk(p, 0)
	}
	for _, d := range b.file.Decls {
		for _, p := range d.Instances {
			walk(p, 0)
		}
	}
	if c := b.file.Classifier; c != nil && c.Instance != nil {
		visit(c.Instance)
	}
}

// eventListeners returns the bundle's policy components that implement
// shared.EventListener (computed once). The classifier is not among them:
// the admission layer delivers to it.
func (b *Bundle) eventListeners() []shared.EventListener {
	b.listenersOnce.Do(func() {
		var cls any
		if b.file != nil && b.file.Classifier != nil {
			cls = b.file.Classifier.Instance
		}
		b.eachComponent(func(c any) {
			if l, ok := c.(shared.EventListener); ok && c != cls {
				b.listeners = append(b.listeners, l)
			}
		})
	})
	return b.listeners
}
