package live

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/shared"
)

// TestResponseBindingsBounded: the bindings keep at most max entries,
// pushing out the least recently used, and forget one ttl after its last
// use.
func TestResponseBindingsBounded(t *testing.T) {
	b := newResponseBindings(3, time.Minute)
	now := time.Unix(1000, 0)
	b.now = func() time.Time { return now }
	w1 := &fleet.Worker{Spec: fleet.Spec{ID: 1, Name: "w1"}}
	w2 := &fleet.Worker{Spec: fleet.Spec{ID: 2, Name: "w2"}}
	for i := range 3 {
		b.put(fmt.Sprintf("resp_%d", i), "m", w1)
	}
	if _, ok := b.get("resp_0"); !ok { // used: resp_1 is now the oldest
		t.Fatal("resp_0 not kept")
	}
	b.put("resp_3", "m", w2)
	if b.len() != 3 {
		t.Errorf("%d bindings kept, want 3", b.len())
	}
	if _, ok := b.get("resp_1"); ok {
		t.Error("the least recently used binding was kept past the bound")
	}
	if rb, ok := b.get("resp_3"); !ok || rb.worker != 2 || rb.name != "w2" || rb.model != "m" {
		t.Errorf("resp_3 = %+v, %v; want w2's", rb, ok)
	}
	// Rebinding an id moves it to its new worker.
	b.put("resp_0", "m", w2)
	if rb, _ := b.get("resp_0"); rb.name != "w2" {
		t.Errorf("rebound resp_0 on %q, want w2", rb.name)
	}
	now = now.Add(time.Minute + time.Second)
	if _, ok := b.get("resp_3"); ok {
		t.Error("a binding was kept past its TTL")
	}
	if b.len() != 2 {
		t.Errorf("%d bindings kept after one expired, want 2", b.len())
	}
}

// memSessions is an in-memory stand-in for the cluster's shared session
// store (router/cluster.Sessions): one map of (model, role, session) to
// worker, shared by every runtime given its For.
type memSessions struct {
	mu sync.Mutex
	m  map[string]shared.WorkerID
}

type memPartition struct {
	s   *memSessions
	key string
}

func (s *memSessions) For(model string, role shared.Role) shared.SessionStore {
	return memPartition{s: s, key: model + "|" + string(role) + "|"}
}

func (p memPartition) Bind(session string, w shared.WorkerID, _ time.Time) {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	p.s.m[p.key+session] = w
}

func (p memPartition) Binding(session string) (shared.WorkerID, time.Time, bool) {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	w, ok := p.s.m[p.key+session]
	return w, time.Time{}, ok
}

// TestResponseBindingsShared: a response bound on one replica is found
// by another through the shared store, under the model's aggregated
// partition and a namespace of its own (an X-Session-Id equal to the id
// is another key); an id whose worker left is not found; an over-long id
// is never bound.
func TestResponseBindingsShared(t *testing.T) {
	a := newEnv(t, envOptions{}, backend{name: "w1"}, backend{name: "w2"})
	store := &memSessions{m: map[string]shared.WorkerID{}}
	// Two replicas' runtimes over the same fleet and store.
	ra, err := New(Options{Router: a.r, Workers: a.ws, Sessions: store.For})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := New(Options{Router: a.r, Workers: a.ws, Sessions: store.For})
	if err != nil {
		t.Fatal(err)
	}
	w2 := a.r.Workers("m", shared.RoleAggregated)[1]
	ra.BindResponse("m", "resp_1", w2)
	if got, ok := store.m["m|aggregated|\x00response:resp_1"]; !ok || got != w2.ID {
		t.Fatalf("shared store holds %v", store.m)
	}
	if _, ok := store.m["m|aggregated|resp_1"]; ok {
		t.Error("the response id was bound outside its namespace")
	}
	for _, model := range []string{"m", ""} {
		w, m, ok := rb.ResponseWorker(model, "resp_1")
		if !ok || w.Name != "w2" || m != "m" {
			t.Errorf("replica b, model %q: %v %q %v; want w2 of m", model, w, m, ok)
		}
	}
	// A session bound under the same string does not answer for it.
	store.Bind2("m", "resp_2", 1)
	if _, _, ok := rb.ResponseWorker("m", "resp_2"); ok {
		t.Error("an X-Session-Id binding answered for a response id")
	}
	ra.BindResponse("m", strings.Repeat("r", MaxResponseIDBytes+1), w2)
	if len(store.m) != 2 {
		t.Errorf("an over-long id was shared: %d bindings", len(store.m))
	}
	if err := a.r.RemoveWorker(w2.ID, 0); err != nil {
		t.Fatal(err)
	}
	for _, rt := range []*Runtime{ra, rb} {
		if w, _, ok := rt.ResponseWorker("", "resp_1"); ok {
			t.Errorf("a gone worker's response found on %v", w.Name)
		}
	}
}

