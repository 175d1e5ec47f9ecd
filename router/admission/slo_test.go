package admission_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// sloPicker records the SLO of every request it is asked to place and
// picks row 0, or answers refuse's error when refuse is set.
type sloPicker struct {
	mu     sync.Mutex
	seen   map[string][]shared.SLO // by request id, one per placement
	refuse error
}

func (*sloPicker) Inputs() shared.Inputs { return 0 }

func (p *sloPicker) Pick(_ context.Context, req *shared.Request, _ *shared.Candidates) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.seen == nil {
		p.seen = map[string][]shared.SLO{}
	}
	p.seen[req.ID] = append(p.seen[req.ID], req.SLO)
	return 0, p.refuse
}

func (p *sloPicker) placements(id string) []shared.SLO {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]shared.SLO(nil), p.seen[id]...)
}

// sloEnv is one worker of capacity 1 behind p, a fake clock, the queue's
// classes "chat" (ttft 800ms, on_miss wait, slack order) and "batch" (no
// targets, the default), and opts' DefaultSLO.
func sloEnv(t *testing.T, p *sloPicker, def shared.SLO) *env {
	t.Helper()
	q := config.Queue{MaxActiveRequests: 1, DefaultClass: "batch", Classes: []config.QueueClass{
		{Name: "chat", Weight: 1, Order: config.OrderSlack, SLO: shared.SLO{TTFT: 800 * time.Millisecond, OnMiss: shared.SLOMissWait}},
		{Name: "batch", Weight: 1, Order: config.OrderFCFS},
	}}
	e := &env{rec: &recorder{}, now: time.Unix(1000, 0)}
	e.r = newRouter(t, &policy.Policy{Name: "slo", PickerName: "pick", Picker: p}, 1)
	// The classifier puts a request in the class its metadata names.
	cl := classifyWith(func(req *shared.Request) (shared.Classification, error) {
		return shared.Classification{PolicyClass: req.Metadata["class"]}, nil
	})
	e.c = newController(t, e.r, admission.Options{Queue: q, Classifier: cl, DefaultSLO: def,
		Now: func() time.Time { return e.now }, InlineEvents: true})
	return e
}

func sloRequest(id, class string, tokens int, slo shared.SLO) *shared.Request {
	return &shared.Request{ID: id, Role: shared.RoleAggregated, PromptTokens: tokens, SLO: slo,
		Metadata: map[string]string{"class": class}}
}

// TestSLOTargetsAndWaited: a request's own targets win field by field
// over its class's, which win over the Controller's DefaultSLO; every
// placement sees Waited, its time in the router since its arrival
// (Arrival, else Admit), at the first attempt and at the dispatch from
// the queue.
func TestSLOTargetsAndWaited(t *testing.T) {
	p := &sloPicker{}
	e := sloEnv(t, p, shared.SLO{TTFT: 5 * time.Second, TPOT: 40 * time.Millisecond})
	ctx := context.Background()
	arrived := e.now.Add(-250 * time.Millisecond) // its body took 250ms to arrive

	// Placed at once: the class's TTFT and on_miss, its own TPOT.
	a, err := e.c.Admit(ctx, sloRequest("a", "chat", 8, shared.SLO{TPOT: 20 * time.Millisecond}), admission.Arrival(arrived))
	if err != nil || a.Queued() {
		t.Fatalf("Admit(a): queued %v, %v", a.Queued(), err)
	}
	// Queued: its own TTFT and on_miss, the default's TPOT (its class
	// sets none).
	b, err := e.c.Admit(ctx, sloRequest("b", "batch", 8, shared.SLO{TTFT: 2 * time.Second, OnMiss: shared.SLOMissReject}))
	if err != nil || !b.Queued() {
		t.Fatalf("Admit(b): queued %v, %v", b.Queued(), err)
	}
	e.now = e.now.Add(700 * time.Millisecond)
	a.End(admission.Completed(10))
	if out := e.c.Dispatch(ctx, nil); len(out) != 1 || out[0] != b {
		t.Fatalf("dispatched %v, want b", out)
	}
	want := map[string][]shared.SLO{
		"a": {{TTFT: 800 * time.Millisecond, TPOT: 20 * time.Millisecond, OnMiss: shared.SLOMissWait, Waited: 250 * time.Millisecond}},
		// b's first attempt found the worker full (the capacity check
		// runs before the picker: it saw no placement), then its
		// dispatch after 700ms in the queue.
		"b": {{TTFT: 2 * time.Second, TPOT: 40 * time.Millisecond, OnMiss: shared.SLOMissReject, Waited: 700 * time.Millisecond}},
	}
	for id, w := range want {
		if diff := cmp.Diff(w, p.placements(id)); diff != "" {
			t.Errorf("%s's placements (-want +got):\n%s", id, diff)
		}
	}
	b.End(admission.Completed(10))

	// A request without targets, in a class without any, under a
	// Controller without a default: none, and no Waited.
	p2 := &sloPicker{}
	e2 := sloEnv(t, p2, shared.SLO{})
	c, err := e2.c.Admit(ctx, sloRequest("c", "batch", 8, shared.SLO{}), admission.Arrival(arrived))
	if err != nil {
		t.Fatal(err)
	}
	defer c.End(admission.Completed(1))
	if diff := cmp.Diff([]shared.SLO{{}}, p2.placements("c")); diff != "" {
		t.Errorf("c's placements (-want +got):\n%s", diff)
	}
}

