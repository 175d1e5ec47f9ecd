package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/hosted"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/pipeline"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/predict"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// Options configure a Router.
type Options struct {
	// BlockSize is the default tokens per KV block: of a request that
	// gives none (shared.Request.BlockSize 0) and of a worker's capacity
	// when neither the policy file nor its engine gives one (see
	// AddWorkers); > 0. With Bundle set, 0 takes the bundle's
	// (Bundle.BlockSize: its file's router.block_size, 512 when unset).
	// Each request is hashed, counted and booked in its own block size.
	BlockSize int
	// Roles maps each role to its policy, for a Router whose policies never
	// change (replay). A role without a policy cannot be selected for
	// (ErrNoPolicy). Set Roles or Bundle, not both.
	Roles map[shared.Role]*policy.Policy
	// Bundle is the initial bundle of a Router whose policies are swapped
	// (Apply): typically a loaded policy file's (router/loader). The Router
	// owns it once New succeeded and closes it when the Router closes
	// (a bundle Apply swaps out is the caller's to close); when New fails
	// it is still the caller's to close.
	Bundle *Bundle
	// BookingsAreLoad marks LOAD as available from the router's own bookings
	// alone, without engine metrics: true for simulated workers, whose only
	// load is what the router sent them.
	BookingsAreLoad bool

	// Registerer, when set, gets the router's metrics:
	// switchyard_shadow_decisions_total{role,policy,shadow,result},
	// switchyard_shadow_decision_seconds{role,shadow} and the latency
	// predictor's switchyard_predictor_relative_error{target,quantile},
	// switchyard_predictor_comparisons_total{target} and
	// switchyard_predictor_classes. nil means no metrics.
	Registerer prometheus.Registerer
	// Shadow sets how the policies' shadows run (serve: asynchronously;
	// replay: Inline). Without a shadow in any policy it has no effect.
	Shadow ShadowOptions
	// Predict makes the Router predict every decision's latency and learn
	// from its answer (Decision.Sample) whatever the policies declare;
	// otherwise it does only while a policy of the current bundle
	// declares LATENCY. Replay sets it to report the predictor's
	// accuracy under any policy.
	Predict bool
	// Canary sets the canaries' clock and rollback hook. With a
	// Registerer the Router also exports switchyard_canary_state,
	// switchyard_canary_decisions_total and
	// switchyard_canary_rollbacks_total (see Canary).
	Canary CanaryOptions
}

// Selection errors of the Router itself.
var (
	// ErrNoPolicy: a request for a role the bundle maps to no policy.
	ErrNoPolicy = errors.New("no policy for role")
	// ErrBlockSize: a request with a negative block size, or a bundle
	// whose file sets (or unsets) router.block_size otherwise than the
	// running router's file, which needs a restart.
	ErrBlockSize = errors.New("block size differs from the router's")
	// ErrAllExcluded: every worker that serves the request's model and
	// role is excluded (Placement.Exclude). It wraps shared.ErrNoWorkers.
	ErrAllExcluded = fmt.Errorf("every candidate worker is excluded: %w", shared.ErrNoWorkers)
)

// Router picks a worker for each request by its role's policy and books it.
// Safe for concurrent use.
type Router struct {
	// blockSize is the default block size (Options.BlockSize); override
	// is the policy file's router.block_size when the file sets it, else
	// 0 (each model keyed at its engines' block size): fixed for the
	// Router's life.
	blockSize       int
	override        int
	bookingsAreLoad bool
	// cur is the bundle new selections decide with; nil once closed. Each
	// selection reads it once (acquire) and counts itself in flight on it.
	cur       atomic.Pointer[Bundle]
	fleet     *fleet.Fleet
	index     *prefix.Index
	scratch   sync.Pool // *pipeline.Scratch
	fallbacks atomic.Int64

	shadow        ShadowOptions
	shadowMetrics *shadowMetrics // nil without a Registerer
	shadowJobs    sync.Pool      // *shadowJob
	shadowPool    *shadowPool    // the asynchronous shadows; nil when Inline

	canaryOpts    CanaryOptions
	canaryMetrics *canaryMetrics // nil without a Registerer

	// models is the latency predictor's models (one per worker class),
	// fed by ObserveFirstToken and ObserveEnd; alwaysLearn is
	// Options.Predict.
	models      *predict.Set
	alwaysLearn bool

	// swapMu serialises Apply and Close.
	swapMu sync.Mutex
	closed bool
}

// rolePolicy is a policy with its hosted form or its compiled pipeline
// resolved once.
type rolePolicy struct {
	policy   *policy.Policy
	inputs   shared.Inputs
	hosted   hosted.HostedWorkerPicker // nil unless the policy is hosted-eligible
	compiled *pipeline.Compiled        // nil when hosted
	fallback *rolePolicy
	shadow   *rolePolicy // compiled, never hosted; its own fallback and shadow are not resolved
	canary   *Canary     // the role's policy's canary (NewBundle); nil without one
}

// maxFallbackDepth bounds a chain of fallbacks (the loader rejects cycles).
const maxFallbackDepth = 8

// resolve resolves a role's policy, its fallbacks and its shadow.
func resolve(p *policy.Policy, depth int) (*rolePolicy, error) {
	if p == nil || depth > maxFallbackDepth {
		return nil, nil
	}
	rp, err := resolveOne(p, true)
	if err != nil {
		return nil, err
	}
	if depth == 0 && p.Shadow != nil {
		// The shadow always runs its pipeline, on candidates captured
		// before the live booking: the hosted path reads live counters.
		if rp.shadow, err = resolveOne(p.Shadow, false); err != nil {
			return nil, fmt.Errorf("shadow: %w", err)
		}
	}
	rp.fallback, err = resolve(p.Fallback, depth+1)
	return rp, err
}

// resolveOne compiles p, or takes the hosted path when hostedOK and p is
// eligible.
func resolveOne(p *policy.Policy, hostedOK bool) (*rolePolicy, error) {
	if p.Picker == nil {
		return nil, fmt.Errorf("policy %q has no picker", p.Name)
	}
	in := p.Inputs()
	if in.Has(shared.InputLatency) {
		// The predictions are computed from each candidate's load and
		// overlap (predict.Features).
		in |= shared.InputLoad | shared.InputCache
	}
	rp := &rolePolicy{policy: p, inputs: in}
	if hostedOK {
		rp.hosted, _ = hosted.IntoHosted(p)
	}
	if rp.hosted == nil {
		var err error
		if rp.compiled, err = pipeline.Compile(p); err != nil {
			return nil, err
		}
	}
	return rp, nil
}

