package fleet

import (
	"testing"

	"github.com/switchyard-router/switchyard/shared"
)

// TestAtCapacityFollowsTryBook: the fleet's full count rises when a
// TryBook takes a worker to its capacity and falls when a release takes
// it back below, whichever booking that is; Book leaves it alone.
func TestAtCapacityFollowsTryBook(t *testing.T) {
	f := New()
	ws, err := f.AddWorkers(Spec{ID: 1, Role: shared.RoleAggregated, TotalKVBlocks: 10}, Spec{ID: 2, Role: shared.RoleAggregated, TotalKVBlocks: 10})
	if err != nil {
		t.Fatal(err)
	}
	a := TryBook(nil, ws[0], 2, 1, 1)
	if f.AtCapacity() {
		t.Fatal("one of two slots taken: at capacity")
	}
	b := TryBook(nil, ws[0], 2, 1, 1)
	if !f.AtCapacity() {
		t.Fatal("both slots taken: not at capacity")
	}
	if TryBook(nil, ws[0], 2, 1, 1) != nil {
		t.Fatal("a third booking over capacity 2")
	}
	c := TryBook(nil, ws[1], 1, 1, 1)
	a.Release() // worker 1 back below its capacity; worker 2 still full
	if !f.AtCapacity() {
		t.Fatal("worker 2 is full: AtCapacity false")
	}
	a.Release() // a second release changes nothing
	c.Release()
	if f.AtCapacity() {
		t.Fatal("no worker full: AtCapacity true")
	}
	b.Release()
	Book(ws[0], 1, 1).Release()
	if f.AtCapacity() || ws[0].ActiveRequests() != 0 {
		t.Fatalf("after every release: AtCapacity %v, active %d", f.AtCapacity(), ws[0].ActiveRequests())
	}
}

// TestBookOverCountsTowardCapacity: bookings made over the capacity
// (another replica's, a moved one) count toward it as TryBook's do: the
// worker they fill is at capacity, TryBook refuses it, and the full count
// comes back to exactly 0 whatever order the releases come in (before
// BookOver, an uncounted booking made a counted release take it below 0).
func TestBookOverCountsTowardCapacity(t *testing.T) {
	f := New()
	ws, err := f.AddWorkers(Spec{ID: 1, Role: shared.RoleAggregated, TotalKVBlocks: 10})
	if err != nil {
		t.Fatal(err)
	}
	w := ws[0]
	a := TryBook(nil, w, 2, 1, 1)
	m := BookOver(nil, w, 2, 1, 1) // fills it
	if !f.AtCapacity() || TryBook(nil, w, 2, 1, 1) != nil {
		t.Fatalf("filled by BookOver: AtCapacity %v, want true and TryBook refused", f.AtCapacity())
	}
	n := BookOver(nil, w, 2, 1, 1) // past it: three in flight
	a.Release()                    // 3 -> 2: still full
	if !f.AtCapacity() || w.ActiveRequests() != 2 {
		t.Fatalf("two in flight of capacity 2: AtCapacity %v, active %d", f.AtCapacity(), w.ActiveRequests())
	}
	m.Release() // 2 -> 1
	if f.AtCapacity() || f.full.n.Load() != 0 {
		t.Fatalf("one in flight: AtCapacity %v, full count %d; want false, 0", f.AtCapacity(), f.full.n.Load())
	}
	b := TryBook(nil, w, 2, 1, 1) // 1 -> 2 again
	if !f.AtCapacity() {
		t.Fatal("filled again by TryBook: not at capacity")
	}
	n.Release()
	b.Release()
	if f.AtCapacity() || f.full.n.Load() != 0 || w.ActiveRequests() != 0 {
		t.Fatalf("after every release: AtCapacity %v, full count %d, active %d", f.AtCapacity(), f.full.n.Load(), w.ActiveRequests())
	}
}
