package router

import (
	"context"
	"fmt"

	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/pipeline"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// Explanation is a dry run of Place (Explain): where the request would go
// now and why, with every candidate's inputs.
type Explanation struct {
	// Policy is the policy that decided (the fallback's when Fallback),
	// or the role's when none could; Hosted, Fallback, FallbackCause and
	// Target are Decision's.
	Policy        string
	Hosted        bool
	Fallback      bool
	FallbackCause error
	Target        bool
	// Canary is true when the role's policy has a canary whose
	// candidate takes this request (Canary.Candidate): Policy and the
	// choice are then the candidate's, as Place's would be.
	Canary bool
	// Worker is the member Place would choose; nil when Err is set.
	// OverlapBlocks is the leading blocks of the request the index
	// believes it holds (CACHE, in the request's blocks).
	Worker        *fleet.Worker
	OverlapBlocks int
	// Err is the error Place would return (ErrNoPolicy,
	// shared.ErrNoWorkers, ErrAllExcluded, shared.ErrAllBusy when every
	// candidate is at Placement.Capacity (Place's caller would queue the
	// request), shared.ErrAllFiltered, a component's error, ErrClosed or
	// ctx's); nil when Worker is set.
	Err error
	// Candidates are the members of the request's model and role, in
	// ascending (ID, DPRank) order, with their inputs; nil when there
	// are none.
	Candidates []CandidateExplanation
}

// CandidateExplanation is one member in an Explanation.
type CandidateExplanation struct {
	Worker *fleet.Worker
	// ActiveRequests, Load and TotalKVBlocks are the inputs as the policy
	// would read them (ACTIVE_REQUESTS, LOAD, CAPACITY), whichever it
	// declares.
	ActiveRequests int64
	Load           shared.Load
	TotalKVBlocks  int64
	// OverlapBlocks is CACHE (prefix.Index.FillAt, the request's blocks);
	// Belief what the index believes the member holds of the prompt,
	// precise (GPU and CPU tiers, when its precise index is live and the
	// request has token ids) and approximate, in tokens.
	OverlapBlocks int32
	Belief        prefix.Belief
	// Excluded is why the member was no candidate at all: "exclude"
	// (Placement.Exclude) or "capacity" (at Placement.Capacity); "" for
	// a candidate.
	Excluded string
	// FilteredBy names the filter (or fused run of plugin members) that
	// left the candidate out; "" when none did.
	FilteredBy string
	// Costs are the weighted costs each scorer added, in the policy's
	// order; Cost is their sum, the picker's input (HasCost false when
	// the candidate was not scored).
	Costs   []ScorerCost
	Cost    float64
	HasCost bool
	// Chosen is true for Worker.
	Chosen bool
}

// ScorerCost is one scorer's weighted cost of one candidate.
type ScorerCost struct {
	Scorer string
	Cost   float64
}

// Explain runs the selection Place would run for req with pl, as a dry
// run: the same partition, exclusions, capacity, target and policy
// (filters, scorers and picker over the same inputs, the fallback when
// Place would take it), and returns the decision and every candidate's
// inputs without booking anything, recording anything in the prefix
// index, counting a fallback or running the policy's shadow. The
// components themselves run as for a decision, so a stateful one moves as
// it would (a round-robin picker's cursor, a seeded picker's draws); the
// context is marked as a shadow decision's (pipeline.WithShadow), so a
// plugin failing it does not count toward its circuit breaker.
// req.BlockSize 0 is set to the router's default, as Place does. Work is
// Place's plus O(candidates) per policy stage and one index lookup per
// member.
func (r *Router) Explain(ctx context.Context, req *shared.Request, pl Placement) Explanation {
	var ex Explanation
	if err := ctx.Err(); err != nil {
		ex.Err = err
		return ex
	}
	if req.BlockSize == 0 {
		req.BlockSize = r.blockSize
	} else if req.BlockSize < 0 {
		ex.Err = fmt.Errorf("%w: request block size %d, want > 0", ErrBlockSize, req.BlockSize)
		return ex
	}
	b, stripe := r.acquire()
	if b == nil {
		ex.Err = ErrClosed
		return ex
	}
	defer b.release(stripe)
	rp := b.roles[req.Role]
	if rp == nil {
		ex.Err = fmt.Errorf("%w %q", ErrNoPolicy, req.Role)
		return ex
	}
	if c := rp.canary; c != nil && c.Candidate(req) {
		rp, ex.Canary = c.cand, true
	}
	ex.Policy = rp.policy.Name
	part := r.fleet.Snapshot().ModelPartition(req.Model, req.Role)
	if part == nil || len(part.Workers) == 0 {
		if req.Model != "" {
			ex.Err = fmt.Errorf("model %q, role %s: %w", req.Model, req.Role, shared.ErrNoWorkers)
		} else {
			ex.Err = fmt.Errorf("role %s: %w", req.Role, shared.ErrNoWorkers)
		}
		return ex
	}
	r.explainInputs(&ex, req, part)
	if len(pl.Exclude) > 0 || len(pl.Failed) > 0 {
		kept := excluding(part, pl.Exclude, pl.Failed)
		markExcluded(&ex, kept, "exclude")
		if part = kept; part == nil {
			ex.Err = fmt.Errorf("role %s: %w", req.Role, ErrAllExcluded)
			return ex
		}
	}
	if pl.Capacity > 0 {
		kept := underCapacity(part, pl.Capacity)
		markExcluded(&ex, kept, "capacity")
		if part = kept; part == nil {
			ex.Err = fmt.Errorf("role %s: %w", req.Role, shared.ErrAllBusy)
			return ex
		}
	}
	if pl.HasTarget {
		if i, ok := targetRow(part, pl.Target, 0, false); ok {
			ex.Policy, ex.Target = "target", true
			r.explainChosen(&ex, req, part.Workers[i], -1)
			return ex
		}
	}
	ctx = pipeline.WithShadow(ctx)
	var tr pipeline.Trace
	w, overlap, err := r.explainDecide(ctx, rp, req, part, &ex, &tr)
	if err != nil && rp.fallback != nil && fallbackAllowed(ctx, err) {
		ex.Policy, ex.Fallback, ex.FallbackCause = rp.fallback.policy.Name, true, err
		ex.Hosted = false
		w, overlap, err = r.explainDecide(ctx, rp.fallback, req, part, &ex, &tr)
	}
	r.applyTrace(&ex, &tr)
	if err != nil {
		ex.Err = fmt.Errorf("policy %q: %w", ex.Policy, err)
		return ex
	}
	r.explainChosen(&ex, req, w, overlap)
	return ex
}

// explainInputs sets ex.Candidates to part's members with all their
// inputs. Read-only.
func (r *Router) explainInputs(ex *Explanation, req *shared.Request, part *fleet.Partition) {
	bs := r.sizeOf(req)
	overlap := make([]int32, len(part.Workers))
	r.index.FillAt(part.Slots, req.BlockHashes, bs, req.Prompt, overlap)
	ex.Candidates = make([]CandidateExplanation, len(part.Workers))
	for i, w := range part.Workers {
		c := &ex.Candidates[i]
		c.Worker, c.ActiveRequests, c.TotalKVBlocks, c.OverlapBlocks = w, w.ActiveRequests(), part.KVBlocks[i], overlap[i]
		w.LoadInto(&c.Load, r.bookingsAreLoad)
		c.Belief = r.index.BeliefAt(prefix.Candidate{ID: w.ID, Rank: w.DPRank}, req.BlockHashes, bs, req.Prompt)
	}
}

// markExcluded marks the candidates of ex not in kept (nil: none kept)
// as excluded for why, unless they already are.
func markExcluded(ex *Explanation, kept *fleet.Partition, why string) {
	for i := range ex.Candidates {
		c := &ex.Candidates[i]
		if c.Excluded != "" {
			continue
		}
		if kept == nil || !member(kept, c.Worker) {
			c.Excluded = why
		}
	}
}

// member reports whether w's (ID, rank) is in p.
func member(p *fleet.Partition, w *fleet.Worker) bool {
	i := locate(p, w.ID, w.DPRank)
	return i < len(p.Workers) && p.Workers[i].ID == w.ID && p.Workers[i].DPRank == w.DPRank
}

// explainDecide is decide itself, without a shadow, alternates or a
// fallback count, tracing a compiled policy's stages in tr.
func (r *Router) explainDecide(ctx context.Context, rp *rolePolicy, req *shared.Request, part *fleet.Partition, ex *Explanation, tr *pipeline.Trace) (*fleet.Worker, int, error) {
	var d Decision
	w, overlap, err := r.decide(ctx, rp, req, part, &d, nil, 0, tr)
	if d.Hosted {
		ex.Hosted = true
	}
	return w, overlap, err
}

// applyTrace sets each candidate's filter and costs from tr.
func (r *Router) applyTrace(ex *Explanation, tr *pipeline.Trace) {
	at := make(map[pipeline.Candidate]*CandidateExplanation, len(ex.Candidates))
	for i := range ex.Candidates {
		c := &ex.Candidates[i]
		at[pipeline.Candidate{ID: c.Worker.ID, Rank: c.Worker.DPRank}] = c
	}
	for _, st := range tr.Stages {
		for _, k := range st.Dropped {
			if c := at[k]; c != nil && c.FilteredBy == "" {
				c.FilteredBy = st.Name
			}
		}
		for j, k := range st.Scored {
			if c := at[k]; c != nil {
				c.Costs = append(c.Costs, ScorerCost{Scorer: st.Name, Cost: st.Costs[j]})
				c.Cost += st.Costs[j]
				c.HasCost = true
			}
		}
	}
}

// explainChosen sets w as ex's choice, its overlap (overlap < 0: the
// index's, as book looks it up).
func (r *Router) explainChosen(ex *Explanation, req *shared.Request, w *fleet.Worker, overlap int) {
	ex.Worker = w
	for i := range ex.Candidates {
		c := &ex.Candidates[i]
		if c.Worker.ID == w.ID && c.Worker.DPRank == w.DPRank {
			c.Chosen = true
			if overlap < 0 {
				overlap = int(c.OverlapBlocks)
			}
		}
	}
	ex.OverlapBlocks = max(overlap, 0)
}