// New returns a Router with an empty fleet, deciding with o.Bundle or with
// a bundle of o.Roles.
func New(o Options) (*Router, error) {
	if o.Bundle != nil && o.Roles != nil {
		return nil, errors.New("router: both Roles and Bundle set")
	}
	if o.BlockSize == 0 && o.Bundle != nil {
		o.BlockSize = o.Bundle.BlockSize()
	}
	if o.BlockSize <= 0 {
		return nil, fmt.Errorf("router: block size %d, want > 0", o.BlockSize)
	}
	b := o.Bundle
	var override int
	if b == nil {
		var err error
		if b, err = NewBundle(o.Roles, BundleOptions{}); err != nil {
			return nil, err
		}
	} else if override = b.BlockSizeOverride(); override != 0 && override != o.BlockSize {
		return nil, fmt.Errorf("router: %w: bundle %d, router %d", ErrBlockSize, override, o.BlockSize)
	}
	if o.Shadow.MaxInFlight <= 0 {
		o.Shadow.MaxInFlight = DefaultShadowInFlight
	}
	if o.Shadow.QueueLen <= 0 {
		o.Shadow.QueueLen = DefaultShadowQueue
	}
	if o.Shadow.SampleInterval <= 0 {
		o.Shadow.SampleInterval = DefaultShadowSampleInterval
	}
	if o.Shadow.Recent <= 0 {
		o.Shadow.Recent = DefaultShadowRecent
	}
	r := &Router{
		blockSize:       o.BlockSize,
		override:        override,
		bookingsAreLoad: o.BookingsAreLoad,
		fleet:           fleet.New(),
		index:           prefix.New(o.BlockSize),
		shadow:          o.Shadow,
		canaryOpts:      o.Canary,
		models:          predict.NewSet(),
		alwaysLearn:     o.Predict,
	}
	if o.Registerer != nil {
		var err error
		if r.shadowMetrics, err = registerShadow(o.Registerer); err != nil {
			return nil, fmt.Errorf("router: metrics: %w", err)
		}
		if r.canaryMetrics, err = registerCanary(o.Registerer, r); err != nil {
			return nil, fmt.Errorf("router: metrics: %w", err)
		}
		if err = registerPredictor(o.Registerer, r); err != nil {
			return nil, fmt.Errorf("router: metrics: %w", err)
		}
	}
	if !b.state.CompareAndSwap(bundleNew, bundleActive) {
		return nil, fmt.Errorf("router: initial bundle: %w", ErrBundleInUse)
	}
	r.cur.Store(b)
	r.scratch.New = func() any { return new(pipeline.Scratch) }
	r.shadowJobs.New = func() any { return new(shadowJob) }
	if !o.Shadow.Inline {
		r.shadowPool = newShadowPool(o.Shadow, r.shadowAsync, r.shadowMetrics)
	}
	return r, nil
}

// UncachedTokens is the prompt tokens of req that the best-placed member
// of its model and role does not hold by the prefix index, at least 1:
// the default scheduling cost of a queued request and a classifier's
// input. Overlaps count in req's blocks (req.BlockSize; 0: the router's
// default). Lock-free apart from the index's own brief lock.
func (r *Router) UncachedTokens(req *shared.Request) int64 {
	bs := r.sizeOf(req)
	var best int32
	if p := r.fleet.Snapshot().ModelPartition(req.Model, req.Role); p != nil && len(req.BlockHashes) > 0 {
		s := r.scratch.Get().(*pipeline.Scratch)
		overlap := s.Overlap(len(p.IDs))
		r.index.FillAt(p.Slots, req.BlockHashes, bs, req.Prompt, overlap)
		for _, o := range overlap {
			best = max(best, o)
		}
		r.scratch.Put(s)
	}
	return max(int64(req.PromptTokens-int(best)*bs), 1)
}

// sizeOf is req's block size: req.BlockSize when positive, else the
// router's default.
func (r *Router) sizeOf(req *shared.Request) int {
	if req.BlockSize > 0 {
		return req.BlockSize
	}
	return r.blockSize
}

// PartitionInfos returns the members of model's role partition as a
// classifier sees them (shared.PartitionContext.Workers): an immutable
// snapshot in ascending (ID, DPRank) order, nil when there are none.
func (r *Router) PartitionInfos(model string, role shared.Role) []shared.WorkerInfo {
	if p := r.fleet.Snapshot().ModelPartition(model, role); p != nil {
		return p.Infos
	}
	return nil
}

// ClassifierFactory is the current bundle's request classifier
// (BundleOptions.Classifier: its policy file's request_classifier block);
// nil without one or once the Router is closed.
func (r *Router) ClassifierFactory() shared.ClassifierFactory {
	if b := r.cur.Load(); b != nil {
		if f, ok := b.o.Classifier.(shared.ClassifierFactory); ok {
			return f
		}
	}
	return nil
}

// EventListeners returns the current bundle's policy components that
// implement shared.EventListener (not its classifier: the admission layer
// delivers to that); nil once the Router is closed. The slice is shared
// and must not be modified.
func (r *Router) EventListeners() []shared.EventListener {
	if b := r.cur.Load(); b != nil {
		return b.eventListeners()
	}
	return nil
}

// BlockSize is the router's default tokens per KV block (Options.BlockSize):
// of requests that give none, and of a worker whose capacity has no other
// unit (AddWorkers).
func (r *Router) BlockSize() int { return r.blockSize }

// BlockSizeOverride is the policy file's router.block_size when the file
// the Router started with sets it, else 0: then each model's requests are
// keyed at its engines' block size (router/live). Fixed for the Router's
// life (a reload that changes it is refused).
func (r *Router) BlockSizeOverride() int { return r.override }

// Hosted reports whether role's policy runs on the hosted fast path.
func (r *Router) Hosted(role shared.Role) bool {
	b := r.cur.Load()
	if b == nil {
		return false
	}
	rp := b.roles[role]
	return rp != nil && rp.hosted != nil
}

// Bundle returns the bundle new selections decide with, for inspection;
// nil once the Router is closed. It may be swapped out at any time.
func (r *Router) Bundle() *Bundle { return r.cur.Load() }

