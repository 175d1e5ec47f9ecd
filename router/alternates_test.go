package router

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

func ids(ws []*fleet.Worker) []shared.WorkerID {
	out := make([]shared.WorkerID, len(ws))
	for i, w := range ws {
		out[i] = w.ID
	}
	return out
}

// TestAlternatesRankByCost: with a scorer, the runners-up are the other
// candidates by ascending cost. Worker 3 holds the prompt's prefix and is
// chosen; of the others, 1 has two requests in flight, 2 one and 4 none,
// so kv-cost ranks 4, 2, 1.
func TestAlternatesRankByCost(t *testing.T) {
	r := newRouter(t, kvPolicy(t), 4)
	ctx := context.Background()
	prompt := func() *shared.Request { return request(40, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10) }
	// Prime worker 3 with the prefix, then load 1 and 2.
	primer, err := r.Bind(ctx, prompt(), Binding{Worker: 3})
	if err != nil {
		t.Fatal(err)
	}
	primer.Booking.Release()
	for _, id := range []shared.WorkerID{1, 1, 2} {
		if _, err := r.Place(ctx, request(400, uint64(100+id)), Placement{Target: id, HasTarget: true}); err != nil {
			t.Fatal(err)
		}
	}
	d, err := r.Place(ctx, prompt(), Placement{Alternates: 3})
	if err != nil {
		t.Fatal(err)
	}
	if d.Worker.ID != 3 {
		t.Fatalf("chose worker %d, want 3 (the prefix holder)", d.Worker.ID)
	}
	if got, want := ids(d.Alternates), []shared.WorkerID{4, 2, 1}; !slices.Equal(got, want) {
		t.Fatalf("alternates %v, want %v", got, want)
	}
	d.Booking.Release()
	d, err = r.Place(ctx, prompt(), Placement{Alternates: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(d.Alternates), []shared.WorkerID{4, 2}; !slices.Equal(got, want) {
		t.Fatalf("two alternates %v, want %v", got, want)
	}
	d, err = r.Place(ctx, prompt(), Placement{})
	if err != nil || d.Alternates != nil {
		t.Fatalf("no alternates asked: %v, %v", d.Alternates, err)
	}
}

// TestAlternatesHosted: hosted round-robin's runners-up are its next
// picks in order; hosted least-loaded's are ranked by requests in flight.
func TestAlternatesHosted(t *testing.T) {
	ctx := context.Background()
	r := newRouter(t, mustPolicy(t, "rr", nil, builtin.NewRoundRobin()), 4)
	var got [][]shared.WorkerID
	for range 2 {
		d, err := r.Place(ctx, request(8, 1), Placement{Alternates: 5})
		if err != nil {
			t.Fatal(err)
		}
		if !d.Hosted {
			t.Fatal("round-robin should run hosted")
		}
		got = append(got, append([]shared.WorkerID{d.Worker.ID}, ids(d.Alternates)...))
	}
	if want := [][]shared.WorkerID{{1, 2, 3, 4}, {2, 3, 4, 1}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("round-robin picks and alternates %v, want %v (3 alternates at most of 4 workers)", got, want)
	}

	r = newRouter(t, mustPolicy(t, "ll", nil, builtin.NewLeastLoaded(shared.Params{builtin.ParamSeed: int64(1)})), 4)
	if !r.Hosted(shared.RoleAggregated) {
		t.Fatal("least-loaded should run hosted (it declares only ACTIVE_REQUESTS)")
	}
	for _, id := range []shared.WorkerID{1, 1, 1, 2, 2, 4} {
		if _, err := r.Place(ctx, request(8, uint64(id)), Placement{Target: id, HasTarget: true}); err != nil {
			t.Fatal(err)
		}
	}
	d, err := r.Place(ctx, request(8, 9), Placement{Alternates: 3})
	if err != nil {
		t.Fatal(err)
	}
	if d.Worker.ID != 3 {
		t.Fatalf("least-loaded chose %d, want 3 (idle)", d.Worker.ID)
	}
	if got, want := ids(d.Alternates), []shared.WorkerID{4, 2, 1}; !slices.Equal(got, want) {
		t.Fatalf("least-loaded alternates %v, want %v", got, want)
	}
}

// TestBind: a bound worker that is not a member fails instead of running
// the policy; an advisory target that is not a candidate lets the policy
// decide.
func TestBind(t *testing.T) {
	r := newRouter(t, mustPolicy(t, "rr", nil, builtin.NewRoundRobin()), 2)
	ctx := context.Background()
	d, err := r.Bind(ctx, request(8, 1), Binding{Worker: 2})
	if err != nil || d.Worker.ID != 2 || !d.Target {
		t.Fatalf("target 2: %+v, %v", d.Worker, err)
	}
	if _, err := r.Bind(ctx, request(8, 1), Binding{Worker: 9}); !errors.Is(err, ErrAllExcluded) {
		t.Fatalf("absent binding target: %v, want ErrAllExcluded", err)
	}
	if d, err := r.Place(ctx, request(8, 1), Placement{Target: 9, HasTarget: true}); err != nil || d.Target {
		t.Fatalf("absent advisory target: %+v, %v; want a policy decision", d, err)
	}
}

// TestTargetRank: a target with a data-parallel rank is that rank's
// member; without one, the id's lowest rank; a rank the id lacks is not
// a candidate.
func TestTargetRank(t *testing.T) {
	r := newRouter(t, mustPolicy(t, "rr", nil, builtin.NewRoundRobin()), 1)
	for rank := range uint32(4) {
		if _, err := r.AddWorker(fleet.Spec{ID: 7, DPRank: rank, DataParallel: true, Role: shared.RoleAggregated, TotalKVBlocks: 100}); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	for _, rank := range []uint32{2, 0, 3} {
		d, err := r.Bind(ctx, request(8, 1), Binding{Worker: 7, Rank: rank, HasRank: true})
		if err != nil || d.Worker.ID != 7 || d.Worker.DPRank != rank {
			t.Fatalf("target 7 rank %d: %+v, %v", rank, d.Worker, err)
		}
		d.Booking.Release()
	}
	if d, err := r.Bind(ctx, request(8, 1), Binding{Worker: 7}); err != nil || d.Worker.DPRank != 0 {
		t.Fatalf("target 7 without a rank: %+v, %v; want rank 0", d.Worker, err)
	}
	if _, err := r.Bind(ctx, request(8, 1), Binding{Worker: 7, Rank: 4, HasRank: true}); !errors.Is(err, ErrAllExcluded) {
		t.Fatalf("rank 4 of a 4-rank worker: %v, want ErrAllExcluded", err)
	}
	if d, err := r.Bind(ctx, request(8, 1), Binding{Worker: 1, Rank: 0, HasRank: true}); err != nil || d.Worker.ID != 1 {
		t.Fatalf("rank 0 of a worker without ranks: %+v, %v", d.Worker, err)
	}
}

// TestTargetBooksUncachedPromptInPreciseMode: a target placement (no
// policy ran, so the overlap is looked up while booking) on a worker whose
// KV events are live charges the prompt's uncached tokens as prefill. The
// request's own blocks, added in flight by the same booking, must not
// count as held: they did, and a target booking charged no prefill.
func TestTargetBooksUncachedPromptInPreciseMode(t *testing.T) {
	r := newRouter(t, mustPolicy(t, "rr", nil, builtin.NewRoundRobin()), 2)
	p := r.Prefix().Precise(prefix.Candidate{ID: 2})
	p.KeyByEngineHashes()
	p.MarkLive()
	// The engine's first event (of another prompt) sets its block size.
	p.Apply(&kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: prefix.ChainHashes(nil, []uint64{99}), BlockSize: 4}}})
	req := request(8, 1, 2)
	req.Prompt = &prefix.HashKey{Hashes: req.BlockHashes, BlockSize: 4}
	d, err := r.Bind(context.Background(), req, Binding{Worker: 2})
	if err != nil {
		t.Fatal(err)
	}
	if d.OverlapBlocks != 0 {
		t.Errorf("overlap %d blocks, want 0: the worker held nothing", d.OverlapBlocks)
	}
	if got := d.Worker.Load(true).ActivePrefillTokens; got != 8 {
		t.Errorf("active prefill %d tokens, want the whole 8-token prompt", got)
	}
	d.Booking.Release()
	if got := d.Worker.Load(true).ActivePrefillTokens; got != 0 {
		t.Errorf("active prefill %d tokens after the release, want 0", got)
	}
}