// Bind2 binds a plain session (an X-Session-Id) in model's aggregated
// partition.
func (s *memSessions) Bind2(model, session string, w shared.WorkerID) {
	s.For(model, shared.RoleAggregated).Bind(session, w, time.Time{})
}

// TestResponseHolderDown: a follow-up, GET or cancel of a response whose
// worker is still configured but not ready (out of the Router's
// candidates: its engine down or restarting) is *ResponseHolderDownError,
// a retryable 503 wrapping shared.ErrNoWorkers, naming the worker; once
// the worker is no longer configured either, *ResponseNotFoundError,
// vLLM's 404.
func TestResponseHolderDown(t *testing.T) {
	e := newEnv(t, envOptions{}, backend{name: "w1"}, backend{name: "w2"})
	w2 := e.r.Workers("m", shared.RoleAggregated)[1]
	e.rt.BindResponse("m", "resp_1", w2)
	if w, _, _, err := e.rt.FollowUp("m", "resp_1"); err != nil || w.Name != "w2" {
		t.Fatalf("follow-up on a ready holder: %v, %v; want w2", w, err)
	}
	if err := e.r.RemoveWorker(w2.ID, 0); err != nil {
		t.Fatal(err)
	}
	_, _, _, err := e.rt.FollowUp("m", "resp_1")
	_, serr := e.rt.PlaceStored("resp_1", nil)
	for _, err := range []error{err, serr} {
		var down *ResponseHolderDownError
		if !errors.As(err, &down) || down.Worker != "w2" || down.ID != "resp_1" || !errors.Is(err, shared.ErrNoWorkers) {
			t.Errorf("holder configured but not ready: %v; want ResponseHolderDownError naming w2", err)
		}
	}
	e.ws.mu.Lock()
	delete(e.ws.urls, "w2")
	e.ws.mu.Unlock()
	_, _, _, err = e.rt.FollowUp("m", "resp_1")
	_, serr = e.rt.PlaceStored("resp_1", nil)
	for _, err := range []error{err, serr} {
		var nf *ResponseNotFoundError
		if !errors.As(err, &nf) || nf.ID != "resp_1" || errors.Is(err, shared.ErrNoWorkers) {
			t.Errorf("holder gone: %v; want ResponseNotFoundError", err)
		}
	}
}

// TestResponseBindingsGauge: switchyard_response_bindings counts the
// bindings the runtime holds.
func TestResponseBindingsGauge(t *testing.T) {
	e := newEnv(t, envOptions{}, backend{name: "w1"}, backend{name: "w2"})
	ws := e.r.Workers("m", shared.RoleAggregated)
	for i, id := range []string{"resp_a", "resp_b", "resp_c"} {
		e.rt.BindResponse("m", id, ws[i%2])
	}
	e.rt.BindResponse("m", "resp_a", ws[1]) // rebound: still one
	if n, err := testutil.GatherAndCount(e.reg, "switchyard_response_bindings"); err != nil || n != 1 {
		t.Fatalf("%d series (%v), want 1", n, err)
	}
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(`
# HELP switchyard_response_bindings Responses API ids this router binds to the worker holding them (previous_response_id follow-ups), at most DefaultMaxResponses; expired ones count until looked up or pushed out.
# TYPE switchyard_response_bindings gauge
switchyard_response_bindings 3
`), "switchyard_response_bindings"); err != nil {
		t.Error(err)
	}
}
