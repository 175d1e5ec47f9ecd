package builtin

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/ilist"
	"github.com/switchyard-router/switchyard/shared"
)

// fakeClock is a settable clock, safe for concurrent use.
type fakeClock struct{ ns atomic.Int64 }

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func (c *fakeClock) now() time.Time          { return epoch.Add(time.Duration(c.ns.Load())) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// fleet is a partition's worker set the test can change.
type fleet struct {
	ws atomic.Pointer[[]shared.WorkerInfo]
}

func newFleet(ids ...shared.WorkerID) *fleet {
	f := &fleet{}
	f.set(ids...)
	return f
}

func (f *fleet) set(ids ...shared.WorkerID) {
	ws := make([]shared.WorkerInfo, len(ids))
	for i, id := range ids {
		ws[i] = shared.WorkerInfo{ID: id, TotalKVBlocks: 1000}
	}
	f.ws.Store(&ws)
}

func (f *fleet) workers() []shared.WorkerInfo { return *f.ws.Load() }

// affinityHarness is one session-affinity partition with a fake clock.
type affinityHarness struct {
	t     *testing.T
	clock *fakeClock
	fleet *fleet
	p     *affinityPartition
	n     int
}

func newAffinity(t *testing.T, params shared.Params) *affinityHarness {
	t.Helper()
	s, err := NewSessionAffinity(params)
	if err != nil {
		t.Fatal(err)
	}
	h := &affinityHarness{t: t, clock: &fakeClock{}, fleet: newFleet(10, 20, 30)}
	s.now = h.clock.now
	c, err := s.NewClassifier(shared.PartitionContext{Model: "m", Role: shared.RoleAggregated, BlockSize: 16,
		Workers: h.fleet.workers})
	if err != nil {
		t.Fatal(err)
	}
	h.p = c.(*affinityPartition)
	return h
}

// classify classifies a new request of session and returns its id and
// target (0 when none).
func (h *affinityHarness) classify(session string) (string, shared.WorkerID) {
	h.t.Helper()
	h.n++
	id := fmt.Sprintf("r%d", h.n)
	cl, err := h.p.Classify(context.Background(), &shared.Request{ID: id, SessionID: session})
	if err != nil {
		h.t.Fatal(err)
	}
	if cl.HasTarget != (cl.Target != 0) || cl.Priority != 0 || cl.PolicyClass != "" {
		h.t.Fatalf("classification %+v", cl)
	}
	return id, cl.Target
}

// serve runs a request of session to completion on worker w.
func (h *affinityHarness) serve(session string, w shared.WorkerID) shared.WorkerID {
	id, target := h.classify(session)
	h.p.OnEvents([]shared.Event{
		{Kind: shared.EventSent, RequestID: id, Worker: w, HasWorker: true},
		{Kind: shared.EventFirstToken, RequestID: id, Worker: w, HasWorker: true},
		{Kind: shared.EventCompleted, RequestID: id, Worker: w, HasWorker: true, ContextTokens: 100},
	})
	return target
}

func (h *affinityHarness) wantTarget(session string, want shared.WorkerID) {
	h.t.Helper()
	if _, got := h.classify(session); got != want {
		h.t.Errorf("session %q: target %d, want %d", session, got, want)
	}
}

func TestSessionAffinityLearnsFromSent(t *testing.T) {
	h := newAffinity(t, nil)
	h.wantTarget("s1", 0) // never seen
	if got := h.serve("s1", 20); got != 0 {
		t.Errorf("first request: target %d, want none", got)
	}
	h.wantTarget("s1", 20)
	h.wantTarget("s2", 0)
	h.wantTarget("", 0)
	// The router ignored the target and sent the next turn elsewhere: the
	// last send wins.
	if got := h.serve("s1", 30); got != 20 {
		t.Errorf("second turn: target %d, want 20", got)
	}
	h.wantTarget("s1", 30)
	// Only the requests still live (the wantTarget probes, never ended)
	// remain pending; the served ones were forgotten at completion.
	h.p.mu.Lock()
	for id := range h.p.pending {
		if id == "r2" || id == "r6" {
			t.Errorf("served request %s still pending", id)
		}
	}
	h.p.mu.Unlock()
}

func TestSessionAffinityBindsAtSentBeforeCompletion(t *testing.T) {
	h := newAffinity(t, nil)
	id, _ := h.classify("s")
	h.p.OnEvents([]shared.Event{{Kind: shared.EventSent, RequestID: id, Worker: 10, HasWorker: true}})
	h.wantTarget("s", 10) // a concurrent turn while the first is still decoding
}

func TestSessionAffinityAbortAndUnknownEvents(t *testing.T) {
	h := newAffinity(t, nil)
	id, _ := h.classify("s")
	h.p.OnEvents([]shared.Event{
		{Kind: shared.EventAborted, RequestID: id, Reason: "due time passed in queue"}, // ended without sent
		{Kind: shared.EventSent, RequestID: "stranger", Worker: 10, HasWorker: true},
		{Kind: shared.EventSent, RequestID: id, Worker: 10, HasWorker: true}, // after its end: unknown
	})
	h.wantTarget("s", 0)
	if n := h.p.sessions(); n != 0 {
		t.Errorf("%d bindings, want 0", n)
	}
	// Sent without a worker teaches nothing.
	id, _ = h.classify("t")
	h.p.OnEvents([]shared.Event{{Kind: shared.EventSent, RequestID: id}})
	h.wantTarget("t", 0)
	h.p.OnEvents(nil)
}

func TestSessionAffinityTTL(t *testing.T) {
	const ttl = 10 * time.Minute
	h := newAffinity(t, nil) // the default ttl
	h.serve("s", 20)
	h.clock.advance(ttl) // exactly ttl idle: still bound
	h.wantTarget("s", 20)
	h.clock.advance(ttl - time.Second) // a hit refreshed it
	h.wantTarget("s", 20)
	h.clock.advance(ttl + time.Nanosecond)
	h.wantTarget("s", 0)
	if n := h.p.sessions(); n != 0 {
		t.Errorf("expired binding kept: %d bindings", n)
	}

	// A completion on the bound worker refreshes the binding too.
	h2 := newAffinity(t, shared.Params{ParamTTL: time.Minute})
	id, _ := h2.classify("s")
	h2.p.OnEvents([]shared.Event{{Kind: shared.EventSent, RequestID: id, Worker: 30, HasWorker: true}})
	h2.clock.advance(50 * time.Second)
	h2.p.OnEvents([]shared.Event{{Kind: shared.EventCompleted, RequestID: id, Worker: 30, HasWorker: true}})
	h2.clock.advance(50 * time.Second)
	h2.wantTarget("s", 30)
	h2.clock.advance(61 * time.Second)
	h2.wantTarget("s", 0)
}

// Bindings are dated by the events' time, not by when the events arrive:
// a send heard a minute late (as a plugin may hear it, after a later
// request's clock) still expires ttl after it happened, and an event
// older than the binding's last use does not age it.
func TestSessionAffinityDatesByEventTime(t *testing.T) {
	h := newAffinity(t, shared.Params{ParamTTL: time.Minute})
	id, _ := h.classify("s")
	sentAt := h.clock.now()
	h.clock.advance(time.Minute) // delivery lags
	h.p.OnEvents([]shared.Event{{Kind: shared.EventSent, RequestID: id, Worker: 20, HasWorker: true, At: sentAt}})
	h.clock.advance(time.Second) // a minute and a second after the send
	h.wantTarget("s", 0)

	// A completion refreshes the binding as of its own time.
	h2 := newAffinity(t, shared.Params{ParamTTL: time.Minute})
	id, _ = h2.classify("s")
	h2.p.OnEvents([]shared.Event{{Kind: shared.EventSent, RequestID: id, Worker: 30, HasWorker: true, At: h2.clock.now()}})
	h2.clock.advance(50 * time.Second)
	doneAt := h2.clock.now()
	h2.clock.advance(50 * time.Second)
	h2.p.OnEvents([]shared.Event{{Kind: shared.EventCompleted, RequestID: id, Worker: 30, HasWorker: true, At: doneAt}})
	h2.clock.advance(10 * time.Second) // a minute after the completion: still bound
	id2, target := h2.classify("s")
	if target != 30 {
		t.Fatalf("a minute after the completion: target %d, want 30", target)
	}
	// That hit used the binding now; a late send of id2 dated before it
	// does not make it older.
	h2.p.OnEvents([]shared.Event{{Kind: shared.EventSent, RequestID: id2, Worker: 30, HasWorker: true, At: doneAt}})
	h2.clock.advance(time.Minute)
	h2.wantTarget("s", 30)
}

// The type declares that its classifiers listen, so that a plugin serving
// it out of process gets the lifecycle events.
func TestSessionAffinityTypeListens(t *testing.T) {
	if ti := SessionAffinityType(); !ti.Events {
		t.Error("SessionAffinityType().Events is false: served out of process, its classifiers would hear no event")
	}
}

func TestSessionAffinityRemovedWorker(t *testing.T) {
	h := newAffinity(t, nil)
	h.serve("a", 20)
	h.serve("b", 30)
	h.fleet.set(10, 30) // worker 20 leaves
	h.wantTarget("a", 0)
	h.wantTarget("b", 30)
	h.fleet.set(10, 20, 30) // and rejoins: the binding stays dropped
	h.wantTarget("a", 0)
	if n := h.p.sessions(); n != 1 {
		t.Errorf("%d bindings, want 1", n)
	}
	// Unsorted snapshots still find the worker.
	ws := []shared.WorkerInfo{{ID: 30}, {ID: 10}}
	h.fleet.ws.Store(&ws)
	h.wantTarget("b", 30)
	// An empty partition drops every binding it is asked about.
	h.fleet.set()
	h.wantTarget("b", 0)
}

func TestSessionAffinityLRU(t *testing.T) {
	h := newAffinity(t, shared.Params{ParamMaxSessions: int64(3)})
	for i, s := range []string{"a", "b", "c"} {
		h.serve(s, shared.WorkerID(10*(i+1)))
	}
	h.wantTarget("a", 10) // a is now the most recent; b the least
	h.serve("d", 10)      // evicts b
	h.wantTarget("b", 0)
	h.wantTarget("a", 10)
	h.wantTarget("c", 30)
	h.wantTarget("d", 10)
	if n := h.p.sessions(); n != 3 {
		t.Errorf("%d bindings, want 3", n)
	}
	// Rebinding an existing session neither grows nor evicts.
	h.serve("c", 20)
	h.wantTarget("a", 10)
	h.wantTarget("c", 20)
	h.wantTarget("d", 10)
	// Many sessions through a small table: never above the bound, and the
	// slots are reused.
	for i := range 1000 {
		h.serve(fmt.Sprintf("x%d", i), 10)
	}
	if n, slots := h.p.sessions(), len(h.p.slots); n != 3 || slots != 3 {
		t.Errorf("%d bindings in %d slots, want 3 in 3", n, slots)
	}
	h.wantTarget("x999", 10)
	h.wantTarget("x996", 0)
	h.p.mu.Lock()
	checkLRU(t, h.p)
	h.p.mu.Unlock()
}

func TestSessionAffinityExpiredReclaimed(t *testing.T) {
	h := newAffinity(t, shared.Params{ParamTTL: time.Minute})
	h.serve("old1", 10)
	h.serve("old2", 10)
	h.clock.advance(2 * time.Minute)
	h.serve("new", 20) // reclaims up to two expired bindings from the cold end
	if n := h.p.sessions(); n != 1 {
		t.Errorf("%d bindings, want 1 (expired ones reclaimed)", n)
	}
	h.wantTarget("new", 20)
}

func TestSessionAffinityPendingBound(t *testing.T) {
	h := newAffinity(t, shared.Params{ParamTTL: time.Minute})
	h.p.maxLive = 2
	lost1, _ := h.classify("a") // ends never reported
	h.classify("b")
	id, _ := h.classify("c") // full: not remembered
	h.p.OnEvents([]shared.Event{{Kind: shared.EventSent, RequestID: id, Worker: 10, HasWorker: true}})
	h.wantTarget("c", 0)
	h.clock.advance(2 * time.Minute) // the lost requests are now older than ttl
	id, _ = h.classify("c")          // sweeps them
	h.p.OnEvents([]shared.Event{{Kind: shared.EventSent, RequestID: id, Worker: 10, HasWorker: true}})
	h.wantTarget("c", 10)
	h.p.mu.Lock()
	_, kept := h.p.pending[lost1]
	h.p.mu.Unlock()
	if kept {
		t.Error("a request lost for over ttl was not swept")
	}
}

func TestSessionAffinityPartitionsIndependent(t *testing.T) {
	s, err := NewSessionAffinity(nil)
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{}
	f := newFleet(10, 20)
	pc := shared.PartitionContext{Model: "m", Role: shared.RolePrefill, Workers: f.workers, Now: clock.now}
	c1, _ := s.NewClassifier(pc)
	pc.Role = shared.RoleDecode
	c2, _ := s.NewClassifier(pc)
	ctx := context.Background()
	req := &shared.Request{ID: "r", SessionID: "s"}
	if _, err := c1.Classify(ctx, req); err != nil {
		t.Fatal(err)
	}
	c1.(shared.EventListener).OnEvents([]shared.Event{{Kind: shared.EventSent, RequestID: "r", Worker: 20, HasWorker: true}})
	if cl, _ := c1.Classify(ctx, &shared.Request{ID: "r2", SessionID: "s"}); cl.Target != 20 {
		t.Errorf("prefill partition: %+v, want target 20", cl)
	}
	if cl, _ := c2.Classify(ctx, &shared.Request{ID: "r3", SessionID: "s"}); cl.HasTarget {
		t.Errorf("decode partition saw prefill's binding: %+v", cl)
	}
	// The partition clock (PartitionContext.Now) drives the TTL.
	clock.advance(DefaultSessionTTL + time.Second)
	if cl, _ := c1.Classify(ctx, &shared.Request{ID: "r4", SessionID: "s"}); cl.HasTarget {
		t.Errorf("after ttl on the partition clock: %+v, want no target", cl)
	}
	// Without Workers, membership is unknown and bindings are kept.
	c3, _ := s.NewClassifier(shared.PartitionContext{Now: clock.now})
	_, _ = c3.Classify(ctx, &shared.Request{ID: "q", SessionID: "s"})
	c3.(shared.EventListener).OnEvents([]shared.Event{{Kind: shared.EventSent, RequestID: "q", Worker: 99, HasWorker: true}})
	if cl, _ := c3.Classify(ctx, &shared.Request{ID: "q2", SessionID: "s"}); cl.Target != 99 {
		t.Errorf("no Workers func: %+v, want target 99", cl)
	}
}

func TestSessionAffinityParams(t *testing.T) {
	tests := []struct {
		name      string
		params    shared.Params
		wantParam string
	}{
		{"defaults", nil, ""},
		{"schema defaults", ptr(SessionAffinityType()).WithDefaults(nil), ""},
		{"set", shared.Params{ParamTTL: 30 * time.Second, ParamMaxSessions: int64(1)}, ""},
		{"ttl 0", shared.Params{ParamTTL: time.Duration(0)}, ParamTTL},
		{"ttl negative", shared.Params{ParamTTL: -time.Second}, ParamTTL},
		{"max 0", shared.Params{ParamMaxSessions: int64(0)}, ParamMaxSessions},
		{"max huge", shared.Params{ParamMaxSessions: int64(1) << 40}, ParamMaxSessions},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkNew(t, SessionAffinityType(), tt.params, tt.wantParam) })
	}
	s, _ := NewSessionAffinity(ptr(SessionAffinityType()).WithDefaults(nil))
	if s.ttl != 10*time.Minute || s.maxSessions != 100_000 {
		t.Errorf("defaults: ttl %v, max %d; want 10m, 100000", s.ttl, s.maxSessions)
	}
}

