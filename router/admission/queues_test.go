package admission_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// modelsEnv is a round-robin router whose workers serve the given models
// (worker i+1 serves models[i]), under a Controller with capacity 1 per
// worker, a fake clock and inline events.
func modelsEnv(t *testing.T, maxWaiting int, models ...[]string) (*admission.Controller, *time.Time) {
	t.Helper()
	r, err := router.New(router.Options{BlockSize: 4, BookingsAreLoad: true,
		Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: rrPolicy(), shared.RolePrefill: rrPolicy()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	for i, ms := range models {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Role: shared.RoleAggregated, TotalKVBlocks: 100, Models: ms}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Unix(1000, 0)
	q := config.DefaultQueue()
	q.MaxActiveRequests, q.MaxWaiting = 1, maxWaiting
	// The classifier gives each request the priority its caller set.
	cl := classifyWith(func(req *shared.Request) (shared.Classification, error) {
		return shared.Classification{Priority: req.Priority}, nil
	})
	return newController(t, r, admission.Options{Queue: q, Classifier: cl, Now: func() time.Time { return now }, InlineEvents: true}), &now
}

func admitModel(t *testing.T, c *admission.Controller, id, model string, priority int) *admission.Handle {
	t.Helper()
	h, err := c.Admit(context.Background(), &shared.Request{ID: id, Model: model, Role: shared.RoleAggregated, PromptTokens: 4, Priority: priority})
	if err != nil {
		t.Fatalf("Admit(%s): %v", id, err)
	}
	return h
}

// TestFullModelDoesNotHoldUpAnother: requests wait per (model, role), so
// a request of model b whose worker freed is dispatched although a
// request of model a, whose only worker is still busy, waits before it.
func TestFullModelDoesNotHoldUpAnother(t *testing.T) {
	c, now := modelsEnv(t, 0, []string{"a"}, []string{"b"})
	a1 := admitModel(t, c, "a1", "a", 0)
	b1 := admitModel(t, c, "b1", "b", 0)
	*now = now.Add(time.Second)
	a2 := admitModel(t, c, "a2", "a", 0) // waits for worker 1
	*now = now.Add(time.Second)
	b2 := admitModel(t, c, "b2", "b", 0) // waits for worker 2
	if !a2.Queued() || !b2.Queued() || c.Waiting(shared.RoleAggregated) != 2 {
		t.Fatalf("a2 queued %v, b2 queued %v, waiting %d; want both queued", a2.Queued(), b2.Queued(), c.Waiting(shared.RoleAggregated))
	}
	b1.End(admission.Completed(5))
	out := c.Dispatch(context.Background(), nil)
	if len(out) != 1 || out[0] != b2 || b2.Decision().Worker.ID != 2 {
		t.Fatalf("dispatched %d (b2 on %v); want b2 on worker 2 while a2 waits for worker 1", len(out), b2.Decision().Worker)
	}
	if !a2.Queued() {
		t.Fatal("a2 left the queue with its worker busy")
	}
	a1.End(admission.Completed(5))
	if out := c.Dispatch(context.Background(), out[:0]); len(out) != 1 || out[0] != a2 {
		t.Fatalf("after a1 ended: dispatched %d, want a2", len(out))
	}
	if c.Queued() != 0 {
		t.Fatalf("%d still queued", c.Queued())
	}
}

// TestSharedWorkerServesHeadsInOrder: when the models' queues compete for
// one worker, the higher priority goes first, then the earlier arrival.
func TestSharedWorkerServesHeadsInOrder(t *testing.T) {
	c, now := modelsEnv(t, 0, []string{"a", "b"})
	first := admitModel(t, c, "x", "a", 0)
	var waiting []*admission.Handle
	for _, r := range []struct {
		id, model string
		priority  int
	}{{"a-early", "a", 0}, {"b-late", "b", 0}, {"b-urgent", "b", 5}} {
		*now = now.Add(time.Second)
		waiting = append(waiting, admitModel(t, c, r.id, r.model, r.priority))
	}
	var order []string
	prev := first
	for range waiting {
		prev.End(admission.Completed(5))
		out := c.Dispatch(context.Background(), nil)
		if len(out) != 1 {
			t.Fatalf("dispatched %d with one slot free", len(out))
		}
		order = append(order, out[0].Request().ID)
		prev = out[0]
	}
	if got, want := order, []string{"b-urgent", "a-early", "b-late"}; !equal(got, want) {
		t.Fatalf("dispatch order %v, want %v", got, want)
	}
}

// TestMaxWaitingCountsEveryQueue: max_waiting bounds the requests waiting
// in all the queues together, whatever their model.
func TestMaxWaitingCountsEveryQueue(t *testing.T) {
	c, _ := modelsEnv(t, 2, []string{"a"}, []string{"b"})
	admitModel(t, c, "a1", "a", 0)
	admitModel(t, c, "b1", "b", 0)
	admitModel(t, c, "a2", "a", 0)
	admitModel(t, c, "b2", "b", 0)
	_, err := c.Admit(context.Background(), &shared.Request{ID: "a3", Model: "a", Role: shared.RoleAggregated, PromptTokens: 4})
	if !errors.Is(err, admission.ErrQueueFull) {
		t.Fatalf("a third waiting request: err %v, want ErrQueueFull", err)
	}
	if c.Queued() != 2 {
		t.Fatalf("queued %d, want 2", c.Queued())
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