// acquire returns the current bundle counted in flight and the stripe it
// counted in (the caller calls release with it), or nil when the Router
// is closed. The second load makes the
// count visible to a drain: a bundle swapped out between the two loads is
// released and the new one taken, so no selection starts on a bundle
// after Apply swapped it out and its drain began.
func (r *Router) acquire() (*Bundle, int) {
	for {
		b := r.cur.Load()
		if b == nil {
			return nil, 0
		}
		i := b.enter()
		if r.cur.Load() == b {
			return b, i
		}
		b.release(i)
	}
}

// Apply makes b the bundle new selections decide with and returns the one
// it replaces, which stays usable by the selections already deciding with
// it. The caller drains and stops old with old.Close (router/loader's
// Reloader does all of this). b must not have been applied before and, when
// it comes from a policy file (BlockSize > 0), set router.block_size as
// the Router's file did, or leave it unset as that one did
// (BlockSizeOverride: the keys of every model and the workers' capacities
// are in the override's blocks when it is set, in their engines'
// otherwise, so changing it needs a restart). Errors: ErrClosed,
// ErrBundleInUse, ErrBlockSize.
func (r *Router) Apply(b *Bundle) (old *Bundle, err error) {
	if b == nil {
		return nil, errors.New("router: Apply: nil bundle")
	}
	if b.BlockSize() != 0 && b.BlockSizeOverride() != r.override {
		return nil, fmt.Errorf("router: %w: bundle %d, router %d", ErrBlockSize, b.BlockSizeOverride(), r.override)
	}
	r.swapMu.Lock()
	defer r.swapMu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	if !b.state.CompareAndSwap(bundleNew, bundleActive) {
		return nil, fmt.Errorf("router: Apply: %w", ErrBundleInUse)
	}
	old = r.cur.Swap(b)
	old.retire()
	return old, nil
}

// Close stops the Router: selections from now on fail with ErrClosed, the
// ones in flight finish, the asynchronous shadow decisions running are
// cancelled and waited for, and the current bundle is drained and closed
// (bounded by ctx; see Bundle.Close). A second Close returns nil.
func (r *Router) Close(ctx context.Context) error {
	r.swapMu.Lock()
	if r.closed {
		r.swapMu.Unlock()
		return nil
	}
	r.closed = true
	b := r.cur.Swap(nil)
	b.retire()
	r.swapMu.Unlock()
	if r.shadowPool != nil {
		r.shadowPool.closing()
	}
	err := b.Close(ctx)
	if r.shadowPool != nil {
		r.shadowPool.close()
	}
	return err
}

// AddWorker joins a worker; its prefix-index capacity is its TotalKVBlocks
// (0: unknown, bounded by prefix.DefaultUnknownCapacity), in blocks of
// its own size (see AddWorkers).
func (r *Router) AddWorker(s fleet.Spec) (*fleet.Worker, error) {
	ws, err := r.AddWorkers(s)
	if err != nil {
		return nil, err
	}
	return ws[0], nil
}

// AddWorkers joins several workers with one membership snapshot (see
// fleet.AddWorkers); each worker's prefix-index capacity is its
// TotalKVBlocks (0: unknown, bounded by prefix.DefaultUnknownCapacity),
// in blocks of the worker's own size (CapacityBlockSize): the same
// blocks its requests are keyed in, so the approximate index holds at
// most TotalKVBlocks of its requests' blocks and the precise one 2 ×
// TotalKVBlocks × that size tokens. On error none of them is a member.
func (r *Router) AddWorkers(specs ...fleet.Spec) ([]*fleet.Worker, error) {
	ms := make([]prefix.Member, len(specs))
	for i, s := range specs {
		if err := s.Validate(); err != nil {
			return nil, err
		}
		ms[i] = prefix.Member{Candidate: prefix.Candidate{ID: s.ID, Rank: s.DPRank}, Capacity: int(s.TotalKVBlocks),
			BlockSize: r.CapacityBlockSize(s)}
	}
	// The index first, so that every member is scored by its slot from
	// the moment selections can see it.
	slots, err := r.index.AddWorkers(ms...)
	if err != nil {
		return nil, err
	}
	specs = slices.Clone(specs)
	for i := range specs {
		specs[i].Slot = slots[i]
		specs[i].Predictor = r.models.Class(classOf(&specs[i]))
		specs[i].KVTokens = specs[i].TotalKVBlocks * int64(r.CapacityBlockSize(specs[i]))
	}
	return r.fleet.AddWorkers(specs...)
}

// CapacityBlockSize is the tokens per block of s.TotalKVBlocks: the
// override (BlockSizeOverride) when set, else s's engine's own block size
// (s.EngineBlockSize) when known, else the router's default: the rule
// router/workers converts an engine's capacity by, and the block size the
// worker's requests are keyed at (router/live).
func (r *Router) CapacityBlockSize(s fleet.Spec) int {
	switch {
	case r.override > 0:
		return r.override
	case s.EngineBlockSize > 0 && s.EngineBlockSize <= 1<<30:
		return int(s.EngineBlockSize)
	}
	return r.blockSize
}

// RemoveWorker takes a worker out of selection and purges its prefix-index
// entries. Its in-flight requests keep their bookings until they end.
func (r *Router) RemoveWorker(id shared.WorkerID, rank uint32) error {
	if err := r.fleet.RemoveWorker(id, rank); err != nil {
		return err
	}
	r.index.RemoveWorker(prefix.Candidate{ID: id, Rank: rank})
	return nil
}

// Prefix is the Router's prefix index, of every worker the Router
// holds, keyed by prefix.Candidate{ID, Rank}: for a member's precise
// index (Precise, the kvevents.Sink its engine's KV event subscriber
// feeds; DropPrecise), its size (Len), and to copy its content between
// replicas (Export, Import, Record; router/cluster). Membership is the
// Router's: add and remove workers with AddWorkers and RemoveWorker, never
// on the index, so that the fleet and the index agree on every member and
// its slot. The index is safe for concurrent use; routing goes on while
// it is read or fed.
func (r *Router) Prefix() *prefix.Index { return r.index }

// Fallbacks is how many selections a fallback policy answered.
func (r *Router) Fallbacks() int64 { return r.fallbacks.Load() }

// Models returns the sorted union of the workers' models.
func (r *Router) Models() []string { return r.fleet.Snapshot().Models() }