// TestRunnersUp works the ranking by hand: ties keep row order after the
// chosen row, wrapping around.
func TestRunnersUp(t *testing.T) {
	ws := make([]*fleet.Worker, 6)
	for i := range ws {
		ws[i] = &fleet.Worker{Spec: fleet.Spec{ID: shared.WorkerID(i)}}
	}
	at := func(i int) *fleet.Worker { return ws[i] }
	costs := []float64{5, 1, 9, 1, 0, 5}
	cost := func(i int) float64 { return costs[i] }
	for _, tc := range []struct {
		chosen, k int
		cost      func(int) float64
		want      []shared.WorkerID
	}{
		{chosen: 4, k: 3, cost: cost, want: []shared.WorkerID{1, 3, 5}}, // 1 and 3 tie at 1: 1 comes first after 4 (5, 0, 1, ...); 5 before 0 at 5
		{chosen: 4, k: 5, cost: cost, want: []shared.WorkerID{1, 3, 5, 0, 2}},
		{chosen: 2, k: 2, cost: cost, want: []shared.WorkerID{4, 3}},
		{chosen: 4, k: 3, want: []shared.WorkerID{5, 0, 1}},
		{chosen: 0, k: 9, want: []shared.WorkerID{1, 2, 3, 4, 5}},
		{chosen: 0, k: 0, want: []shared.WorkerID{}},
	} {
		got := ids(runnersUp(len(ws), tc.chosen, tc.k, tc.cost, at))
		if !slices.Equal(got, tc.want) {
			t.Errorf("chosen %d, k %d, costs %v: %v, want %v", tc.chosen, tc.k, tc.cost != nil, got, tc.want)
		}
	}
}
