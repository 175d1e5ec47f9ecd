package admission_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/shared"
)

// observed records an Observer's calls as "booked:id@worker",
// "first:id", "released:id".
type observed struct {
	mu  sync.Mutex
	got []string
}

func (o *observed) Booked(req *shared.Request, d router.Decision) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, fmt.Sprintf("booked:%s@%d", req.ID, d.Worker.ID))
}
func (o *observed) FirstToken(id string) {
	o.mu.Lock()
	o.got = append(o.got, "first:"+id)
	o.mu.Unlock()
}
func (o *observed) Released(id string) {
	o.mu.Lock()
	o.got = append(o.got, "released:"+id)
	o.mu.Unlock()
}

// TestObserverHearsEveryBooking: an Admit, a first token and an End; a
// Retry under a new id; a request dispatched from the queue; a Move; a
// queued request that ends before a dispatch (never booked: nothing).
func TestObserverHearsEveryBooking(t *testing.T) {
	obs := &observed{}
	r := newRouter(t, rrPolicy(), 2)
	c := newController(t, r, admission.Options{Queue: capacityQueue(1), Observer: obs, InlineEvents: true,
		Now: func() time.Time { return time.Unix(1000, 0) }})
	ctx := context.Background()
	admit := func(id string) *admission.Handle {
		h, err := c.Admit(ctx, &shared.Request{ID: id, Role: shared.RoleAggregated, PromptTokens: 8})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	a := admit("a") // worker 1
	a.FirstToken()
	b := admit("b") // worker 2
	q := admit("q") // both at capacity: queued
	gone := admit("gone")
	gone.End(admission.Aborted("left while queued"))
	if err := b.Retry(ctx, "b#1", "worker error"); err != nil || worker(b) != 2 || !q.Queued() {
		t.Fatalf("retry of b: %v, on %d (q queued %v); want on 2, q still queued", err, worker(b), q.Queued())
	}
	a.End(admission.Completed(9))
	c.Dispatch(ctx, nil)
	if worker(q) != 1 {
		t.Fatalf("q dispatched to %d, want 1", worker(q))
	}
	if err := q.Move(ctx, 2, "served elsewhere"); err != nil {
		t.Fatal(err)
	}
	q.End(admission.Completed(9))
	b.End(admission.Completed(9))
	want := []string{
		"booked:a@1", "first:a", "booked:b@2",
		"released:b", "booked:b#1@2", // the retry: released under the old id, booked under the new
		"released:a", "booked:q@1", // the dispatch
		"released:q", "booked:q@2", // the move
		"released:q", "released:b#1",
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if diff := cmp.Diff(want, obs.got); diff != "" {
		t.Fatalf("observer calls (-want +got):\n%s", diff)
	}
}
