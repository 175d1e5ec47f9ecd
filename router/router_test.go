package router

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

func mustPolicy(t *testing.T, name string, scorers []policy.WeightedScorer, picker shared.Picker) *policy.Policy {
	t.Helper()
	return &policy.Policy{Name: name, Scorers: scorers, PickerName: "pick", Picker: picker}
}

func kvPolicy(t *testing.T) *policy.Policy {
	t.Helper()
	kv, err := builtin.NewKVCost(nil)
	if err != nil {
		t.Fatal(err)
	}
	mc, err := builtin.NewMinCost(shared.Params{builtin.ParamSeed: int64(1)})
	if err != nil {
		t.Fatal(err)
	}
	return mustPolicy(t, "kv", []policy.WeightedScorer{{Name: "cost", Weight: 1, Scorer: kv}}, mc)
}

func newRouter(t *testing.T, p *policy.Policy, workers int) *Router {
	t.Helper()
	r, err := New(Options{BlockSize: 4, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: p}, BookingsAreLoad: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range workers {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Role: shared.RoleAggregated, TotalKVBlocks: 100}); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func request(prompt int, ids ...uint64) *shared.Request {
	return &shared.Request{Role: shared.RoleAggregated, PromptTokens: prompt, BlockSize: 4, BlockHashes: prefix.ChainHashes(nil, ids)}
}

func TestHostedRoundRobinBooksAndReleases(t *testing.T) {
	r := newRouter(t, mustPolicy(t, "rr", nil, builtin.NewRoundRobin()), 3)
	if !r.Hosted(shared.RoleAggregated) {
		t.Fatal("round-robin policy should run hosted")
	}
	var got []shared.WorkerID
	var ds []Decision
	for range 6 {
		d, err := r.Place(context.Background(), request(8, 1, 2), Placement{})
		if err != nil {
			t.Fatal(err)
		}
		if !d.Hosted {
			t.Fatal("decision not hosted")
		}
		got = append(got, d.Worker.ID)
		ds = append(ds, d)
	}
	if diff := cmp.Diff([]shared.WorkerID{1, 2, 3, 1, 2, 3}, got); diff != "" {
		t.Fatalf("sequence (-want +got):\n%s", diff)
	}
	// Prompt 8 tokens = 2 blocks of 4; the first request to each worker had
	// no overlap, the second had both blocks.
	if ds[0].OverlapBlocks != 0 || ds[3].OverlapBlocks != 2 {
		t.Fatalf("overlaps = %d, %d; want 0, 2", ds[0].OverlapBlocks, ds[3].OverlapBlocks)
	}
	w := ds[0].Worker
	if l := w.Load(true); l.ActiveRequests != 2 || l.ActivePrefillTokens != 8 || l.ActiveDecodeBlocks != 4 {
		t.Fatalf("worker 1 load = %+v; want 2 active, 8 prefill tokens (first request only), 4 blocks", l)
	}
	for _, d := range ds {
		d.Booking.PrefillDone()
		d.Booking.Release()
		d.Booking.Release()
	}
	if l := w.Load(true); l.ActiveRequests != 0 || l.ActivePrefillTokens != 0 || l.ActiveDecodeBlocks != 0 {
		t.Fatalf("after release: %+v", l)
	}
}

func TestKVPolicyFollowsThePrefix(t *testing.T) {
	r := newRouter(t, kvPolicy(t), 4)
	if r.Hosted(shared.RoleAggregated) {
		t.Fatal("kv policy must not run hosted")
	}
	first, err := r.Place(context.Background(), request(40, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16), Placement{})
	if err != nil {
		t.Fatal(err)
	}
	first.Booking.PrefillDone()
	first.Booking.Release()
	// Same 10-block prefix plus one new block: the holder wins by 10 blocks
	// of prefill credit.
	d, err := r.Place(context.Background(), request(44, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 99), Placement{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Worker.ID != first.Worker.ID || d.OverlapBlocks != 10 {
		t.Fatalf("second request went to %d with overlap %d; want %d with 10", d.Worker.ID, d.OverlapBlocks, first.Worker.ID)
	}
	// Booked prefill is the uncached part only: 44 - 10*4 = 4 tokens.
	if l := d.Worker.Load(true); l.ActivePrefillTokens != 4 || l.ActiveDecodeBlocks != 11 {
		t.Fatalf("load = %+v; want 4 prefill tokens, 11 blocks", l)
	}
}

// failing is a picker that always errs, standing in for a broken component.
type failing struct{}

func (failing) Inputs() shared.Inputs { return 0 }
func (failing) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	return 0, errors.New("component broke")
}

func TestFallbackAnswersWhenThePolicyFails(t *testing.T) {
	ll := builtin.NewLeastLoaded(shared.Params{builtin.ParamSeed: int64(3)})
	fb := mustPolicy(t, "least-loaded", nil, ll)
	p := mustPolicy(t, "broken", nil, failing{})
	p.Fallback = fb
	r := newRouter(t, p, 2)
	d, err := r.Place(context.Background(), request(4, 1), Placement{})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Fallback || d.Policy != "least-loaded" || r.Fallbacks() != 1 || d.FallbackCause == nil {
		t.Fatalf("decision %+v, fallbacks %d", d, r.Fallbacks())
	}
	// Without a fallback the error surfaces, naming the policy.
	p.Fallback = nil
	r = newRouter(t, p, 2)
	if _, err := r.Place(context.Background(), request(4, 1), Placement{}); err == nil || err.Error() != `policy "broken": picker "pick": component broke` {
		t.Fatalf("err = %v", err)
	}
}

// failingWith is a picker that fails with err.
type failingWith struct{ err error }

func (failingWith) Inputs() shared.Inputs { return 0 }
func (f failingWith) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	return 0, f.err
}

// A component's error that wraps context.Canceled from a context of its
// own (a plugin's stream ending with its process) is a component failure:
// the fallback decides. Only the caller's own cancellation skips it.
func TestFallbackReadsTheCallersContext(t *testing.T) {
	ll := builtin.NewLeastLoaded(shared.Params{builtin.ParamSeed: int64(3)})
	p := mustPolicy(t, "dying", nil, failingWith{fmt.Errorf("plugin closed: %w", context.Canceled)})
	p.Fallback = mustPolicy(t, "least-loaded", nil, ll)
	r := newRouter(t, p, 2)
	d, err := r.Place(context.Background(), request(4, 1), Placement{})
	if err != nil {
		t.Fatalf("a component's own cancellation: err = %v, want the fallback's decision", err)
	}
	if !d.Fallback || d.Policy != "least-loaded" || !errors.Is(d.FallbackCause, context.Canceled) {
		t.Fatalf("decision %+v", d)
	}
	d.Booking.Release()
	ctx, cancel := context.WithCancel(context.Background())
	p2 := mustPolicy(t, "cancelling", nil, cancelling{cancel})
	p2.Fallback = mustPolicy(t, "least-loaded", nil, ll)
	r = newRouter(t, p2, 2)
	if _, err := r.Place(ctx, request(4, 1), Placement{}); !errors.Is(err, context.Canceled) || r.Fallbacks() != 0 {
		t.Fatalf("the caller cancelled during the decision: err = %v, fallbacks %d; want context.Canceled and none", err, r.Fallbacks())
	}
}

// cancelling is a picker during whose call the caller gives up.
type cancelling struct{ cancel context.CancelFunc }

func (cancelling) Inputs() shared.Inputs { return 0 }
func (c cancelling) Pick(ctx context.Context, _ *shared.Request, _ *shared.Candidates) (int, error) {
	c.cancel()
	return 0, ctx.Err()
}

func TestSelectErrors(t *testing.T) {
	r := newRouter(t, mustPolicy(t, "rr", nil, builtin.NewRoundRobin()), 0)
	if _, err := r.Place(context.Background(), request(4, 1), Placement{}); !errors.Is(err, shared.ErrNoWorkers) {
		t.Fatalf("no workers: err = %v", err)
	}
	req := request(4, 1)
	req.Role = shared.RoleDecode
	if _, err := r.Place(context.Background(), req, Placement{}); !errors.Is(err, ErrNoPolicy) {
		t.Fatalf("no policy: err = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.Place(ctx, request(4, 1), Placement{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: err = %v", err)
	}
	req = request(4, 1)
	req.BlockSize = -16
	if _, err := r.Place(context.Background(), req, Placement{}); !errors.Is(err, ErrBlockSize) {
		t.Fatalf("negative block size: err = %v", err)
	}
	if _, err := New(Options{BlockSize: 0}); err == nil {
		t.Fatal("block size 0 accepted")
	}
}

func TestRemoveWorkerLeavesSelection(t *testing.T) {
	r := newRouter(t, kvPolicy(t), 2)
	d, err := r.Place(context.Background(), request(8, 1, 2), Placement{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.RemoveWorker(d.Worker.ID, 0); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		d2, err := r.Place(context.Background(), request(8, 1, 2), Placement{})
		if err != nil {
			t.Fatal(err)
		}
		if d2.Worker.ID == d.Worker.ID {
			t.Fatal("removed worker selected")
		}
	}
	d.Booking.Release() // in flight on the removed worker; must not panic or go negative
	if got := d.Worker.ActiveRequests(); got != 0 {
		t.Fatalf("removed worker count = %d", got)
	}
}

// spy is a scorer that declares a fixed input set and records which
// columns the router filled.
type spy struct {
	in   shared.Inputs
	seen []string
}

func (s *spy) Inputs() shared.Inputs { return s.in }
func (s *spy) Score(_ context.Context, _ *shared.Request, c *shared.Candidates, costs []float64) error {
	s.seen = s.seen[:0]
	if c.ActiveRequests != nil {
		s.seen = append(s.seen, "ACTIVE_REQUESTS")
	}
	if c.Load != nil {
		s.seen = append(s.seen, "LOAD")
	}
	if c.OverlapBlocks != nil {
		s.seen = append(s.seen, "CACHE")
	}
	if c.TotalKVBlocks != nil {
		s.seen = append(s.seen, "CAPACITY")
	}
	if !c.Sorted() {
		s.seen = append(s.seen, "UNSORTED")
	}
	return nil
}

func TestRouterComputesOnlyDeclaredInputs(t *testing.T) {
	tests := []struct {
		in   shared.Inputs
		want []string
	}{
		{0, nil},
		{shared.InputActiveRequests, []string{"ACTIVE_REQUESTS"}},
		{shared.InputOccupancy, []string{"ACTIVE_REQUESTS"}}, // the deprecated alias
		{shared.InputCache | shared.InputCapacity, []string{"CACHE", "CAPACITY"}},
		{shared.AllInputs, []string{"ACTIVE_REQUESTS", "LOAD", "CACHE", "CAPACITY"}},
	}
	for _, tt := range tests {
		t.Run(tt.in.String(), func(t *testing.T) {
			s := &spy{in: tt.in}
			p := mustPolicy(t, "spy", []policy.WeightedScorer{{Name: "spy", Weight: 1, Scorer: s}}, builtin.NewRoundRobin())
			r := newRouter(t, p, 3)
			if _, err := r.Place(context.Background(), request(4, 1), Placement{}); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, s.seen); diff != "" {
				t.Fatalf("columns (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDecodeBookingHasNoPrefill: a decode worker receives the prompt's KV
// from a prefill worker, so its booking charges the prompt's blocks and an
// active request but no prefill tokens; a prefill booking of the same
// request charges the whole uncached prompt.
func TestDecodeBookingHasNoPrefill(t *testing.T) {
	p := mustPolicy(t, "rr", nil, builtin.NewRoundRobin())
	r, err := New(Options{BlockSize: 4, Roles: map[shared.Role]*policy.Policy{shared.RolePrefill: p, shared.RoleDecode: p}, BookingsAreLoad: true})
	if err != nil {
		t.Fatal(err)
	}
	for id, role := range []shared.Role{shared.RolePrefill, shared.RoleDecode} {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(id), Role: role, TotalKVBlocks: 100}); err != nil {
			t.Fatal(err)
		}
	}
	// 10 tokens = 3 blocks of 4.
	pre, err := r.Place(context.Background(), &shared.Request{Role: shared.RolePrefill, PromptTokens: 10, BlockSize: 4}, Placement{})
	if err != nil {
		t.Fatal(err)
	}
	dec, err := r.Place(context.Background(), &shared.Request{Role: shared.RoleDecode, PromptTokens: 10, BlockSize: 4}, Placement{})
	if err != nil {
		t.Fatal(err)
	}
	if pre.Worker.ID != 0 || dec.Worker.ID != 1 {
		t.Fatalf("prefill on %d, decode on %d; want 0 and 1", pre.Worker.ID, dec.Worker.ID)
	}
	if l := pre.Worker.Load(true); l.ActiveRequests != 1 || l.ActivePrefillTokens != 10 || l.ActiveDecodeBlocks != 3 {
		t.Fatalf("prefill worker load %+v; want 1 active, 10 prefill tokens, 3 blocks", l)
	}
	if l := dec.Worker.Load(true); l.ActiveRequests != 1 || l.ActivePrefillTokens != 0 || l.ActiveDecodeBlocks != 3 {
		t.Fatalf("decode worker load %+v; want 1 active, 0 prefill tokens, 3 blocks", l)
	}
	dec.Booking.PrefillDone()
	dec.Booking.Release()
	if l := dec.Worker.Load(true); l.ActiveRequests != 0 || l.ActivePrefillTokens != 0 || l.ActiveDecodeBlocks != 0 {
		t.Fatalf("decode worker load after release %+v; want all 0", l)
	}
}

// TestUnknownCapacityWorkerIsRoutable: a worker whose capacity is unknown
// (TotalKVBlocks 0) joins, is selected, and its prefix-index entries are
// recorded (bounded by prefix.DefaultUnknownCapacity).
func TestUnknownCapacityWorkerIsRoutable(t *testing.T) {
	r, err := New(Options{BlockSize: 4, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: kvPolicy(t)}, BookingsAreLoad: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.AddWorker(fleet.Spec{ID: 7, Role: shared.RoleAggregated}); err != nil {
		t.Fatalf("unknown capacity refused: %v", err)
	}
	for i := range 2 {
		d, err := r.Place(context.Background(), request(12, 1, 2, 3), Placement{})
		if err != nil {
			t.Fatal(err)
		}
		if d.Worker.ID != 7 || d.Worker.TotalKVBlocks != 0 || d.OverlapBlocks != 3*i {
			t.Fatalf("placement %d: worker %d capacity %d overlap %d; want 7, 0, %d", i, d.Worker.ID, d.Worker.TotalKVBlocks, d.OverlapBlocks, 3*i)
		}
		d.Booking.Release()
	}
}
