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
