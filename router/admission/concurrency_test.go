package admission_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// testTimeout bounds every wait of these tests: generous, so that they
// pass on a saturated machine; reaching it is a hang, not slowness.
const testTimeout = time.Minute

// dispatcher runs c.Run until the test's cleanup (or stop), woken by wake.
type dispatcher struct {
	wake   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

func startDispatcher(t *testing.T, c *admission.Controller, wake chan struct{}) *dispatcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &dispatcher{wake: wake, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		c.Run(ctx, 5*time.Millisecond, wake)
	}()
	t.Cleanup(d.stop)
	return d
}

func (d *dispatcher) stop() {
	d.cancel()
	<-d.done
}

// poke wakes the dispatcher without blocking.
func poke(wake chan struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}

// tally is a listener counting each request's events by kind, checking
// that each request's events come in lifecycle order (sent? ->
// first_token? -> completed | aborted) and that OnEvents is never called
// concurrently with itself.
type tally struct {
	inCall     atomic.Bool
	concurrent atomic.Int64

	mu        sync.Mutex
	counts    map[string]map[shared.EventKind]int
	abortedAt map[string]bool // aborted with a worker
	state     map[string]int  // 0 none, 1 sent, 2 first token, 3 ended
	disorder  []string
	total     int
}

func newTally() *tally {
	return &tally{counts: map[string]map[shared.EventKind]int{}, abortedAt: map[string]bool{}, state: map[string]int{}}
}

func (l *tally) OnEvents(evs []shared.Event) {
	if !l.inCall.CompareAndSwap(false, true) {
		l.concurrent.Add(1)
	}
	defer l.inCall.Store(false)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range evs {
		l.total++
		m := l.counts[e.RequestID]
		if m == nil {
			m = map[shared.EventKind]int{}
			l.counts[e.RequestID] = m
		}
		m[e.Kind]++
		s := l.state[e.RequestID]
		ok := false
		switch e.Kind {
		case shared.EventSent:
			ok, s = s == 0 && e.HasWorker, 1
		case shared.EventFirstToken:
			ok, s = s == 1, 2
		case shared.EventCompleted:
			ok, s = s == 1 || s == 2, 3
		case shared.EventAborted:
			ok, s = s != 3 && e.HasWorker == (s != 0), 3
			if e.HasWorker {
				l.abortedAt[e.RequestID] = true
			}
		}
		if !ok {
			l.disorder = append(l.disorder, fmt.Sprintf("%s:%s after state %d", e.Kind, e.RequestID, l.state[e.RequestID]))
		}
		l.state[e.RequestID] = s
	}
}

func (l *tally) count(id string, k shared.EventKind) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[id][k]
}

func (l *tally) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.concurrent.Load(); n != 0 {
		t.Errorf("OnEvents was called %d times while another call was running", n)
	}
	if len(l.disorder) > 0 {
		t.Errorf("%d events out of lifecycle order, e.g. %v", len(l.disorder), l.disorder[:min(len(l.disorder), 5)])
	}
}

