package router

import (
	"slices"
	"testing"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router/fleet"
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
