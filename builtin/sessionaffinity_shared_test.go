package builtin

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/shared"
)

// memSessions is a shared.SessionStore in memory: what a cluster of
// replicas would share, without NATS (the unit seam; router/cluster tests
// the real one).
type memSessions struct {
	mu    sync.Mutex
	m     map[string]memBinding
	binds int
}

type memBinding struct {
	worker shared.WorkerID
	at     time.Time
}

func (s *memSessions) Bind(session string, worker shared.WorkerID, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[session] = memBinding{worker, at}
	s.binds++
}

func (s *memSessions) Binding(session string) (shared.WorkerID, time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[session]
	return b.worker, b.at, ok
}

// newReplicas returns two partitions (two replicas' classifiers) sharing
// store and one clock.
func newReplicas(t *testing.T, store shared.SessionStore) (a, b *affinityHarness) {
	t.Helper()
	s, err := NewSessionAffinity(shared.Params{ParamTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{}
	s.now = clock.now
	mk := func() *affinityHarness {
		h := &affinityHarness{t: t, clock: clock, fleet: newFleet(10, 20, 30)}
		c, err := s.NewClassifier(shared.PartitionContext{Model: "m", Role: shared.RoleAggregated, BlockSize: 16,
			Workers: h.fleet.workers, Sessions: store})
		if err != nil {
			t.Fatal(err)
		}
		h.p = c.(*affinityPartition)
		return h
	}
	return mk(), mk()
}

func TestSessionAffinitySharedAcrossReplicas(t *testing.T) {
	store := &memSessions{m: map[string]memBinding{}}
	a, b := newReplicas(t, store)
	a.serve("s", 20) // turn 1 on replica A, sent to 20
	if store.binds != 1 || store.m["s"].worker != 20 {
		t.Fatalf("shared after turn 1: %d binds, %+v", store.binds, store.m["s"])
	}
	a.clock.advance(time.Second)
	// Turn 2 reaches replica B, which never saw the session.
	if got := b.serve("s", 30); got != 20 {
		t.Errorf("turn 2 on B: target %d, want 20 (A's binding)", got)
	}
	// B's router sent it to 30 instead: the last send wins, on A too,
	// although A's own binding (20) is live.
	a.clock.advance(time.Second)
	a.wantTarget("s", 30)
	// A rebinds to 10 itself; B follows.
	a.clock.advance(time.Second)
	a.serve("s", 10)
	a.clock.advance(time.Second)
	b.wantTarget("s", 10)
	a.wantTarget("s", 10)
}

func TestSessionAffinitySharedIgnoredWhenStaleOrUnknown(t *testing.T) {
	store := &memSessions{m: map[string]memBinding{}}
	a, b := newReplicas(t, store)
	// A binding naming a worker B's partition does not have is ignored.
	store.Bind("gone", 99, a.clock.now())
	b.wantTarget("gone", 0)
	// One older than ttl is ignored.
	store.Bind("old", 20, a.clock.now())
	a.clock.advance(time.Minute + time.Second)
	b.wantTarget("old", 0)
	// A shared binding older than the local one's last use loses.
	b.serve("s", 30)
	store.Bind("s", 20, a.clock.now().Add(-time.Second))
	b.wantTarget("s", 30)
	// Both B's binding and the shared one expire with ttl.
	b.serve("t", 10) // binds t -> 10 locally and shared
	a.clock.advance(time.Minute + time.Second)
	b.wantTarget("t", 0)
	b.p.mu.Lock()
	_, held := b.p.index["t"]
	b.p.mu.Unlock()
	if held {
		t.Error("B still holds t's expired binding")
	}
}

// TestSessionAffinitySharedHitNoAllocs: with a store, a hit and its
// events still allocate nothing in the classifier.
func TestSessionAffinitySharedHitNoAllocs(t *testing.T) {
	store := &memSessions{m: map[string]memBinding{}}
	a, _ := newReplicas(t, store)
	a.serve("s", 20)
	req := &shared.Request{ID: "hit", SessionID: "s"}
	sent := []shared.Event{{Kind: shared.EventSent, RequestID: "hit", Worker: 20, HasWorker: true}}
	n := testing.AllocsPerRun(100, func() {
		cl, _ := a.p.Classify(context.Background(), req)
		if cl.Target != 20 {
			t.Fatalf("miss: %+v", cl)
		}
		a.p.OnEvents(sent)
	})
	if n != 0 {
		t.Errorf("a shared hit with its send allocates %v, want 0", n)
	}
}
