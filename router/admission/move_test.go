package admission_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/shared"
)

// TestMoveRebooksOnTheServingWorker: a request a proxy served elsewhere
// moves its booking (and its first token) there; listeners hear the move;
// a worker that is not a candidate ends the request.
func TestMoveRebooksOnTheServingWorker(t *testing.T) {
	e := newEnv(t, 3, capacityQueue(1), nil)
	ctx := context.Background()
	a := e.admit(t, "a") // round-robin: worker 1
	b := e.admit(t, "b") // worker 2
	if worker(a) != 1 || worker(b) != 2 {
		t.Fatalf("placed on %d and %d, want 1 and 2", worker(a), worker(b))
	}
	a.FirstToken()
	// Worker 2 is at max_active_requests = 1: the move ignores capacity,
	// the request is there already.
	if err := a.Move(ctx, 2, "served by another endpoint"); err != nil {
		t.Fatal(err)
	}
	if worker(a) != 2 {
		t.Fatalf("moved to %d, want 2", worker(a))
	}
	if got, want := active(e.r), map[shared.WorkerID]int64{1: 0, 2: 2, 3: 0}; !cmp.Equal(got, want) {
		t.Fatalf("active %v, want %v", got, want)
	}
	if l := a.Decision().Booking; l == nil || a.Decision().Worker.Load(true).ActivePrefillTokens != 8 {
		t.Fatalf("after the move with the first token recorded, worker 2's prefill tokens are %d, want b's 8 only",
			a.Decision().Worker.Load(true).ActivePrefillTokens)
	}
	if err := a.Move(ctx, 2, "again"); err != nil {
		t.Fatalf("a move to its own worker: %v", err)
	}
	if err := b.Move(ctx, 9, "unknown"); !errors.Is(err, router.ErrAllExcluded) {
		t.Fatalf("a move to no worker: %v, want ErrAllExcluded", err)
	}
	if err := b.Move(ctx, 1, "after the end"); !errors.Is(err, admission.ErrEnded) {
		t.Fatalf("a move of an ended request: %v, want ErrEnded", err)
	}
	a.End(admission.Completed(20))
	b.End(admission.Completed(20)) // a no-op: it ended
	for id, n := range active(e.r) {
		if n != 0 {
			t.Errorf("worker %d: %d active requests after every request ended", id, n)
		}
	}
	want := []string{"sent:a@1", "sent:b@2", "first_token:a@1", "aborted:a@1", "sent:a@2", "first_token:a@2",
		"aborted:b@2", "completed:a@2"}
	if diff := cmp.Diff(want, e.rec.events()); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
}

// TestAlternatesOption: the runners-up come with the handle's decision,
// also for a request dispatched from the queue.
func TestAlternatesOption(t *testing.T) {
	e := newEnv(t, 3, capacityQueue(1), nil)
	a := e.admit(t, "a", admission.Alternates(2))
	if got := ids(a.Decision().Alternates); !slices.Equal(got, []shared.WorkerID{2, 3}) {
		t.Fatalf("alternates of a on 1: %v, want [2 3]", got)
	}
	e.admit(t, "b")
	e.admit(t, "c")
	q := e.admit(t, "q", admission.Alternates(2))
	if !q.Queued() {
		t.Fatal("q should queue: every worker is at capacity")
	}
	a.End(admission.Completed(8))
	e.c.Dispatch(context.Background(), nil)
	d, err := q.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if d.Worker.ID != 1 || len(d.Alternates) != 0 {
		t.Fatalf("q dispatched to %d with alternates %v; want 1 and none (the others are at capacity)", d.Worker.ID, ids(d.Alternates))
	}
}

func ids(ws []*fleet.Worker) []shared.WorkerID {
	out := []shared.WorkerID{}
	for _, w := range ws {
		out = append(out, w.ID)
	}
	return out
}