// TestCapacityHoldsUnderConcurrentAdmissions: 32 goroutines × 200
// requests against 4 workers of capacity 2, with the dispatcher running:
// no worker ever has more than 2 requests, every request is sent exactly
// once, and everything is released at the end.
func TestCapacityHoldsUnderConcurrentAdmissions(t *testing.T) {
	const goroutines, perGoroutine, workers, capacity = 32, 200, 4, 2
	r := newRouter(t, rrPolicy(), workers)
	l := newTally()
	wake := make(chan struct{}, 1)
	c := newController(t, r, admission.Options{Queue: capacityQueue(capacity), Listeners: []shared.EventListener{l},
		OnQueued: func() { poke(wake) }})
	d := startDispatcher(t, c, wake)
	ws := r.Workers("", shared.RoleAggregated)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	var over, queued, waited atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range perGoroutine {
				h, err := c.Admit(ctx, &shared.Request{ID: fmt.Sprintf("g%d-%d", g, i), Role: shared.RoleAggregated, PromptTokens: 8})
				if err != nil {
					errs <- err
					return
				}
				if h.Queued() {
					queued.Add(1)
				}
				dec, err := h.Wait(ctx)
				if err != nil {
					h.End(admission.Aborted("wait failed"))
					errs <- fmt.Errorf("%s: Wait: %w", h.Request().ID, err)
					return
				}
				waited.Add(1)
				if dec.Worker.ActiveRequests() > capacity {
					over.Add(1)
				}
				for _, w := range ws {
					if w.ActiveRequests() > capacity {
						over.Add(1)
					}
				}
				// Hold the slot while others admit.
				for range 8 {
					runtime.Gosched()
				}
				h.FirstToken()
				h.End(admission.Completed(16))
				poke(wake)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	d.stop()
	c.Close() // delivers every event emitted before
	if n := over.Load(); n != 0 {
		t.Errorf("a worker was seen %d times above its capacity of %d", n, capacity)
	}
	if n := waited.Load(); n != goroutines*perGoroutine {
		t.Errorf("%d requests dispatched, want %d", n, goroutines*perGoroutine)
	}
	t.Logf("%d of %d requests queued first", queued.Load(), goroutines*perGoroutine)
	l.check(t)
	for g := range goroutines {
		for i := range perGoroutine {
			id := fmt.Sprintf("g%d-%d", g, i)
			if s, f, a := l.count(id, shared.EventSent), l.count(id, shared.EventCompleted), l.count(id, shared.EventAborted); s != 1 || f != 1 || a != 0 {
				t.Fatalf("%s: sent %d, completed %d, aborted %d times; want once, once, never", id, s, f, a)
			}
		}
	}
	for id, n := range active(r) {
		if n != 0 {
			t.Errorf("worker %d: %d active requests at the end", id, n)
		}
	}
	if n := c.Queued(); n != 0 {
		t.Errorf("%d requests still queued", n)
	}
}

// TestEndRacingDispatch: requests cancelled while queued, as the
// dispatcher hands out the capacity that frees, leave no booking behind,
// are never sent, are heard aborted once; their Wait fails.
func TestEndRacingDispatch(t *testing.T) {
	const n = 300 // queued requests; every other one is cancelled
	r := newRouter(t, rrPolicy(), 2)
	l := newTally()
	wake := make(chan struct{}, 1)
	c := newController(t, r, admission.Options{Queue: capacityQueue(1), Listeners: []shared.EventListener{l},
		OnQueued: func() { poke(wake) }})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	admit := func(id string) *admission.Handle {
		h, err := c.Admit(ctx, &shared.Request{ID: id, Role: shared.RoleAggregated, PromptTokens: 8})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	holders := []*admission.Handle{admit("hold-1"), admit("hold-2")}
	hs := make([]*admission.Handle, n)
	for i := range hs {
		if hs[i] = admit(fmt.Sprintf("r%d", i)); !hs[i].Queued() {
			t.Fatalf("r%d not queued", i)
		}
	}
	d := startDispatcher(t, c, wake)
	// The cancelled requests of the first fifth end before any capacity
	// frees; the others race the dispatcher.
	early, earlyCancels := n/5, 0
	waitErrs := make([]error, n)
	var wg sync.WaitGroup
	for i, h := range hs {
		if i%2 == 0 {
			continue
		}
		wg.Go(func() { _, waitErrs[i] = h.Wait(ctx) })
		if i < early {
			h.End(admission.Aborted("client went away"))
			earlyCancels++
		}
	}
	for _, h := range holders {
		h.End(admission.Completed(8))
		poke(wake)
	}
	for i, h := range hs {
		wg.Go(func() {
			if i%2 == 1 {
				if i >= early {
					h.End(admission.Aborted("client went away"))
					poke(wake)
				}
				return
			}
			if _, err := h.Wait(ctx); err != nil {
				t.Errorf("r%d: Wait: %v", i, err)
			}
			h.End(admission.Completed(8))
			poke(wake)
		})
	}
	wg.Wait()
	d.stop()
	c.Close()
	l.check(t)
	whileQueued := 0
	for i, h := range hs {
		id := h.Request().ID
		sent, aborted, completed := l.count(id, shared.EventSent), l.count(id, shared.EventAborted), l.count(id, shared.EventCompleted)
		switch {
		case i%2 == 0:
			if sent != 1 || completed != 1 || aborted != 0 {
				t.Errorf("%s (kept): sent %d, completed %d, aborted %d", id, sent, completed, aborted)
			}
		case sent == 0:
			// Ended while queued.
			whileQueued++
			if aborted != 1 || completed != 0 || worker(h) != 0 || !errors.Is(waitErrs[i], admission.ErrEnded) {
				t.Errorf("%s (cancelled while queued): aborted %d, completed %d, on %d, Wait %v; want one aborted, no worker, ErrEnded",
					id, aborted, completed, worker(h), waitErrs[i])
			}
		default:
			// Dispatched before its End: sent, then aborted on its worker.
			if sent != 1 || aborted != 1 || !l.abortedAt[id] || i < early {
				t.Errorf("%s (cancelled after dispatch): sent %d, aborted %d (with worker %v)", id, sent, aborted, l.abortedAt[id])
			}
		}
	}
	if whileQueued < earlyCancels {
		t.Errorf("%d requests cancelled while queued, want at least the %d that ended before capacity freed", whileQueued, earlyCancels)
	}
	t.Logf("%d of %d cancelled requests ended while queued", whileQueued, n/2)
	for id, n := range active(r) {
		if n != 0 {
			t.Errorf("worker %d: %d active requests at the end", id, n)
		}
	}
	if c.Queued() != 0 || c.Waiting(shared.RoleAggregated) != 0 {
		t.Errorf("queued %d, waiting %d at the end", c.Queued(), c.Waiting(shared.RoleAggregated))
	}
}

// TestAsyncEventsInOrderAndCloseDelivers: with a delivery goroutine, each
// request's events arrive in lifecycle order, OnEvents never runs
// concurrently with itself, Close delivers every event emitted before it
// and stops the goroutine.
func TestAsyncEventsInOrderAndCloseDelivers(t *testing.T) {
	const goroutines, perGoroutine = 16, 100
	ignore := goleak.IgnoreCurrent()
	r := newRouter(t, rrPolicy(), 2)
	l := newTally()
	wake := make(chan struct{}, 1)
	c := newController(t, r, admission.Options{Queue: capacityQueue(2), Listeners: []shared.EventListener{l},
		OnQueued: func() { poke(wake) }})
	d := startDispatcher(t, c, wake)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	var emitted atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range perGoroutine {
				h, err := c.Admit(ctx, &shared.Request{ID: fmt.Sprintf("g%d-%d", g, i), Role: shared.RoleAggregated, PromptTokens: 8})
				if err != nil {
					t.Error(err)
					return
				}
				switch i % 3 {
				case 0: // completes
					if _, err := h.Wait(ctx); err != nil {
						t.Error(err)
						return
					}
					h.FirstToken()
					h.Progress(12)
					h.End(admission.Completed(12))
					emitted.Add(3)
				case 1: // fails before its first token
					if _, err := h.Wait(ctx); err != nil {
						t.Error(err)
						return
					}
					h.End(admission.Aborted("worker error"))
					emitted.Add(2)
				case 2: // the client leaves at once, queued or not
					h.End(admission.Aborted("client went away"))
					emitted.Add(1)
					if worker(h) != 0 {
						emitted.Add(1) // sent before it ended
					}
				}
				poke(wake)
			}
		})
	}
	wg.Wait()
	d.stop()
	c.Close()
	c.Close() // a second Close does nothing
	l.check(t)
	l.mu.Lock()
	total, states := l.total, len(l.state)
	for id, s := range l.state {
		if s != 3 {
			t.Errorf("%s never ended (state %d)", id, s)
		}
	}
	l.mu.Unlock()
	if want := emitted.Load(); int64(total) != want || states != goroutines*perGoroutine {
		t.Errorf("heard %d events of %d requests before Close returned, want %d of %d", total, states, want, goroutines*perGoroutine)
	}
	if n := c.DroppedEvents(); n != 0 {
		t.Errorf("%d events dropped", n)
	}
	if _, err := c.Admit(ctx, &shared.Request{ID: "late", Role: shared.RoleAggregated}); !errors.Is(err, admission.ErrClosed) {
		t.Errorf("Admit after Close: %v, want ErrClosed", err)
	}
	goleak.VerifyNone(t, ignore)
}