// Workers returns the members of role serving model ("" for every model),
// in ascending id order; nil when there are none. The slice is shared and
// must not be modified.
func (r *Router) Workers(model string, role shared.Role) []*fleet.Worker {
	if p := r.fleet.Snapshot().ModelPartition(model, role); p != nil {
		return p.Workers
	}
	return nil
}

// Decision is the outcome of one selection.
type Decision struct {
	// Worker is the chosen worker (its join generation).
	Worker *fleet.Worker
	// Booking holds the request's charge on Worker. The caller calls
	// PrefillDone at the first token and Release exactly once at the end
	// (Release is idempotent, so every ending path may call it).
	Booking *fleet.Booking
	// OverlapBlocks is the leading blocks of the request the index believes
	// Worker holds.
	OverlapBlocks int
	// Belief is the index's belief of what Worker holds of the prompt,
	// precise and approximate, in tokens, taken before the prompt was
	// recorded; set only for a request with token ids (Request.Prompt),
	// the zero Belief otherwise.
	Belief prefix.Belief
	// Policy is the name of the policy that decided (the fallback's name when
	// Fallback is true).
	Policy string
	// Hosted is true when the hosted fast path decided.
	Hosted bool
	// Fallback is true when the role's policy failed and its fallback decided.
	Fallback bool
	// FallbackCause is the primary policy's error when Fallback is true.
	FallbackCause error
	// Target is true when the request's advisory target worker was taken
	// without running the policy.
	Target bool
	// Alternates are the policy's runners-up, best first, when the
	// placement asked for them (Placement.Alternates); nil otherwise, and
	// for a Target decision (no policy ran). See Placement.Alternates for
	// how they are ranked.
	Alternates []*fleet.Worker
	// Canary is the canary of the role's policy when it has one (nil
	// otherwise, and for a Target decision), and Candidate is true when
	// the canary's candidate decided (Policy names it, or its fallback
	// when Fallback). Hand the decision to Router.CanaryTTFT at the first
	// token.
	Canary    *Canary
	Candidate bool
	// Sample is what the latency predictor learns from at the first token
	// and the end (ObserveFirstToken, ObserveEnd): the chosen worker's
	// features at decision time and what was predicted for it. Learn is
	// false (and Sample zero) when the Router is not predicting.
	Sample predict.Sample
	Learn  bool
	// Shadow is the outcome of the role's policy's shadow when the Router
	// runs shadows inline (ShadowOptions.Inline); the zero outcome
	// (Result "") otherwise, for a policy without a shadow and for a
	// Target decision (no policy ran).
	Shadow ShadowOutcome
}

// Placement narrows one selection (Place).
type Placement struct {
	// Capacity is the most requests a worker may have in flight; 0: no
	// limit. A worker at Capacity is not a candidate, and the booking is
	// an atomic try-book on the chosen worker, so concurrent selections
	// never take a worker past it.
	Capacity int64
	// Exclude are workers that are not candidates at all (every rank of
	// an id). The slice is read, not kept.
	Exclude []shared.WorkerID
	// Failed are workers that failed under the request, each in the join
	// it failed in (fleet.Worker.Generation): not candidates while that
	// join lasts (every rank of the id), candidates again once the worker
	// left and joined again (a restarted engine). The slice is read, not
	// kept.
	Failed []WorkerJoin
	// Target, when HasTarget, is an advisory worker (a classifier's
	// shared.Classification.Target, or a request's pin): taken without
	// running the policy when it is a candidate (its lowest rank), ignored
	// otherwise. To book on a named worker whatever the policy, use Bind.
	Target    shared.WorkerID
	HasTarget bool
	// Booking, when not nil, is the storage the decision's booking is
	// made in (the admission layer keeps one in each request handle); it
	// must not hold a live booking. nil allocates one.
	Booking *fleet.Booking
	// Alternates asks for up to this many runners-up in
	// Decision.Alternates (at most MaxAlternates; 0: none, the default,
	// and no work or allocation for them). They are the candidates the
	// deciding policy left after its filters, other than the chosen one:
	// by ascending summed scorer cost when it has scorers (ties in
	// candidate order after the chosen row), else in candidate order after
	// the chosen row, wrapping around (the hosted round-robin's next
	// picks); a hosted policy that reads ACTIVE_REQUESTS ranks them by
	// requests in flight, fewest first. Ranking is O(candidates x
	// Alternates). They are not booked: a proxy tries them only when the
	// chosen worker fails.
	Alternates int
}

// MaxAlternates bounds Placement.Alternates: a proxy retries a handful of
// endpoints at most (Envoy's default retry budget is one retry).
const MaxAlternates = 8

// maxTryBooks bounds how often Place re-runs a selection whose chosen
// worker reached Placement.Capacity between the candidates' snapshot and
// the try-book (another selection booked it first); then it answers
// shared.ErrAllBusy.
const maxTryBooks = 4

// Place picks a worker for req (req.Role selects the policy) among the
// members of its model and role that pl leaves, books it and records the
// request's blocks in the prefix index as sent to it. It takes no
// router-wide lock: the fleet is an atomic snapshot, the bundle is
// counted in flight, and the booking is atomic. req.BlockSize is the
// request's own block size, any positive size (router/live keys each
// model at its engines'); a zero one is set to the router's default.
// req.BlockHashes must have been hashed at that block size; the overlaps
// (CACHE), the prefill charge (PromptTokens - overlap × BlockSize) and
// the decode blocks booked (ceil(PromptTokens / BlockSize)) are in its
// blocks.
//
// Errors: ErrNoPolicy, ErrBlockSize (a negative req.BlockSize),
// shared.ErrNoWorkers, ErrAllExcluded
// (every member excluded), shared.ErrAllBusy (every member at
// pl.Capacity), shared.ErrAllFiltered (wrapped), the context's error,
// ErrClosed, or the policy's error when no fallback could decide.
//
// The selection decides with the bundle current when it starts, to the
// end, also when Apply swaps in another meanwhile.
//
// When the role's policy has a shadow (policy.Policy.Shadow), Place also
// asks it (Options.Shadow): inline, its outcome is in Decision.Shadow;
// otherwise it runs after Place returned, on a copy of *req that shares
// req's BlockHashes, Prompt and Metadata, which the caller must then not
// modify.
func (r *Router) Place(ctx context.Context, req *shared.Request, pl Placement) (Decision, error) {
	b, stripe, err := r.begin(ctx, req)
	if err != nil {
		return Decision{}, err
	}
	defer b.release(stripe)
	rp := b.roles[req.Role]
	// A canary sends the requests whose key hashes below its weight to
	// its candidate, with the candidate's own fallbacks; the live
	// policy's shadow is not asked for those.
	c := rp.canary
	candidate := c != nil && c.Candidate(req)
	if candidate {
		rp = c.cand
	}
	for try := 1; ; try++ {
		d, err := r.placeOnce(ctx, b, rp, req, pl, try > 1)
		if !errors.Is(err, errLostRace) {
			if c != nil && err == nil && !d.Target {
				d.Canary, d.Candidate = c, candidate
				r.canaryDecided(c, candidate, d.Fallback)
			}
			return d, err
		}
		if try == maxTryBooks {
			return Decision{}, fmt.Errorf("role %s: %w", req.Role, shared.ErrAllBusy)
		}
	}
}

