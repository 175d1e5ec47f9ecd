package router

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/switchyard-router/switchyard/hosted"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/pipeline"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// Options configure a Router.
type Options struct {
	// BlockSize is tokens per KV block for prefix hashing and LOAD
	// projection (the policy file's router.block_size); > 0.
	BlockSize int
	// Roles maps each role to its policy. A role without a policy cannot be
	// selected for (ErrNoPolicy).
	Roles map[shared.Role]*shared.Policy
	// BookingsAreLoad marks LOAD as available from the router's own bookings
	// alone, without engine metrics: true for simulated workers, whose only
	// load is what the router sent them.
	BookingsAreLoad bool
}

// Selection errors of the Router itself.
var (
	// ErrNoPolicy: a request for a role the bundle maps to no policy.
	ErrNoPolicy = errors.New("no policy for role")
	// ErrBlockSize: a request hashed at a block size other than the router's.
	ErrBlockSize = errors.New("request block size differs from the router's")
)

// Router picks a worker for each request by its role's policy and books it.
// Safe for concurrent use.
type Router struct {
	blockSize       int
	bookingsAreLoad bool
	roles           map[shared.Role]*rolePolicy
	fleet           *fleet.Fleet
	index           *prefix.Index
	scratch         sync.Pool // *pipeline.Scratch
	fallbacks       atomic.Int64
}

// rolePolicy is a policy with its hosted form or its compiled pipeline
// resolved once.
type rolePolicy struct {
	policy   *shared.Policy
	inputs   shared.Inputs
	hosted   hosted.HostedWorkerPicker // nil unless the policy is hosted-eligible
	compiled *pipeline.Compiled        // nil when hosted
	fallback *rolePolicy
}

// maxFallbackDepth bounds a chain of fallbacks (the loader rejects cycles).
const maxFallbackDepth = 8

func resolve(p *shared.Policy, depth int) (*rolePolicy, error) {
	if p == nil || depth > maxFallbackDepth {
		return nil, nil
	}
	if p.Picker == nil {
		return nil, fmt.Errorf("policy %q has no picker", p.Name)
	}
	rp := &rolePolicy{policy: p, inputs: p.Inputs()}
	rp.hosted, _ = hosted.IntoHosted(p)
	if rp.hosted == nil {
		var err error
		if rp.compiled, err = pipeline.Compile(p); err != nil {
			return nil, err
		}
	}
	var err error
	rp.fallback, err = resolve(p.Fallback, depth+1)
	return rp, err
}

// New returns a Router with an empty fleet.
func New(o Options) (*Router, error) {
	if o.BlockSize <= 0 {
		return nil, fmt.Errorf("router: block size %d, want > 0", o.BlockSize)
	}
	r := &Router{
		blockSize:       o.BlockSize,
		bookingsAreLoad: o.BookingsAreLoad,
		roles:           make(map[shared.Role]*rolePolicy, len(o.Roles)),
		fleet:           fleet.New(),
		index:           prefix.New(),
	}
	for role, p := range o.Roles {
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
		r.roles[role] = rp
	}
	r.scratch.New = func() any { return new(pipeline.Scratch) }
	return r, nil
}

// BlockSize is the router's tokens per KV block.
func (r *Router) BlockSize() int { return r.blockSize }

// Hosted reports whether role's policy runs on the hosted fast path.
func (r *Router) Hosted(role shared.Role) bool {
	rp := r.roles[role]
	return rp != nil && rp.hosted != nil
}

// AddWorker joins a worker; its prefix-index capacity is its TotalKVBlocks.
func (r *Router) AddWorker(s fleet.Spec) (*fleet.Worker, error) {
	ws, err := r.AddWorkers(s)
	if err != nil {
		return nil, err
	}
	return ws[0], nil
}

// AddWorkers joins several workers with one membership snapshot (see
// fleet.AddWorkers); each worker's prefix-index capacity is its
// TotalKVBlocks. On error none of them is a member.
func (r *Router) AddWorkers(specs ...fleet.Spec) ([]*fleet.Worker, error) {
	ws, err := r.fleet.AddWorkers(specs...)
	if err != nil {
		return nil, err
	}
	for i, s := range specs {
		if err := r.index.AddWorker(s.ID, int(s.TotalKVBlocks)); err != nil {
			for _, undo := range specs[:i+1] {
				r.index.RemoveWorker(undo.ID)
				err = errors.Join(err, r.fleet.RemoveWorker(undo.ID, undo.DPRank))
			}
			return nil, err
		}
	}
	return ws, nil
}

// RemoveWorker takes a worker out of selection and purges its prefix-index
// entries. Its in-flight requests keep their bookings until they end.
func (r *Router) RemoveWorker(id shared.WorkerID, rank uint32) error {
	if err := r.fleet.RemoveWorker(id, rank); err != nil {
		return err
	}
	r.index.RemoveWorker(id)
	return nil
}

// Fallbacks is how many selections a fallback policy answered.
func (r *Router) Fallbacks() int64 { return r.fallbacks.Load() }

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
	// Policy is the name of the policy that decided (the fallback's name when
	// Fallback is true).
	Policy string
	// Hosted is true when the hosted fast path decided.
	Hosted bool
	// Fallback is true when the role's policy failed and its fallback decided.
	Fallback bool
	// FallbackCause is the primary policy's error when Fallback is true.
	FallbackCause error
}