// partitionFactory records the partitions it made classifiers for; its
// classifiers classify nothing.
type partitionFactory struct {
	mu    sync.Mutex
	parts []shared.PartitionContext
}

func (*partitionFactory) Inputs() shared.Inputs { return 0 }
func (f *partitionFactory) NewClassifier(pc shared.PartitionContext) (shared.Classifier, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.parts = append(f.parts, pc)
	return noClass{}, nil
}

type noClass struct{}

func (noClass) Classify(context.Context, *shared.Request) (shared.Classification, error) {
	return shared.Classification{}, nil
}

// TestClassifierPerPartition: concurrent admissions for two models and
// two roles make exactly one classifier per (model, role), each told its
// partition; its Progress follows a live request.
func TestClassifierPerPartition(t *testing.T) {
	r, err := router.New(router.Options{BlockSize: 4, BookingsAreLoad: true,
		Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: rrPolicy(), shared.RolePrefill: rrPolicy()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	models := []string{"m1", "m2"}
	roles := []shared.Role{shared.RoleAggregated, shared.RolePrefill}
	if _, err := r.AddWorkers(
		fleet.Spec{ID: 1, Role: shared.RoleAggregated, TotalKVBlocks: 100, Models: models},
		fleet.Spec{ID: 2, Role: shared.RolePrefill, TotalKVBlocks: 100, Models: models},
	); err != nil {
		t.Fatal(err)
	}
	f := &partitionFactory{}
	c := newController(t, r, admission.Options{Classifier: f, InlineEvents: true})
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 50 {
				req := &shared.Request{ID: fmt.Sprintf("g%d-%d", g, i), Model: models[(g+i)%2], Role: roles[(g+i/2)%2], PromptTokens: 8}
				h, err := c.Admit(ctx, req)
				if err != nil {
					t.Error(err)
					return
				}
				h.End(admission.Completed(8))
			}
		})
	}
	wg.Wait()
	f.mu.Lock()
	var got []string
	for _, pc := range f.parts {
		got = append(got, pc.Model+"/"+string(pc.Role))
		if pc.BlockSize != 4 || pc.Progress == nil || pc.Workers == nil || pc.Now == nil {
			t.Errorf("partition %s/%s: incomplete context %+v", pc.Model, pc.Role, pc)
		}
	}
	parts := slices.Clone(f.parts)
	f.mu.Unlock()
	slices.Sort(got)
	want := []string{"m1/aggregated", "m1/prefill", "m2/aggregated", "m2/prefill"}
	if !slices.Equal(got, want) {
		t.Fatalf("NewClassifier calls %v, want one for each of %v", got, want)
	}
	for _, pc := range parts {
		if ws := pc.Workers(); len(ws) != 1 || (pc.Role == shared.RoleAggregated) != (ws[0].ID == 1) {
			t.Errorf("partition %s/%s: workers %+v", pc.Model, pc.Role, ws)
		}
	}

	// Progress: the prompt at Admit, then what Handle.Progress reports
	// (never less), false once the request ended.
	progress := parts[0].Progress
	h, err := c.Admit(ctx, &shared.Request{ID: "p", Model: "m1", Role: shared.RoleAggregated, PromptTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := progress("p"); !ok || n != 8 {
		t.Fatalf("Progress at admission = %d, %v; want the prompt's 8", n, ok)
	}
	h.Progress(20)
	h.Progress(15)
	if n, ok := progress("p"); !ok || n != 20 {
		t.Fatalf("Progress = %d, %v; want 20", n, ok)
	}
	h.End(admission.Completed(20))
	if n, ok := progress("p"); ok {
		t.Fatalf("Progress after End = %d, true; want false", n)
	}
	if _, ok := progress("never"); ok {
		t.Fatal("Progress of an unknown id is true")
	}
}

// TestUnknownModelMakesNoClassifier: model names come from clients, so a
// request for a model no worker serves is refused with shared.ErrNoWorkers
// without making a classifier partition for it (each new name used to
// make one, and copy every earlier one: memory and time without bound);
// its id is free again, and a served model still gets its partition.
func TestUnknownModelMakesNoClassifier(t *testing.T) {
	r, err := router.New(router.Options{BlockSize: 4, BookingsAreLoad: true,
		Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: rrPolicy()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	if _, err := r.AddWorker(fleet.Spec{ID: 1, Role: shared.RoleAggregated, TotalKVBlocks: 100, Models: []string{"m1"}}); err != nil {
		t.Fatal(err)
	}
	f := &partitionFactory{}
	c := newController(t, r, admission.Options{Classifier: f, InlineEvents: true})
	ctx := context.Background()
	for i := range 200 {
		req := &shared.Request{ID: fmt.Sprintf("u%d", i), Model: fmt.Sprintf("nobody-serves-%d", i), Role: shared.RoleAggregated, PromptTokens: 8}
		if h, err := c.Admit(ctx, req); !errors.Is(err, shared.ErrNoWorkers) {
			t.Fatalf("Admit(%s) = %v, %v; want shared.ErrNoWorkers", req.Model, h, err)
		}
	}
	f.mu.Lock()
	n := len(f.parts)
	f.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d classifier partitions made for models no worker serves, want 0", n)
	}
	h, err := c.Admit(ctx, &shared.Request{ID: "u0", Model: "m1", Role: shared.RoleAggregated, PromptTokens: 8})
	if err != nil {
		t.Fatalf("Admit(m1) under a refused request's id: %v", err)
	}
	h.End(admission.Completed(8))
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.parts) != 1 || f.parts[0].Model != "m1" {
		t.Fatalf("partitions %+v, want one for m1", f.parts)
	}
}

// funcFactory is a classifier factory of a type that cannot be compared
// (a func type); made counts its NewClassifier calls.
type funcFactory func(*shared.Request) (shared.Classification, error)

var made atomic.Int64

func (funcFactory) Inputs() shared.Inputs { return 0 }
func (f funcFactory) NewClassifier(shared.PartitionContext) (shared.Classifier, error) {
	made.Add(1)
	return f, nil
}
func (f funcFactory) Classify(_ context.Context, req *shared.Request) (shared.Classification, error) {
	return f(req)
}

// TestOptionsClassifierOfAnyTypeMadeOnce: Options.Classifier is made
// once per partition also when its type cannot be compared.
func TestOptionsClassifierOfAnyTypeMadeOnce(t *testing.T) {
	made.Store(0)
	f := funcFactory(func(*shared.Request) (shared.Classification, error) { return shared.Classification{Priority: 7}, nil })
	e := newEnv(t, 1, capacityQueue(0), f)
	for i := range 10 {
		h := e.admit(t, fmt.Sprint(i))
		if h.Classification().Priority != 7 {
			t.Fatalf("classification %+v, want priority 7", h.Classification())
		}
		h.End(admission.Completed(8))
	}
	if n := made.Load(); n != 1 {
		t.Fatalf("NewClassifier called %d times for one partition, want 1", n)
	}
}

// gatePicker picks the first candidate; when armed for an id, a pick for
// that id signals entered and waits for release (a dispatch in the middle
// of a placement).
type gatePicker struct {
	gateID  atomic.Pointer[string]
	entered chan struct{}
	release chan struct{}
}

func newGatePicker() *gatePicker {
	return &gatePicker{entered: make(chan struct{}), release: make(chan struct{})}
}

func (*gatePicker) Inputs() shared.Inputs { return 0 }
func (p *gatePicker) Pick(_ context.Context, req *shared.Request, _ *shared.Candidates) (int, error) {
	if id := p.gateID.Load(); id != nil && *id == req.ID && p.gateID.CompareAndSwap(id, nil) {
		close(p.entered)
		<-p.release
	}
	return 0, nil
}

func (p *gatePicker) arm(id string) { p.gateID.Store(&id) }

// gateEnv is two workers of capacity 1 with the first-candidate picker:
// "w1" on worker 1 and "w2" on worker 2, "x" queued.
func gateEnv(t *testing.T) (*env, *gatePicker, *admission.Handle, *admission.Handle, *admission.Handle) {
	t.Helper()
	p := newGatePicker()
	e := newEnvWith(t, &policy.Policy{Name: "first", PickerName: "gate", Picker: p}, 2, capacityQueue(1), nil)
	w1, w2, x := e.admit(t, "w1"), e.admit(t, "w2"), e.admit(t, "x")
	if worker(w1) != 1 || worker(w2) != 2 || !x.Queued() {
		t.Fatalf("w1 on %d, w2 on %d, x queued %v", worker(w1), worker(w2), x.Queued())
	}
	return e, p, w1, w2, x
}

// dispatchAsync runs one Dispatch in a goroutine and returns its result's
// channel.
func dispatchAsync(c *admission.Controller) chan []*admission.Handle {
	out := make(chan []*admission.Handle, 1)
	go func() { out <- c.Dispatch(context.Background(), nil) }()
	return out
}

// TestEndWhileDispatchPlacesIt: a queued request that ends while a
// dispatch is placing it is not sent and its booking is released.
func TestEndWhileDispatchPlacesIt(t *testing.T) {
	e, p, w1, w2, x := gateEnv(t)
	p.arm("x")
	w2.End(admission.Completed(8))
	out := dispatchAsync(e.c)
	<-p.entered
	x.End(admission.Aborted("client went away"))
	close(p.release)
	if got := <-out; len(got) != 0 {
		t.Fatalf("dispatched %v after x ended", got)
	}
	if _, err := x.Wait(context.Background()); !errors.Is(err, admission.ErrEnded) {
		t.Fatalf("x.Wait = %v, want ErrEnded", err)
	}
	if got := active(e.r); got[1] != 1 || got[2] != 0 {
		t.Fatalf("active requests %v: want w1's on 1, none on 2", got)
	}
	if e.c.Queued() != 0 {
		t.Fatalf("%d queued", e.c.Queued())
	}
	w1.End(admission.Completed(8))
	want := []string{"sent:w1@1", "sent:w2@2", "completed:w2@2", "aborted:x", "completed:w1@1"}
	if diff := cmp.Diff(want, e.rec.events()); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
}

// TestIDReusedWhileDispatchPlacesIt: a queued request ends while a
// dispatch is placing it, and a new request under the same id queues
// before the dispatch finishes. The dispatch must not take the new
// request out of the queue in the old one's place.
func TestIDReusedWhileDispatchPlacesIt(t *testing.T) {
	e, p, w1, w2, x := gateEnv(t)
	p.arm("x")
	w2.End(admission.Completed(8))
	out := dispatchAsync(e.c)
	<-p.entered
	x.End(admission.Aborted("client went away"))
	// The client sends x again; worker 2 is excluded, so it queues for 1.
	again := e.admit(t, "x", admission.Exclude(2))
	if !again.Queued() {
		t.Fatalf("the second x is on %d, want it queued", worker(again))
	}
	close(p.release)
	if got := <-out; len(got) != 0 {
		t.Fatalf("dispatched %v after x ended", got)
	}
	if !again.Queued() || e.c.Queued() != 1 || e.c.Waiting(shared.RoleAggregated) != 1 {
		t.Fatalf("the second x: queued %v; queue holds %d (waiting %d), want it", again.Queued(), e.c.Queued(), e.c.Waiting(shared.RoleAggregated))
	}
	w1.End(admission.Completed(8))
	if got := e.c.Dispatch(context.Background(), nil); len(got) != 1 || got[0] != again || worker(again) != 1 {
		t.Fatalf("dispatch = %v, the second x on %d; want it on 1", got, worker(again))
	}
	again.End(admission.Completed(8))
	if got := active(e.r); got[1] != 0 || got[2] != 0 {
		t.Fatalf("active requests %v at the end", got)
	}
}

// TestDispatchWithAnEndedContextRefusesNothing: the dispatcher's context
// is not the queued requests'; when it ends, they stay queued.
func TestDispatchWithAnEndedContextRefusesNothing(t *testing.T) {
	e := newEnv(t, 1, capacityQueue(1), nil)
	busy := e.admit(t, "busy")
	q := e.admit(t, "q")
	busy.End(admission.Completed(8))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if out := e.c.Dispatch(ctx, nil); len(out) != 0 || !q.Queued() || q.Err() != nil {
		t.Fatalf("Dispatch with an ended context: %v; q queued %v, err %v", out, q.Queued(), q.Err())
	}
	if out := e.c.Dispatch(context.Background(), nil); len(out) != 1 || out[0] != q || worker(q) != 1 {
		t.Fatalf("dispatch = %v, q on %d", out, worker(q))
	}
}
