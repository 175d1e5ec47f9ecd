package router

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/switchyard-router/switchyard/router/policy"
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

// Bundle is a set of role policies a Router decides with: the policy of
// each role, compiled (or on the hosted path), with what stops them. A
// Router decides with one bundle at a time (Apply swaps them) and counts
// the decisions in flight on each, so a bundle that was swapped out is
// drained before it is stopped (Close). Reading a policy file into a
// bundle, with the plugin processes behind it, is router/loader's job.
//
// A Bundle is applied to at most one Router, once.
type Bundle struct {
	roles map[shared.Role]*rolePolicy
	o     BundleOptions

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

	// latency is true when some policy of the bundle (a role's, its
	// fallbacks', shadow's or canary candidate's) declares LATENCY: the
	// Router then predicts and learns from every answer (Decision.Sample).
	latency bool
}

// BundleOptions complete a bundle NewBundle builds beyond its role
// policies. The zero value is a bundle of the caller's policies, which
// the caller keeps (Options.Roles makes those).
type BundleOptions struct {
	// Policies are more policies whose components belong to the bundle
	// besides the roles' (a policy file's declared policies and their
	// per-role instances): their shared.EventListener components hear the
	// Router's events (Router.EventListeners) and, with Owned, the bundle
	// closes them.
	Policies []*policy.Policy
	// Classifier is the bundle's request classifier component (a policy
	// file's request_classifier instance), nil for none. When it is a
	// shared.ClassifierFactory, Router.ClassifierFactory returns it. It
	// belongs to the bundle (closed with Owned) but is not among
	// Router.EventListeners: the admission layer delivers to it.
	Classifier any
	// Owned makes the bundle the owner of its components: Close closes,
	// once each, those implementing shared.Closer, and so does a NewBundle
	// that fails.
	Owned bool
	// BlockSize is the tokens per KV block of the bundle's policy file: the
	// default block size of a Router built on it (Options.BlockSize 0). 0
	// for a bundle without a file, which fits any Router.
	BlockSize int
	// BlockSizeOverride is the file's router.block_size when the file sets
	// it, else 0 (each model keyed at its engines' block size). A Router
	// applies only bundles with BlockSize 0 or the override it started
	// with (Apply, ErrBlockSize).
	BlockSizeOverride int
	// Close, when set, runs last in Bundle.Close, after the drain and the
	// components' Close (router/loader stops the bundle's plugin Host
	// there); ctx is Close's. Its error is part of Close's.
	Close func(ctx context.Context) error
	// Source is what the bundle was built from, for its builder to find
	// again from a Router's bundle (Bundle.Source): router/loader sets its
	// own *loader.Bundle. The core never reads it.
	Source any
}

// RoleError is NewBundle's error for a role whose policy cannot run (no
// picker, or a pipeline that does not compile).
type RoleError struct {
	Role shared.Role
	Err  error
}

func (e *RoleError) Error() string { return fmt.Sprintf("router: role %s: %v", e.Role, e.Err) }

// Unwrap returns the policy's error.
func (e *RoleError) Unwrap() error { return e.Err }

const (
	bundleNew int32 = iota
	bundleActive
	bundleRetired
)

// bundleRoles is the order NewBundle resolves roles in: the first role
// that fails is reported.
var bundleRoles = []shared.Role{shared.RoleAggregated, shared.RolePrefill, shared.RoleDecode}

// NewBundle returns a bundle of the given role policies, each resolved
// once (hosted or compiled, with its fallbacks, shadow and canary), completed by
// o. Errors: an invalid role or a nil policy, and a *RoleError for a
// policy that cannot run; with o.Owned the components are closed before
// an error returns.
func NewBundle(roles map[shared.Role]*policy.Policy, o BundleOptions) (*Bundle, error) {
	b := &Bundle{
		roles:   make(map[shared.Role]*rolePolicy, len(roles)),
		o:       o,
		drained: make(chan struct{}),
		closed:  make(chan struct{}),
	}
	fail := func(err error) (*Bundle, error) {
		if o.Owned {
			err = errors.Join(err, b.closeComponents(roles))
		}
		return nil, err
	}
	for role, p := range roles {
		if !role.Valid() {
			return fail(fmt.Errorf("router: invalid role %q", role))
		}
		if p == nil {
			return fail(fmt.Errorf("router: role %s: no policy", role))
		}
	}
	for _, role := range bundleRoles {
		p := roles[role]
		if p == nil {
			continue
		}
		rp, err := resolve(p, 0)
		if err == nil {
			rp.canary, err = newCanary(role, p)
		}
		if err != nil {
			return fail(&RoleError{Role: role, Err: err})
		}
		b.roles[role] = rp
		b.latency = b.latency || rp.declares(shared.InputLatency)
	}
	return b, nil
}