// Select picks a worker for req (req.Role selects the policy), books it and
// records the request's blocks in the prefix index as sent to it. A zero
// req.BlockSize is set to the router's; req.BlockHashes must have been
// hashed at that block size. Errors: ErrNoPolicy, ErrBlockSize,
// shared.ErrNoWorkers, shared.ErrAllFiltered (wrapped), the context's error,
// or the policy's error when no fallback could decide.
func (r *Router) Select(ctx context.Context, req *shared.Request) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	if req.BlockSize == 0 {
		req.BlockSize = r.blockSize
	} else if req.BlockSize != r.blockSize {
		return Decision{}, fmt.Errorf("%w: request %d, router %d", ErrBlockSize, req.BlockSize, r.blockSize)
	}
	rp := r.roles[req.Role]
	if rp == nil {
		return Decision{}, fmt.Errorf("%w %q", ErrNoPolicy, req.Role)
	}
	part := r.fleet.Snapshot().Partition(req.Role)
	if part == nil || len(part.Workers) == 0 {
		return Decision{}, fmt.Errorf("role %s: %w", req.Role, shared.ErrNoWorkers)
	}
	d := Decision{Policy: rp.policy.Name}
	w, overlap, err := r.decide(ctx, rp, req, part, &d)
	if err != nil && rp.fallback != nil && fallbackAllowed(err) {
		d = Decision{Policy: rp.fallback.policy.Name, Fallback: true, FallbackCause: err}
		w, overlap, err = r.decide(ctx, rp.fallback, req, part, &d)
		if err == nil {
			r.fallbacks.Add(1)
		}
	}
	if err != nil {
		return Decision{}, fmt.Errorf("policy %q: %w", d.Policy, err)
	}
	if overlap < 0 {
		overlap = r.index.Overlap(w.ID, req.BlockHashes)
	}
	d.Worker = w
	d.OverlapBlocks = overlap
	prefill := int64(req.PromptTokens - overlap*r.blockSize)
	if req.Role == shared.RoleDecode {
		prefill = 0 // the prompt's KV arrives from a prefill worker: nothing to prefill here
	}
	blocks := int64((req.PromptTokens + r.blockSize - 1) / r.blockSize)
	d.Booking = fleet.Book(w, prefill, blocks)
	r.index.Record(w.ID, req.BlockHashes)
	return d, nil
}

// fallbackAllowed: the fallback answers for component failures, not for
// outcomes that are the policy's answer (every candidate filtered out) or
// the caller's (cancelled).
func fallbackAllowed(err error) bool {
	return !errors.Is(err, shared.ErrAllFiltered) && !errors.Is(err, shared.ErrAllBusy) &&
		!errors.Is(err, shared.ErrNoWorkers) && !errors.Is(err, context.Canceled) &&
		!errors.Is(err, context.DeadlineExceeded)
}

// decide runs one policy over the partition and returns the chosen worker
// and, when the policy computed CACHE, its overlap (else -1).
func (r *Router) decide(ctx context.Context, rp *rolePolicy, req *shared.Request, part *fleet.Partition, d *Decision) (*fleet.Worker, int, error) {
	if rp.hosted != nil {
		var active func(int) int64
		if rp.inputs.Has(shared.InputActiveRequests) {
			active = part.ActiveAt
		}
		v := hosted.NewWorkerInputView(part.IDs, part.Key, active, r.blockSize)
		row, err := hosted.Select(rp.hosted, &v)
		if err != nil {
			return nil, -1, err
		}
		d.Hosted = true
		return part.Workers[row], -1, nil
	}
	s := r.scratch.Get().(*pipeline.Scratch)
	defer r.scratch.Put(s)
	c := s.Candidates(len(part.Workers), rp.inputs, part.DPRanks != nil)
	r.fill(c, rp.inputs, req, part)
	row, err := pipeline.Execute(ctx, rp.compiled, req, c, s)
	if err != nil {
		return nil, -1, err
	}
	w := part.Workers[locate(part, c.IDs[row], rank(c, row))]
	overlap := -1
	if c.OverlapBlocks != nil {
		overlap = int(c.OverlapBlocks[row])
	}
	return w, overlap, nil
}

// fill computes the declared inputs of every member of the partition.
func (r *Router) fill(c *shared.Candidates, in shared.Inputs, req *shared.Request, part *fleet.Partition) {
	copy(c.IDs, part.IDs)
	if c.DPRanks != nil {
		copy(c.DPRanks, part.DPRanks)
	}
	for i, w := range part.Workers {
		if c.ActiveRequests != nil {
			c.ActiveRequests[i] = w.ActiveRequests()
		}
		if c.Load != nil {
			c.Load[i] = w.Load(r.bookingsAreLoad)
		}
		if c.TotalKVBlocks != nil {
			c.TotalKVBlocks[i] = w.TotalKVBlocks
		}
	}
	if c.OverlapBlocks != nil {
		r.index.Fill(c.IDs, req.BlockHashes, c.OverlapBlocks)
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