// errLostRace: the chosen worker reached capacity before the try-book.
var errLostRace = errors.New("the chosen worker reached capacity first")

// placeOnce is one selection of Place over the current fleet snapshot.
// After a lost race, check every candidate's capacity (checkAll)
// whatever the fleet's full count says.
func (r *Router) placeOnce(ctx context.Context, b *Bundle, rp *rolePolicy, req *shared.Request, pl Placement, checkAll bool) (Decision, error) {
	part, err := r.partition(req)
	if err != nil {
		return Decision{}, err
	}
	if len(pl.Exclude) > 0 || len(pl.Failed) > 0 {
		if part = excluding(part, pl.Exclude, pl.Failed); part == nil {
			return Decision{}, fmt.Errorf("role %s: %w", req.Role, ErrAllExcluded)
		}
	}
	// With no worker at capacity (the common case) the candidates are
	// the partition as it is, and the try-book below still guards the
	// limit: no scan of every candidate's count.
	if pl.Capacity > 0 && (checkAll || r.fleet.AtCapacity()) {
		if part = underCapacity(part, pl.Capacity); part == nil {
			return Decision{}, fmt.Errorf("role %s: %w", req.Role, shared.ErrAllBusy)
		}
	}
	if pl.HasTarget {
		if i, ok := targetRow(part, pl.Target, 0, false); ok {
			return r.book(req, Decision{Policy: "target", Target: true}, part.Workers[i], -1, pl.Booking, pl.Capacity, false)
		}
	}
	d := Decision{Policy: rp.policy.Name}
	// The shadow sees the candidates as the live policy does (captured in
	// decide), and is compared with whichever policy decided: the role's
	// or its fallback.
	sj := r.shadowStart(b, rp, req)
	alt := min(pl.Alternates, MaxAlternates)
	w, overlap, err := r.decide(ctx, rp, req, part, &d, sj, alt, nil)
	if err != nil && rp.fallback != nil && fallbackAllowed(ctx, err) {
		d = Decision{Policy: rp.fallback.policy.Name, Fallback: true, FallbackCause: err}
		w, overlap, err = r.decide(ctx, rp.fallback, req, part, &d, nil, alt, nil)
		if err == nil {
			r.fallbacks.Add(1)
		}
	}
	if err != nil {
		r.shadowCancel(sj)
		return Decision{}, fmt.Errorf("policy %q: %w", d.Policy, err)
	}
	if d, err = r.book(req, d, w, overlap, pl.Booking, pl.Capacity, false); err != nil {
		r.shadowCancel(sj)
		return d, err
	}
	d.Shadow = r.shadowRun(sj, w)
	return d, nil
}

// targetRow returns the row of worker id in part: the id's lowest rank,
// or rank when hasRank; false when it is not a candidate. O(log n + the
// id's ranks).
func targetRow(part *fleet.Partition, id shared.WorkerID, rank uint32, hasRank bool) (int, bool) {
	i, ok := slices.BinarySearch(part.IDs, id)
	if !ok || !hasRank {
		return i, ok
	}
	for ; i < len(part.IDs) && part.IDs[i] == id; i++ {
		var rk uint32
		if part.DPRanks != nil {
			rk = part.DPRanks[i]
		}
		if rk == rank {
			return i, true
		}
	}
	return 0, false
}

// Binding names the worker Bind books a request on, and how.
type Binding struct {
	// Worker is the worker's id.
	Worker shared.WorkerID
	// Rank, when HasRank, is Worker's data-parallel rank: the booking is
	// on that rank's member only. Without it, on the id's lowest rank
	// among the members.
	Rank    uint32
	HasRank bool
	// Capacity is the most requests a worker may have in flight that the
	// booking counts toward (fleet.BookOver); 0: no limit. The booking is
	// made even at Capacity: the request is on the worker already.
	Capacity int64
	// Booking, when not nil, is the storage the booking is made in, as
	// Placement.Booking; nil allocates one.
	Booking *fleet.Booking
}

// Bind books req on the named worker without running a policy, also when
// the worker is at Capacity (counting toward it), and records the
// request's blocks in the prefix index as sent to it: for a request that
// is on that worker already, whatever a policy would choose: another
// replica's booking (router/cluster, router/replay's replicas) or a
// request an endpoint picker's proxy sent elsewhere than placed
// (admission's Handle.Move). The Decision has Policy "target" and Target
// set. req.BlockSize is handled as by Place. Lock-free like Place; it
// calls no component, so it does not block.
//
// Errors: ErrAllExcluded (wrapped) when the worker (at that rank) is not a
// member of req's model and role; ErrNoPolicy when req's role has no
// policy (as for Place); ErrBlockSize, shared.ErrNoWorkers, the context's
// error, ErrClosed.
func (r *Router) Bind(ctx context.Context, req *shared.Request, to Binding) (Decision, error) {
	b, stripe, err := r.begin(ctx, req)
	if err != nil {
		return Decision{}, err
	}
	defer b.release(stripe)
	part, err := r.partition(req)
	if err != nil {
		return Decision{}, err
	}
	i, ok := targetRow(part, to.Worker, to.Rank, to.HasRank)
	if !ok {
		return Decision{}, fmt.Errorf("role %s, worker %d: %w", req.Role, to.Worker, ErrAllExcluded)
	}
	return r.book(req, Decision{Policy: "target", Target: true}, part.Workers[i], -1, to.Booking, to.Capacity, true)
}