// declares reports whether rp, its fallbacks, its shadow or its canary's
// candidate declare every input of in.
func (rp *rolePolicy) declares(in shared.Inputs) bool {
	for p := rp; p != nil; p = p.fallback {
		if p.inputs.Has(in) || (p.shadow != nil && p.shadow.declares(in)) || (p.canary != nil && p.canary.cand.declares(in)) {
			return true
		}
	}
	return false
}

// BlockSize is BundleOptions.BlockSize: the default block size of a
// Router built on the bundle; 0 fits any Router.
func (b *Bundle) BlockSize() int { return b.o.BlockSize }

// BlockSizeOverride is BundleOptions.BlockSizeOverride: the file's
// router.block_size when it sets one, else 0.
func (b *Bundle) BlockSizeOverride() int { return b.o.BlockSizeOverride }

// Source is BundleOptions.Source: what the bundle was built from (a
// *loader.Bundle for a loaded policy file); nil for a nil bundle.
func (b *Bundle) Source() any {
	if b == nil {
		return nil
	}
	return b.o.Source
}

// Roles returns each role's policy in a new map. The policies are the
// bundle's, not copies: a replay runs them in a Router of its own
// (Options.Roles).
func (b *Bundle) Roles() map[shared.Role]*policy.Policy {
	out := make(map[shared.Role]*policy.Policy, len(b.roles))
	for role, rp := range b.roles {
		out[role] = rp.policy
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
// implement shared.Closer (BundleOptions.Owned) and runs
// BundleOptions.Close (a loaded bundle's plugin Host shuts down, killing
// the plugins' process groups, with no grace left once ctx has ended). A
// bundle a Router is deciding with cannot be closed (ErrBundleInUse); one
// Apply returned, or one never applied, can. A second Close waits for the
// first (sync.Once) and returns its result. The error reports decisions
// still in flight when ctx ended and what did not stop cleanly.
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
		if b.o.Owned {
			errs = append(errs, b.closeComponents(nil))
		}
		if b.o.Close != nil {
			errs = append(errs, b.o.Close(ctx))
		}
		b.closeErr = errors.Join(errs...)
	})
	return b.closeErr
}

// closeComponents closes, once each, every component of the bundle (and
// of the policies of roles, for a NewBundle that failed half-way) that
// implements shared.Closer.
func (b *Bundle) closeComponents(roles map[shared.Role]*policy.Policy) error {
	var errs []error
	b.eachComponent(roles, func(c any) {
		if cl, ok := c.(shared.Closer); ok {
			if err := cl.Close(); err != nil {
				errs = append(errs, err)
			}
		}
	})
	return errors.Join(errs...)
}

// eachComponent calls f once for each distinct component instance of the
// bundle's policies (every role's, fallbacks and shadows included, then
// BundleOptions.Policies, then roles') and its classifier.
func (b *Bundle) eachComponent(roles map[shared.Role]*policy.Policy, f func(c any)) {
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
		if p.Canary != nil {
			walk(p.Canary.Policy, depth+1)
		}
	}
	for _, rp := range b.roles {
		walk(rp.policy, 0)
	}
	for _, p := range b.o.Policies {
		walk(p, 0)
	}
	for _, p := range roles {
		walk(p, 0)
	}
	visit(b.o.Classifier)
}

// eventListeners returns the bundle's policy components that implement
// shared.EventListener (computed once). The classifier is not among them:
// the admission layer delivers to it.
func (b *Bundle) eventListeners() []shared.EventListener {
	b.listenersOnce.Do(func() {
		cls := b.o.Classifier
		b.eachComponent(nil, func(c any) {
			if l, ok := c.(shared.EventListener); ok && c != cls {
				b.listeners = append(b.listeners, l)
			}
		})
	})
	return b.listeners
}
