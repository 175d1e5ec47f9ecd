package router

import (
	"context"
	"errors"
	"testing"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// fleetState is what a selection can change: every member's load and
// prefix-index entries, and the fallbacks counted.
type fleetState struct {
	loads     map[shared.WorkerID]shared.Load
	index     map[shared.WorkerID]int
	fallbacks int64
}

func stateOf(r *Router) fleetState {
	s := fleetState{loads: map[shared.WorkerID]shared.Load{}, index: map[shared.WorkerID]int{}, fallbacks: r.Fallbacks()}
	for _, w := range r.Workers("", shared.RoleAggregated) {
		s.loads[w.ID] = w.Load(true)
		s.index[w.ID] = r.Prefix().Len(prefix.Candidate{ID: w.ID, Rank: w.DPRank})
	}
	return s
}

func (s fleetState) equal(o fleetState) bool {
	if s.fallbacks != o.fallbacks || len(s.loads) != len(o.loads) {
		return false
	}
	for id, l := range s.loads {
		if o.loads[id] != l || o.index[id] != s.index[id] {
			return false
		}
	}
	return true
}

// busyKVPolicy is the default policy behind a busy filter of one request
// per worker: filter "busy", scorer "cost" (kv-cost), picker min-cost.
func busyKVPolicy(t *testing.T) *policy.Policy {
	t.Helper()
	p := kvPolicy(t)
	busy, err := builtin.NewBusy(shared.Params{builtin.ParamMaxActiveRequests: int64(1)})
	if err != nil {
		t.Fatal(err)
	}
	p.Filters = []policy.NamedFilter{{Name: "busy", Filter: busy}}
	return p
}

// Explain decides as Place would, without booking or recording: by hand,
// a 10-block prompt of 4-token blocks placed on worker X makes X hold
// all 10 blocks; an 11-block follow-up is explained on X with 10 blocks
// of overlap and the lowest cost (kv-cost: (44 / 4 - 10) = 1 for X, 11
// for the others), and explaining it twice changes no load, no index
// entry, no fallback count; Place then chooses X too. X busy (one
// request in flight): the busy filter drops it and the cost ranks the
// others; at capacity or excluded it is no candidate, and says why.
func TestExplainIsPlaceWithoutSideEffects(t *testing.T) {
	r := newRouter(t, busyKVPolicy(t), 3)
	ctx := context.Background()
	first, err := r.Place(ctx, request(40, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16), Placement{})
	if err != nil {
		t.Fatal(err)
	}
	first.Booking.PrefillDone()
	first.Booking.Release()
	x := first.Worker.ID
	follow := func() *shared.Request { return request(44, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 99) }

	before := stateOf(r)
	var ex Explanation
	for range 2 {
		ex = r.Explain(ctx, follow(), Placement{})
		if ex.Err != nil || ex.Worker == nil || ex.Worker.ID != x || ex.OverlapBlocks != 10 || ex.Policy != "kv" || ex.Hosted || ex.Fallback {
			t.Fatalf("explanation %+v, want worker %d with 10 blocks by policy kv", ex, x)
		}
	}
	if after := stateOf(r); !after.equal(before) {
		t.Fatalf("explaining changed the fleet: before %+v, after %+v", before, after)
	}
	if len(ex.Candidates) != 3 {
		t.Fatalf("%d candidates, want 3", len(ex.Candidates))
	}
	for _, c := range ex.Candidates {
		want := 11.0
		overlap := int32(0)
		if c.Worker.ID == x {
			want, overlap = 1, 10
		}
		if !c.HasCost || c.Cost != want || len(c.Costs) != 1 || c.Costs[0] != (ScorerCost{Scorer: "cost", Cost: want}) ||
			c.OverlapBlocks != overlap || c.Belief.ApproxTokens != int(overlap)*4 || c.FilteredBy != "" || c.Excluded != "" ||
			c.Chosen != (c.Worker.ID == x) {
			t.Errorf("candidate %d: %+v, want cost %v and %d blocks of overlap", c.Worker.ID, c, want, overlap)
		}
	}
	d, err := r.Place(ctx, follow(), Placement{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Worker.ID != x || d.OverlapBlocks != ex.OverlapBlocks {
		t.Fatalf("Place chose %d with %d blocks, Explain %d with %d", d.Worker.ID, d.OverlapBlocks, x, ex.OverlapBlocks)
	}

	// X now has a request in flight: the busy filter drops it.
	ex = r.Explain(ctx, follow(), Placement{})
	if ex.Err != nil || ex.Worker == nil || ex.Worker.ID == x {
		t.Fatalf("X busy: %+v, want another worker", ex)
	}
	for _, c := range ex.Candidates {
		if c.Worker.ID == x && (c.FilteredBy != "busy" || c.HasCost || c.Chosen || c.ActiveRequests != 1) {
			t.Errorf("X busy: %+v, want filtered by busy, not scored, one request in flight", c)
		}
	}
	// At capacity, or excluded: no candidate, and why.
	ex = r.Explain(ctx, follow(), Placement{Capacity: 1})
	for _, c := range ex.Candidates {
		if (c.Worker.ID == x) != (c.Excluded == "capacity") {
			t.Errorf("capacity 1: candidate %d excluded %q", c.Worker.ID, c.Excluded)
		}
	}
	ex = r.Explain(ctx, follow(), Placement{Exclude: []shared.WorkerID{x}})
	for _, c := range ex.Candidates {
		if (c.Worker.ID == x) != (c.Excluded == "exclude") {
			t.Errorf("exclude X: candidate %d excluded %q", c.Worker.ID, c.Excluded)
		}
	}
	d.Booking.Release()
}

// Explain's errors are Place's: a model nobody serves, every candidate
// filtered (each naming the filter), every candidate at capacity (Place's
// caller would queue). A failing policy's fallback decides, as in Place,
// without counting a fallback.
func TestExplainErrorsAndFallback(t *testing.T) {
	r := newRouter(t, busyKVPolicy(t), 2)
	ctx := context.Background()
	req := request(8, 1, 2)
	req.Model = "nobody"
	if ex := r.Explain(ctx, req, Placement{}); !errors.Is(ex.Err, shared.ErrNoWorkers) || ex.Worker != nil {
		t.Errorf("model nobody serves: %+v", ex)
	}
	var held []Decision
	for range 2 {
		d, err := r.Place(ctx, request(8, 1, 2), Placement{})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, d)
	}
	ex := r.Explain(ctx, request(8, 1, 2), Placement{})
	if !errors.Is(ex.Err, shared.ErrAllFiltered) || ex.Worker != nil {
		t.Errorf("every worker busy: %+v, want ErrAllFiltered", ex)
	}
	for _, c := range ex.Candidates {
		if c.FilteredBy != "busy" {
			t.Errorf("candidate %d filtered by %q, want busy", c.Worker.ID, c.FilteredBy)
		}
	}
	if ex := r.Explain(ctx, request(8, 1, 2), Placement{Capacity: 1}); !errors.Is(ex.Err, shared.ErrAllBusy) {
		t.Errorf("every worker at capacity: %v, want ErrAllBusy", ex.Err)
	}
	for _, d := range held {
		d.Booking.Release()
	}

	p := mustPolicy(t, "broken", nil, failing{})
	p.Fallback = mustPolicy(t, "least-loaded", nil, builtin.NewLeastLoaded(shared.Params{builtin.ParamSeed: int64(3)}))
	r = newRouter(t, p, 2)
	ex = r.Explain(ctx, request(4, 1), Placement{})
	if ex.Err != nil || !ex.Fallback || ex.Policy != "least-loaded" || ex.FallbackCause == nil || ex.Worker == nil || r.Fallbacks() != 0 {
		t.Errorf("fallback: %+v, fallbacks %d", ex, r.Fallbacks())
	}
}

// The precise belief Explain reports is the index's, per tier, for a
// live precise candidate: by hand, worker 1's engine stored the blocks
// [0 1 2 3] and [4 5 6 7] on GPU and [8 9 10 11] on CPU (4-token blocks),
// so of the 12-token prompt 0..11 it holds 8 tokens on GPU and the next
// 4 on CPU; worker 2 has no precise index.
func TestExplainPreciseBelief(t *testing.T) {
	r := newRouter(t, kvPolicy(t), 2)
	p := r.Prefix().Precise(prefix.Candidate{ID: 1})
	p.MarkLive()
	ids := make([]int64, 12)
	for i := range ids {
		ids[i] = int64(i)
	}
	p.Apply(&kvevents.Batch{Events: []kvevents.Event{
		{Kind: kvevents.BlockStored, BlockHashes: []uint64{101, 102}, TokenIDs: ids[:8], BlockSize: 4},
		{Kind: kvevents.BlockStored, BlockHashes: []uint64{103}, ParentBlockHash: 102, HasParent: true, TokenIDs: ids[8:], BlockSize: 4,
			Medium: []byte("CPU")},
	}})
	req := &shared.Request{Role: shared.RoleAggregated, PromptTokens: 12, BlockSize: 4, Prompt: &prefix.Key{IDs: ids}}
	ex := r.Explain(context.Background(), req, Placement{})
	if ex.Worker == nil || ex.Worker.ID != 1 || ex.OverlapBlocks != 2 {
		t.Fatalf("explanation %+v, want worker 1 with 2 blocks", ex)
	}
	for _, c := range ex.Candidates {
		want := prefix.Belief{Taken: true}
		if c.Worker.ID == 1 {
			want = prefix.Belief{Taken: true, Precise: true, PreciseTokens: 8, CPUTokens: 4, EngineBlockSize: 4}
		}
		if c.Belief != want {
			t.Errorf("worker %d: belief %+v, want %+v", c.Worker.ID, c.Belief, want)
		}
	}
}