// partition is the members of req's model and role; shared.ErrNoWorkers
// (wrapped) when there are none.
func (r *Router) partition(req *shared.Request) (*fleet.Partition, error) {
	part := r.fleet.Snapshot().ModelPartition(req.Model, req.Role)
	if part == nil || len(part.Workers) == 0 {
		if req.Model != "" {
			return nil, fmt.Errorf("model %q, role %s: %w", req.Model, req.Role, shared.ErrNoWorkers)
		}
		return nil, fmt.Errorf("role %s: %w", req.Role, shared.ErrNoWorkers)
	}
	return part, nil
}

// book charges req to w (overlap < 0: look it up) and records its blocks
// in the prefix index as sent to w, in booking when not nil. With
// capacity > 0 the charge is a try-book, errLostRace when w already has
// that many requests in flight, or with over a booking counted toward
// capacity whatever w has (fleet.BookOver). Blocks and overlaps are
// req's (req.BlockSize > 0, set by Place).
func (r *Router) book(req *shared.Request, d Decision, w *fleet.Worker, overlap int, booking *fleet.Booking, capacity int64, over bool) (Decision, error) {
	// Without the policy's overlap (it did not declare CACHE), the index
	// reports it while it records the prompt (one pass, not two), so the
	// booking is made first and charged its prefill after.
	known := overlap >= 0
	bs := r.sizeOf(req)
	blocks := int64((req.PromptTokens + bs - 1) / bs)
	prefill := func() int64 {
		if req.Role == shared.RoleDecode {
			return 0 // the prompt's KV arrives from a prefill worker: nothing to prefill here
		}
		return max(int64(req.PromptTokens-overlap*bs), 0)
	}
	var charge int64
	if known {
		charge = prefill()
	}
	var before shared.Load
	learn := r.learning()
	if learn {
		w.LoadInto(&before, true) // before this request's own charge
	}
	switch {
	case capacity > 0 && over:
		d.Booking = fleet.BookOver(booking, w, capacity, charge, blocks)
	case capacity > 0:
		if d.Booking = fleet.TryBook(booking, w, capacity, charge, blocks); d.Booking == nil {
			return Decision{}, errLostRace
		}
	default:
		d.Booking = fleet.BookInto(booking, w, charge, blocks)
	}
	c := prefix.Candidate{ID: w.ID, Rank: w.DPRank}
	if req.Prompt != nil {
		d.Belief = r.index.BeliefAt(c, req.BlockHashes, bs, req.Prompt)
	}
	if known {
		r.index.RecordAt(w.Slot, c, req.BlockHashes)
	} else {
		// Before the prompt is added in flight below, which would count
		// the request's own blocks as held.
		overlap = r.index.RecordOverlapAt(c, req.BlockHashes, bs, req.Prompt)
		d.Booking.AddPrefill(prefill())
	}
	if req.Prompt != nil {
		if in := r.index.AddInflight(c, req.Prompt); in != nil {
			d.Booking.SetHeld(in)
		}
	}
	d.Worker = w
	d.OverlapBlocks = overlap
	if learn {
		d.Learn = true
		d.Sample.Features = r.features(req, &before, overlap, bs)
		d.Sample.Features.Capacity = float64(w.KVTokens)
		d.Sample.Model = w.Predictor
		d.Sample.Predicted = r.models.Predict(w.Predictor, &d.Sample.Features)
	}
	return d, nil
}

// underCapacity returns the members of p with fewer than capacity
// requests in flight: p itself when all are, nil when none is. A narrowed
// partition gets its own candidate-set key, so a round-robin cursor over
// it is not the full set's.
func underCapacity(p *fleet.Partition, capacity int64) *fleet.Partition {
	return narrow(p, "capacity", func(w *fleet.Worker) bool { return w.ActiveRequests() < capacity })
}

// excluding returns the members of p whose id is not in ids and whose
// join is not in failed: p itself when none is, nil when every member
// is. Every rank of an excluded id (or join) is left out.
func excluding(p *fleet.Partition, ids []shared.WorkerID, failed []WorkerJoin) *fleet.Partition {
	return narrow(p, "exclude", func(w *fleet.Worker) bool {
		return !slices.Contains(ids, w.ID) && !slices.Contains(failed, WorkerJoin{ID: w.ID, Generation: w.Generation})
	})
}

// WorkerJoin is one join of a worker to the fleet: its id and the
// generation of that join (fleet.Worker.Generation; a worker that leaves
// and joins again has a new one).
type WorkerJoin struct {
	ID         shared.WorkerID
	Generation uint64
}

// narrow returns the members of p that keep accepts: p itself when all
// are, nil when none is. The narrowed partition's candidate-set key is
// computed from its members under tag. keep is called once per member:
// it may read counters that concurrent selections change (underCapacity),
// so a second look could disagree with the first.
func narrow(p *fleet.Partition, tag string, keep func(*fleet.Worker) bool) *fleet.Partition {
	var q *fleet.Partition
	add := func(i int) {
		q.Workers = append(q.Workers, p.Workers[i])
		q.IDs = append(q.IDs, p.IDs[i])
		q.Slots = append(q.Slots, p.Slots[i])
		q.KVBlocks = append(q.KVBlocks, p.KVBlocks[i])
		if p.DPRanks != nil {
			q.DPRanks = append(q.DPRanks, p.DPRanks[i])
		}
	}
	for i, w := range p.Workers {
		switch {
		case keep(w):
			if q != nil {
				add(i)
			}
		case q == nil:
			// The first member left out: copy the ones before it.
			n := len(p.Workers) - 1
			q = &fleet.Partition{Role: p.Role, Model: p.Model, Workers: make([]*fleet.Worker, 0, n), IDs: make([]shared.WorkerID, 0, n),
				Slots: make([]int32, 0, n), KVBlocks: make([]int64, 0, n)}
			if p.DPRanks != nil {
				q.DPRanks = make([]uint32, 0, n)
			}
			for j := range i {
				add(j)
			}
		}
	}
	switch {
	case q == nil:
		return p
	case len(q.Workers) == 0:
		return nil
	}
	q.Key = hosted.CandidateSetKey(tag, p.Role, q.IDs)
	if q.Key == 0 {
		q.Key = 1
	}
	ws := q.Workers
	q.ActiveAt = func(row int) int64 { return ws[row].ActiveRequests() }
	return q
}