func TestSessionAffinityHitNoAllocs(t *testing.T) {
	h := newAffinity(t, nil)
	h.serve("s", 20)
	req := &shared.Request{ID: "hit", SessionID: "s"}
	ctx := context.Background()
	sent := []shared.Event{{Kind: shared.EventSent, RequestID: "hit", Worker: 20, HasWorker: true}}
	done := []shared.Event{{Kind: shared.EventCompleted, RequestID: "hit", Worker: 20, HasWorker: true}}
	n := testing.AllocsPerRun(100, func() {
		cl, _ := h.p.Classify(ctx, req)
		if cl.Target != 20 {
			t.Fatalf("miss: %+v", cl)
		}
		h.p.OnEvents(sent)
		h.p.OnEvents(done)
	})
	if n != 0 {
		t.Errorf("hit with its events allocates %v per request, want 0", n)
	}
}

// TestSessionAffinityConcurrent runs classifies and event batches from many
// goroutines (under -race) while workers come and go; every target must be
// a worker that was in the partition at some point and bound for its
// session.
func TestSessionAffinityConcurrent(t *testing.T) {
	h := newAffinity(t, shared.Params{ParamMaxSessions: int64(64)})
	ctx := context.Background()
	events := make(chan shared.Event, 1024)
	var listener sync.WaitGroup
	listener.Add(1)
	go func() { // one goroutine per listener, batches
		defer listener.Done()
		batch := make([]shared.Event, 0, 32)
		for ev := range events {
			batch = append(batch, ev)
			if len(batch) == cap(batch) || len(events) == 0 {
				h.p.OnEvents(batch)
				batch = batch[:0]
			}
		}
		h.p.OnEvents(batch)
	}()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				session := fmt.Sprintf("s%d", (g*7+i)%100)
				// Session k is always served by worker 10*(k%3+1).
				var k int
				_, _ = fmt.Sscanf(session, "s%d", &k)
				w := shared.WorkerID(10 * (k%3 + 1))
				id := fmt.Sprintf("g%d-%d", g, i)
				cl, err := h.p.Classify(ctx, &shared.Request{ID: id, SessionID: session})
				if err != nil {
					t.Error(err)
					return
				}
				if cl.HasTarget && cl.Target != w {
					t.Errorf("session %s: target %d, want %d", session, cl.Target, w)
					return
				}
				events <- shared.Event{Kind: shared.EventSent, RequestID: id, Worker: w, HasWorker: true}
				events <- shared.Event{Kind: shared.EventCompleted, RequestID: id, Worker: w, HasWorker: true}
				if i%100 == 0 {
					h.clock.advance(time.Second)
				}
			}
		}()
	}
	wg.Wait()
	close(events)
	listener.Wait()
	if n := h.p.sessions(); n > 64 {
		t.Errorf("%d bindings, bound 64", n)
	}
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	if len(h.p.pending) != 0 {
		t.Errorf("%d requests still pending after all ended", len(h.p.pending))
	}
	checkLRU(t, h.p)
}

// checkLRU checks the list links and the index agree. Called with mu held.
func checkLRU(t *testing.T, p *affinityPartition) {
	t.Helper()
	seen := 0
	prev := ilist.None
	for i := p.lru.Front(); i != ilist.None; i = p.lru.Next(i) {
		b := p.slots[i]
		if p.lru.Prev(i) != prev {
			t.Fatalf("slot %d: prev %d, want %d", i, p.lru.Prev(i), prev)
		}
		if j, ok := p.index[b.session]; !ok || j != i {
			t.Fatalf("slot %d (%q) not indexed", i, b.session)
		}
		prev = i
		seen++
	}
	if prev != p.lru.Back() || seen != len(p.index) || seen+len(p.free) != len(p.slots) {
		t.Fatalf("list of %d ending at %d; tail %d, index %d, free %d, slots %d",
			seen, prev, p.lru.Back(), len(p.index), len(p.free), len(p.slots))
	}
}