// TestNoHeadroomRefuses: a selection's *shared.NoHeadroomError fails the
// request, at Admit and at a dispatch from the queue, with the error
// itself (the faces answer it 429 with Retry-After).
func TestNoHeadroomRefuses(t *testing.T) {
	p := &sloPicker{}
	e := sloEnv(t, p, shared.SLO{})
	ctx := context.Background()
	a, err := e.c.Admit(ctx, sloRequest("a", "chat", 8, shared.SLO{}))
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.c.Admit(ctx, sloRequest("b", "chat", 8, shared.SLO{}))
	if err != nil || !b.Queued() {
		t.Fatalf("Admit(b): queued %v, %v", b.Queued(), err)
	}
	nh := &shared.NoHeadroomError{RetryAfter: 1500 * time.Millisecond, TTFT: 1.2, TPOT: 0.03}
	p.mu.Lock()
	p.refuse = nh
	p.mu.Unlock()
	a.End(admission.Completed(10))
	if out := e.c.Dispatch(ctx, nil); len(out) != 1 || out[0] != b {
		t.Fatalf("dispatched %v, want b refused", out)
	}
	var got *shared.NoHeadroomError
	if _, err := b.Wait(ctx); !errors.As(err, &got) || *got != *nh {
		t.Fatalf("b.Wait: %v, want the NoHeadroomError", err)
	}
	h, err := e.c.Admit(ctx, sloRequest("c", "chat", 8, shared.SLO{}))
	if !errors.As(err, &got) || h == nil || h.Err() == nil {
		t.Fatalf("Admit(c) = %v, %v; want the NoHeadroomError with its ended handle", h, err)
	}
	if q := e.c.Queued(); q != 0 {
		t.Errorf("%d queued after the refusals", q)
	}
}

// TestSlackOrderDispatch: a slack class dispatches the request whose
// latest useful start (arrival + TTFT target left - predicted TTFT) is
// earliest; without a TTFTPredictor on the core the prediction is the
// uncached prompt tokens times DefaultPrefillPerToken (router/queue's
// tests cover requests without a target).
func TestSlackOrderDispatch(t *testing.T) {
	p := &sloPicker{}
	e := sloEnv(t, p, shared.SLO{})
	ctx := context.Background()
	busy, err := e.c.Admit(ctx, sloRequest("busy", "batch", 8, shared.SLO{}))
	if err != nil {
		t.Fatal(err)
	}
	admit := func(id string, tokens int, ttft time.Duration) {
		t.Helper()
		h, err := e.c.Admit(ctx, sloRequest(id, "chat", tokens, shared.SLO{TTFT: ttft}))
		if err != nil || !h.Queued() {
			t.Fatalf("Admit(%s): queued %v, %v", id, h.Queued(), err)
		}
	}
	// short: 8 tokens (168us predicted), 1s: starts by ~1s.
	// long: 40,000 tokens (840ms predicted), 1s, 10ms later: by 170ms.
	// class: the class's 800ms, 100 tokens (2.1ms): by ~818ms.
	admit("short", 8, time.Second)
	e.now = e.now.Add(10 * time.Millisecond)
	admit("long", 40_000, time.Second)
	admit("class", 100, 0)
	var order []string
	for range 3 {
		busy.End(admission.Completed(1))
		out := e.c.Dispatch(ctx, nil)
		if len(out) != 1 {
			t.Fatalf("dispatched %d, want 1", len(out))
		}
		busy = out[0]
		order = append(order, busy.Request().ID)
	}
	busy.End(admission.Completed(1))
	if diff := cmp.Diff([]string{"long", "class", "short"}, order); diff != "" {
		t.Errorf("dispatch order (-want +got):\n%s", diff)
	}
}