// fallbackAllowed: the fallback answers for component failures, not for
// outcomes that are the policy's answer (every candidate filtered out,
// all busy, no headroom for the request's latency targets) or
// the caller's. Whether the caller gave up is read from ctx, the caller's
// own context: a component's error can wrap context.Canceled from a
// context of its own (a plugin's stream ending with its process), and
// that is a component failure.
func fallbackAllowed(ctx context.Context, err error) bool {
	var noHeadroom *shared.NoHeadroomError
	return ctx.Err() == nil && !errors.Is(err, shared.ErrAllFiltered) && !errors.Is(err, shared.ErrAllBusy) &&
		!errors.Is(err, ErrAllExcluded) && !errors.Is(err, shared.ErrNoWorkers) && !errors.As(err, &noHeadroom)
}

// decide runs one policy over the partition and returns the chosen worker
// and, when the policy computed CACHE, its overlap (else -1); with alt > 0
// it sets d.Alternates to up to alt runners-up (Placement.Alternates). A
// shadow job sj, when not nil, captures the candidates before the policy
// runs. A trace tr, when not nil, records what each stage of a compiled
// policy did (pipeline.ExecuteTrace: Router.Explain); it is reset first.
func (r *Router) decide(ctx context.Context, rp *rolePolicy, req *shared.Request, part *fleet.Partition, d *Decision, sj *shadowJob, alt int, tr *pipeline.Trace) (*fleet.Worker, int, error) {
	if tr != nil {
		tr.Stages = tr.Stages[:0]
	}
	if rp.hosted != nil {
		if sj != nil {
			r.capture(sj, nil, part)
		}
		var active func(int) int64
		if rp.inputs.Has(shared.InputActiveRequests) {
			active = part.ActiveAt
		}
		v := hosted.NewWorkerInputView(part.IDs, part.Key, active, r.sizeOf(req))
		row, err := hosted.Select(rp.hosted, &v)
		if err != nil {
			return nil, -1, err
		}
		d.Hosted = true
		if alt > 0 {
			var cost func(int) float64
			if active != nil {
				cost = func(i int) float64 { return float64(active(i)) }
			}
			d.Alternates = runnersUp(len(part.Workers), row, alt, cost, func(i int) *fleet.Worker { return part.Workers[i] })
		}
		return part.Workers[row], -1, nil
	}
	s := r.scratch.Get().(*pipeline.Scratch)
	defer r.scratch.Put(s)
	c := s.Candidates(len(part.Workers), rp.inputs, part.DPRanks != nil)
	r.fill(c, rp.inputs, req, part)
	if sj != nil {
		r.capture(sj, c, part)
	}
	var row int
	var err error
	if tr != nil {
		row, err = pipeline.ExecuteTrace(ctx, rp.compiled, req, c, s, tr)
	} else {
		row, err = pipeline.Execute(ctx, rp.compiled, req, c, s)
	}
	if err != nil {
		return nil, -1, err
	}
	at := func(i int) *fleet.Worker { return part.Workers[locate(part, c.IDs[i], rank(c, i))] }
	w := at(row)
	if alt > 0 {
		var cost func(int) float64
		if costs := c.Costs; costs != nil {
			cost = func(i int) float64 { return costs[i] }
		}
		d.Alternates = runnersUp(c.Len(), row, alt, cost, at)
	}
	overlap := -1
	if c.OverlapBlocks != nil {
		overlap = int(c.OverlapBlocks[row])
	}
	return w, overlap, nil
}

// runnersUp returns up to k of the n rows other than chosen, as workers
// (at): by ascending cost when cost is not nil, ties and the cost-less
// case in row order after chosen, wrapping around. One pass over the
// rows, each inserted into a sorted list of at most k: O(n x k).
func runnersUp(n, chosen, k int, cost func(int) float64, at func(int) *fleet.Worker) []*fleet.Worker {
	k = min(k, n-1)
	if k <= 0 {
		return nil
	}
	rows := make([]int, 0, k)
	var costs []float64
	if cost != nil {
		costs = make([]float64, 0, k)
	}
	for j := 1; j < n; j++ {
		i := (chosen + j) % n
		if cost == nil {
			rows = append(rows, i)
			if len(rows) == k {
				break
			}
			continue
		}
		ci := cost(i)
		// The position after every kept row of cost <= ci: rows seen
		// earlier (nearer after chosen) win ties.
		pos := len(rows)
		for pos > 0 && costs[pos-1] > ci {
			pos--
		}
		if pos == k {
			continue
		}
		if len(rows) < k {
			rows, costs = append(rows, 0), append(costs, 0)
		}
		copy(rows[pos+1:], rows[pos:len(rows)-1])
		copy(costs[pos+1:], costs[pos:len(costs)-1])
		rows[pos], costs[pos] = i, ci
	}
	out := make([]*fleet.Worker, len(rows))
	for x, i := range rows {
		out[x] = at(i)
	}
	return out
}

// fill sets the rows of c to the members of the partition and computes
// the inputs in (normalised) of each; c has their columns. One pass per
// column: the CAPACITY column is the partition's, copied; CACHE fills
// OverlapBlocks and, when c has it, CPUOverlapBlocks in one pass
// (prefix.Index.FillTiersAt).
func (r *Router) fill(c *shared.Candidates, in shared.Inputs, req *shared.Request, part *fleet.Partition) {
	copy(c.IDs, part.IDs)
	if c.DPRanks != nil {
		copy(c.DPRanks, part.DPRanks)
	}
	if in.Has(shared.InputActiveRequests) {
		active := c.ActiveRequests[:len(part.Workers)]
		for i, w := range part.Workers {
			active[i] = w.ActiveRequests()
		}
	}
	if in.Has(shared.InputLoad) {
		fleet.FillLoads(part.Workers, c.Load, r.bookingsAreLoad)
	}
	if in.Has(shared.InputCapacity) {
		copy(c.TotalKVBlocks, part.KVBlocks)
	}
	if in.Has(shared.InputLabels) {
		if len(part.Names) == len(part.Workers) {
			copy(c.Names, part.Names)
			copy(c.Labels, part.Labels)
		} else { // a narrowed partition (narrow) has no such columns
			for i, w := range part.Workers {
				c.Names[i], c.Labels[i] = w.Name, w.AllLabels
			}
		}
	}
	if in.Has(shared.InputCache) {
		r.index.FillTiersAt(part.Slots, req.BlockHashes, r.sizeOf(req), req.Prompt, c.OverlapBlocks, c.CPUOverlapBlocks)
	}
	if in.Has(shared.InputLatency) {
		// LATENCY implies LOAD and CACHE (resolveOne): one pass over the
		// filled columns, a few nanoseconds per row.
		bs := r.sizeOf(req)
		f := r.features(req, &shared.Load{}, 0, bs)
		preds, kv := part.Predictors, part.KVTokens
		for i := range part.Workers {
			var m *predict.Model
			if len(preds) == len(part.Workers) {
				m, f.Capacity = preds[i], float64(kv[i])
			} else { // a narrowed partition (narrow) has no such columns
				w := part.Workers[i]
				m, f.Capacity = w.Predictor, float64(w.KVTokens)
			}
			l := &c.Load[i]
			if req.Role != shared.RoleDecode {
				f.Uncached = float64(max(req.PromptTokens-int(c.OverlapBlocks[i])*bs, 0))
			}
			f.Prefill, f.Context, f.Active = float64(l.ActivePrefillTokens), float64(l.ActiveDecodeBlocks*int64(bs)), float64(l.ActiveRequests)
			p := r.models.Predict(m, &f)
			c.PredictedTTFT[i], c.PredictedTPOT[i] = p.TTFT, p.TPOT
		}
	}
}

