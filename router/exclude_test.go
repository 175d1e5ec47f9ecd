package router

import (
	"context"
	"errors"
	"testing"

	"github.com/switchyard-router/switchyard/shared"
)

// TestAdmitExcludeAvoidsTheFailedWorker is serve's retry: a request sent
// to a worker that failed before a byte is aborted and admitted again.
// The prefix index recorded its prompt as sent there, so the KV-aware
// policy picks that worker again; excluded, it picks another.
func TestAdmitExcludeAvoidsTheFailedWorker(t *testing.T) {
	r := newRouter(t, kvPolicy(t), 3)
	if err := r.EnableAdmission(AdmissionOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	admit := func(id string, opts ...AdmitOption) (Ticket, error) {
		req := request(64, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)
		req.ID = id
		return r.Admit(ctx, req, opts...)
	}
	first, err := admit("x#0")
	if err != nil {
		t.Fatal(err)
	}
	failed := first.Decision.Worker.ID
	if err := r.Abort("x#0", "worker error"); err != nil {
		t.Fatal(err)
	}
	again, err := admit("x#1")
	if err != nil {
		t.Fatal(err)
	}
	if again.Decision.Worker.ID != failed || again.Decision.OverlapBlocks == 0 {
		t.Fatalf("without Exclude the retry went to %d (overlap %d); the test needs the policy to pick the failed %d again",
			again.Decision.Worker.ID, again.Decision.OverlapBlocks, failed)
	}
	if err := r.Abort("x#1", "worker error"); err != nil {
		t.Fatal(err)
	}
	retry, err := admit("x#2", Exclude(failed))
	if err != nil {
		t.Fatal(err)
	}
	if got := retry.Decision.Worker.ID; got == failed {
		t.Fatalf("the retry excluding %d went to it", failed)
	}
	second := retry.Decision.Worker.ID
	if err := r.Abort("x#2", "worker error"); err != nil {
		t.Fatal(err)
	}
	// Excluding two of three leaves the third.
	last, err := admit("x#3", Exclude(failed, second))
	if err != nil {
		t.Fatal(err)
	}
	if got := last.Decision.Worker.ID; got == failed || got == second {
		t.Fatalf("excluding %d and %d went to %d", failed, second, got)
	}
	if err := r.Complete("x#3", 64); err != nil {
		t.Fatal(err)
	}
	// Excluding every candidate fails the request, which is not live after.
	_, err = admit("x#4", Exclude(1, 2, 3))
	if !errors.Is(err, ErrAllExcluded) || !errors.Is(err, shared.ErrNoWorkers) {
		t.Fatalf("every worker excluded: err = %v, want ErrAllExcluded (an ErrNoWorkers)", err)
	}
	if err := r.Abort("x#4", "x"); !errors.Is(err, ErrUnknownRequest) {
		t.Fatalf("the refused request is live: Abort = %v", err)
	}
	for _, w := range r.Workers("", shared.RoleAggregated) {
		if n := w.ActiveRequests(); n != 0 {
			t.Errorf("worker %d: %d active requests after every request ended", w.ID, n)
		}
	}
}

// TestDispatchHonoursExclude: a queued request with an exclusion is not
// dispatched to an excluded worker that frees first; it waits for another.
func TestDispatchHonoursExclude(t *testing.T) {
	e := newAdmitEnv(t, 2, capacityQueue(1), nil)
	a, b := e.admit(t, "a"), e.admit(t, "b") // round robin: a on 1, b on 2
	if a.Decision.Worker.ID != 1 || b.Decision.Worker.ID != 2 {
		t.Fatalf("a on %d, b on %d; want 1 and 2", a.Decision.Worker.ID, b.Decision.Worker.ID)
	}
	c, err := e.r.Admit(context.Background(), &shared.Request{ID: "c", Role: shared.RoleAggregated, PromptTokens: 8}, Exclude(1))
	if err != nil || !c.Queued {
		t.Fatalf("c: queued %v, err %v; want queued", c.Queued, err)
	}
	if err := e.r.Complete("a", 8); err != nil {
		t.Fatal(err)
	}
	if out := e.r.Dispatch(context.Background(), nil); len(out) != 0 {
		t.Fatalf("dispatched %+v to the excluded worker 1", out)
	}
	if err := e.r.Complete("b", 8); err != nil {
		t.Fatal(err)
	}
	out := e.r.Dispatch(context.Background(), nil)
	if len(out) != 1 || out[0].ID != "c" || out[0].Err != nil || out[0].Decision.Worker.ID != 2 {
		t.Fatalf("dispatch = %+v, want c on 2", out)
	}
}
