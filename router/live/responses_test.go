package live

import (
	"fmt"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/fleet"
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