func rank(c *shared.Candidates, row int) uint32 {
	if c.DPRanks == nil {
		return 0
	}
	return c.DPRanks[row]
}

// locate returns the partition row of (id, rank) by binary search.
func locate(p *fleet.Partition, id shared.WorkerID, rank uint32) int {
	lo, hi := 0, len(p.Workers)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		w := p.Workers[m]
		if w.ID < id || (w.ID == id && w.DPRank < rank) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// begin is what Place and Bind do first: it checks ctx, gives req the
// Router's block size when it has none (ErrBlockSize when negative),
// enters the current bundle (ErrClosed when there is none) and checks that
// req's role has a policy there (ErrNoPolicy). On success the caller
// releases the bundle (b.release(stripe)); on error nothing is held.
func (r *Router) begin(ctx context.Context, req *shared.Request) (b *Bundle, stripe int, err error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if req.BlockSize == 0 {
		req.BlockSize = r.blockSize
	} else if req.BlockSize < 0 {
		return nil, 0, fmt.Errorf("%w: request block size %d, want > 0", ErrBlockSize, req.BlockSize)
	}
	b, stripe = r.acquire()
	if b == nil {
		return nil, 0, ErrClosed
	}
	if b.roles[req.Role] == nil {
		b.release(stripe)
		return nil, 0, fmt.Errorf("%w %q", ErrNoPolicy, req.Role)
	}
	return b, stripe, nil
}

// learning reports whether decisions keep a Sample: Options.Predict, or
// a policy of the current bundle declares LATENCY.
func (r *Router) learning() bool {
	return r.alwaysLearn || r.ReadsLatency()
}

// features is what the predictor knows of req on a worker with load l
// and overlap blocks of bs tokens (predict.Features): the expected output
// is the request's max_tokens, else the learned mean.
func (r *Router) features(req *shared.Request, l *shared.Load, overlap, bs int) predict.Features {
	uncached := 0
	if req.Role != shared.RoleDecode {
		uncached = max(req.PromptTokens-overlap*bs, 0)
	}
	out := float64(req.MaxTokens)
	if out <= 0 {
		out = r.models.ExpectedOutput()
	}
	return predict.Features{
		Uncached: float64(uncached), Prompt: float64(req.PromptTokens), Output: out,
		Prefill: float64(l.ActivePrefillTokens), Context: float64(l.ActiveDecodeBlocks * int64(bs)),
		Active: float64(l.ActiveRequests),
	}
}

// classOf is the predictor class of a worker: its shared.LabelClass
// label, else the worker alone (its name, or its id and rank).
func classOf(s *fleet.Spec) string {
	if c, ok := s.Labels[shared.LabelClass]; ok && c != "" {
		return "class:" + c
	}
	if s.Name != "" {
		return "worker:" + s.Name
	}
	return fmt.Sprintf("worker:%d/%d", s.ID, s.DPRank)
}

// Predictor is the Router's latency predictor: its models and their
// accuracy (predict.Set.Accuracy).
func (r *Router) Predictor() *predict.Set { return r.models }

// ObserveFirstToken teaches the predictor a decision's first token, ttft
// after its dispatch. It does nothing for a decision without a sample
// (Decision.Learn false).
func (r *Router) ObserveFirstToken(d *Decision, ttft time.Duration) {
	if d.Learn {
		r.models.ObserveTTFT(&d.Sample, ttft.Seconds())
	}
}

// ObserveEnd teaches the predictor a decision's completed answer of
// outputTokens generated tokens whose tokens after the first came gap
// apart on average (0 when fewer than two tokens or no first token was
// seen). It does nothing for a decision without a sample.
func (r *Router) ObserveEnd(d *Decision, outputTokens int64, gap time.Duration) {
	if d.Learn {
		r.models.ObserveEnd(&d.Sample, outputTokens, gap.Seconds())
	}
}

// PredictTTFT is the smallest predicted TTFT of req among the workers of
// its model and role, its uncached prompt on each as the index believes:
// what a queue ordering by slack takes as the request's own service time.
// 0 when the predictor is untrained or no worker serves the request.
// O(workers): call it once per request, not per queue operation.
func (r *Router) PredictTTFT(req *shared.Request) time.Duration {
	part, err := r.partition(req)
	if err != nil || len(part.Workers) == 0 {
		return 0
	}
	bs := r.sizeOf(req)
	best := math.Inf(1)
	var l shared.Load
	for _, w := range part.Workers {
		w.LoadInto(&l, true)
		overlap := r.index.OverlapAt(prefix.Candidate{ID: w.ID, Rank: w.DPRank}, req.BlockHashes, bs, req.Prompt)
		f := r.features(req, &l, overlap, bs)
		f.Capacity = float64(w.KVTokens)
		if p := r.models.Predict(w.Predictor, &f); p.Trained {
			best = min(best, p.TTFT)
		}
	}
	if math.IsInf(best, 1) {
		return 0
	}
	return time.Duration(best * float64(time.Second))
}

// ReadsLatency reports whether a policy of the current bundle declares
// LATENCY: the predictions are read, not only learned from.
func (r *Router) ReadsLatency() bool {
	b := r.cur.Load()
	return b != nil && b.latency
}
