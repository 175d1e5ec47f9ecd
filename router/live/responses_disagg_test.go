package live

import (
	"testing"

	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/shared"
)

// TestResponseBindingsDecode: a disaggregated model's response, answered
// by a decode worker, is bound to it: found on this replica and, through
// the shared store's decode partition, on another; a prefill worker's is
// never found (its one-token answers are not the client's).
func TestResponseBindingsDecode(t *testing.T) {
	a := newEnv(t, envOptions{}, backend{name: "w1"})
	dec, err := a.r.AddWorker(fleet.Spec{ID: 10, Role: shared.RoleDecode, TotalKVBlocks: 1000, Name: "d", Models: []string{"pd"}})
	if err != nil {
		t.Fatal(err)
	}
	pre, err := a.r.AddWorker(fleet.Spec{ID: 11, Role: shared.RolePrefill, TotalKVBlocks: 1000, Name: "p", Models: []string{"pd"}})
	if err != nil {
		t.Fatal(err)
	}
	store := &memSessions{m: map[string]shared.WorkerID{}}
	ra, err := New(Options{Router: a.r, Workers: a.ws, Sessions: store.For})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := New(Options{Router: a.r, Workers: a.ws, Sessions: store.For})
	if err != nil {
		t.Fatal(err)
	}
	ra.BindResponse("pd", "resp_d", dec)
	if got, ok := store.m["pd|decode|\x00response:resp_d"]; !ok || got != dec.ID {
		t.Fatalf("shared store holds %v, want resp_d in pd's decode partition", store.m)
	}
	for _, rt := range []*Runtime{ra, rb} {
		for _, model := range []string{"pd", ""} {
			if w, m, ok := rt.ResponseWorker(model, "resp_d"); !ok || w.ID != dec.ID || m != "pd" {
				t.Errorf("model %q: %v %q %v; want the decode worker d of pd", model, w, m, ok)
			}
		}
	}
	ra.BindResponse("pd", "resp_p", pre)
	for _, rt := range []*Runtime{ra, rb} {
		if w, _, ok := rt.ResponseWorker("pd", "resp_p"); ok {
			t.Errorf("a prefill worker's response found on %s", w.Name)
		}
	}
}
