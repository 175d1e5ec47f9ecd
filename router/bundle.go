package router

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/router/config"
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
	// Registerer, when set, receives the plugin metrics
	// (switchyard_plugin_*); the Hosts of successive bundles share their
	// collectors (supervisor.NewMetrics), so reloads do not collide.
	Registerer prometheus.Registerer
}

// Bundle is what a policy file resolves to at run time: the policy of each
// role, compiled (or on the hosted path), and the plugin Host whose
// processes serve their out-of-process components. A Router decides with
// one bundle at a time (Apply swaps them) and counts the decisions in
// flight on each, so a bundle that was swapped out is drained before its
// plugins are stopped (Close).
//
// A Bundle is applied to at most one Router, once.
type Bundle struct {
	// Config is the loaded policy file, for inspection (`router validate`
	// output, the plugins and their ranges); nil for NewBundle.
	Config *config.Bundle
	// Host runs the bundle's plugins; nil for NewBundle. Close shuts it
	// down.
	Host *supervisor.Host

	roles map[shared.Role]*rolePolicy
	// owned is true when the bundle built its policies' components (a
	// loaded file) and so closes those implementing shared.Closer.
	owned bool

	inflight atomic.Int64
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
func NewBundle(roles map[shared.Role]*shared.Policy) (*Bundle, error) {
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
// role's policy is compiled. On success the bundle is ready to Apply and
// the diagnostics hold warnings only. On any error the Host is shut down
// before LoadBundle returns (nothing is left running), the bundle is nil
// and the diagnostics, each at file:line:col, say why.
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
	host := supervisor.NewHost(supervisor.Options{Logger: o.Logger, ShutdownGrace: o.ShutdownGrace, Registerer: o.Registerer})
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
	cb, diags := config.LoadFileWith(path, o.Catalog, config.Options{
		Plugins:     host,
		Context:     ctx,
		Seed:        o.Seed,
		DefaultSeed: o.DefaultSeed,
	})
	if diags.HasErrors() || cb == nil {
		return fail(diags)
	}
	b := newBundle()
	b.Config, b.Host, b.owned = cb, host, true
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

// BlockSize is the tokens per KV block the bundle's file sets, or 0 for a
// NewBundle bundle (which fits any Router).
func (b *Bundle) BlockSize() int {
	if b.Config == nil {
		return 0
	}
	return b.Config.BlockSize
}

// InFlight is the number of selections deciding with the bundle now.
func (b *Bundle) InFlight() int64 { return b.inflight.Load() }

// release ends one selection on b.
func (b *Bundle) release() {
	if b.inflight.Add(-1) == 0 && b.state.Load() == bundleRetired {
		b.drainOnce.Do(func() { close(b.drained) })
	}
}

// retire marks b as swapped out: it drains once nothing is in flight.
func (b *Bundle) retire() {
	b.state.Store(bundleRetired)
	if b.inflight.Load() == 0 {
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
			errs = append(errs, fmt.Errorf("router: bundle drain: %d decisions still in flight: %w", b.inflight.Load(), ctx.Err()))
		}
		if b.owned {
			errs = append(errs, b.closeComponents())
		}
		if b.Host != nil {
			errs = append(errs, b.Host.Shutdown(ctx))
		}
		b.closeErr = errors.Join(errs...)
	})
	return b.closeErr
}

// closeComponents closes, once each, every component instance of the
// loaded file that implements shared.Closer.
func (b *Bundle) closeComponents() error {
	if b.Config == nil {
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
// bundle's policies (every role's, fallbacks included) and its classifier.
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
	var walk func(p *shared.Policy, depth int)
	walk = func(p *shared.Policy, depth int) {
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
	}
	for _, rp := range b.roles {
		walk(rp.policy, 0)
	}
	if b.Config == nil {
		return
	}
	for _, p := range b.Config.Roles {
		walk(p, 0)
	}
	for _, p := range b.Config.Policies {
		walk(p, 0)
	}
	for _, d := range b.Config.Decls {
		for _, p := range d.Instances {
			walk(p, 0)
		}
	}
	if c := b.Config.Classifier; c != nil && c.Instance != nil {
		visit(c.Instance)
	}
}

// eventListeners returns the bundle's policy components that implement
// shared.EventListener (computed once). The classifier is not among them:
// the admission layer delivers to it.
func (b *Bundle) eventListeners() []shared.EventListener {
	b.listenersOnce.Do(func() {
		var cls any
		if b.Config != nil && b.Config.Classifier != nil {
			cls = b.Config.Classifier.Instance
		}
		b.eachComponent(func(c any) {
			if l, ok := c.(shared.EventListener); ok && c != cls {
				b.listeners = append(b.listeners, l)
			}
		})
	})
	return b.listeners
}
