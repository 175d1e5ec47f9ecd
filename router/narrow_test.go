package router

import (
	"context"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// TestNarrowAsksOncePerMember: narrow's predicate reads counters that
// concurrent selections change (underCapacity), so it must decide on one
// answer per member. A predicate that changes its mind between two looks
// must not yield an empty candidate set (a selection failing with
// "no workers" while workers have room).
func TestNarrowAsksOncePerMember(t *testing.T) {
	r := newRouter(t, mustPolicy(t, "rr", nil, builtin.NewRoundRobin()), 3)
	p := r.fleet.Snapshot().Partition(shared.RoleAggregated)
	asked := map[shared.WorkerID]int{}
	// First look: worker 1 is full, 2 and 3 have room; any later look:
	// every worker is full.
	keep := func(w *fleet.Worker) bool {
		asked[w.ID]++
		return asked[w.ID] == 1 && w.ID != 1
	}
	q := narrow(p, "capacity", keep)
	if q == nil || !slices.Equal(q.IDs, []shared.WorkerID{2, 3}) || len(q.Workers) != 2 || q.Workers[0].ID != 2 {
		t.Fatalf("narrowed to %+v, want workers 2 and 3", q)
	}
	if q.Key == p.Key || q.ActiveAt == nil {
		t.Fatalf("the narrowed set needs its own key (%d, full set %d) and ActiveAt", q.Key, p.Key)
	}
	for id, n := range asked {
		if n != 1 {
			t.Errorf("worker %d asked %d times", id, n)
		}
	}
	if got := narrow(p, "capacity", func(*fleet.Worker) bool { return true }); got != p {
		t.Errorf("keeping every member: %+v, want the partition itself", got)
	}
	if got := narrow(p, "capacity", func(*fleet.Worker) bool { return false }); got != nil {
		t.Errorf("keeping no member: %+v, want nil", got)
	}
}

// columns is a scorer that keeps the rows it was given: ids, CACHE and
// CAPACITY.
type columns struct {
	ids      []shared.WorkerID
	overlap  []int32
	capacity []int64
}

func (*columns) Inputs() shared.Inputs { return shared.InputCache | shared.InputCapacity }
func (s *columns) Score(_ context.Context, _ *shared.Request, c *shared.Candidates, _ []float64) error {
	s.ids, s.overlap, s.capacity = slices.Clone(c.IDs), slices.Clone(c.OverlapBlocks), slices.Clone(c.TotalKVBlocks)
	return nil
}

// TestNarrowedCandidatesKeepTheirColumns: a selection over a narrowed
// partition (workers excluded, or one at capacity) gets each remaining
// worker's own prefix overlap and capacity, not another row's.
func TestNarrowedCandidatesKeepTheirColumns(t *testing.T) {
	s := &columns{}
	p := mustPolicy(t, "cols", []policy.WeightedScorer{{Name: "cols", Weight: 1, Scorer: s}}, builtin.NewRoundRobin())
	r, err := New(Options{BlockSize: 4, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: p}, BookingsAreLoad: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Role: shared.RoleAggregated, TotalKVBlocks: int64(101 + i)}); err != nil {
			t.Fatal(err)
		}
	}
	req := request(12, 5, 6, 7)
	r.index.Record(prefix.Candidate{ID: 2}, req.BlockHashes)
	r.index.Record(prefix.Candidate{ID: 3}, req.BlockHashes[:1])
	type rows struct {
		IDs      []shared.WorkerID
		Overlap  []int32
		Capacity []int64
	}
	// place places the request and returns the rows the policy should
	// have seen for the ids: each worker's overlap by the index before
	// the placement records the prompt on the chosen one.
	place := func(pl Placement, ids ...shared.WorkerID) rows {
		t.Helper()
		want := rows{IDs: ids}
		for _, id := range ids {
			want.Overlap = append(want.Overlap, int32(r.index.Overlap(prefix.Candidate{ID: id}, req.BlockHashes, nil)))
			want.Capacity = append(want.Capacity, int64(100+id))
		}
		d, err := r.Place(context.Background(), &shared.Request{Role: req.Role, PromptTokens: 12, BlockHashes: req.BlockHashes}, pl)
		if err != nil {
			t.Fatal(err)
		}
		d.Booking.Release()
		return want
	}
	want := place(Placement{}, 1, 2, 3, 4)
	if diff := cmp.Diff(rows{[]shared.WorkerID{1, 2, 3, 4}, []int32{0, 3, 1, 0}, []int64{101, 102, 103, 104}}, want); diff != "" {
		t.Fatalf("the test's own setup (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		name string
		pl   Placement
		ids  []shared.WorkerID
	}{
		{"every worker", Placement{}, []shared.WorkerID{1, 2, 3, 4}},
		{"worker 1 excluded", Placement{Exclude: []shared.WorkerID{1}}, []shared.WorkerID{2, 3, 4}},
		{"worker 3 excluded", Placement{Exclude: []shared.WorkerID{3}}, []shared.WorkerID{1, 2, 4}},
	} {
		want := place(tc.pl, tc.ids...)
		if diff := cmp.Diff(want, rows{s.ids, s.overlap, s.capacity}); diff != "" {
			t.Fatalf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
	b := fleet.TryBook(nil, r.Workers("", shared.RoleAggregated)[1], 1, 0, 0) // worker 2 at capacity 1
	if b == nil {
		t.Fatal("worker 2 refused its first booking")
	}
	defer b.Release()
	want = place(Placement{Capacity: 1}, 1, 3, 4)
	if diff := cmp.Diff(want, rows{s.ids, s.overlap, s.capacity}); diff != "" {
		t.Fatalf("worker 2 at capacity (-want +got):\n%s", diff)
	}
}
