package admission_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// Every test stops what it started: the delivery goroutine of each
// Controller with InlineEvents false (Close), and every Run.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// classifier is a classifier factory that is its own classifier: f
// answers, calls counts the Classify calls.
type classifier struct {
	f     func(req *shared.Request) (shared.Classification, error)
	calls atomic.Int64
}

func classifyWith(f func(req *shared.Request) (shared.Classification, error)) *classifier {
	return &classifier{f: f}
}

func (*classifier) Inputs() shared.Inputs { return 0 }
func (c *classifier) NewClassifier(shared.PartitionContext) (shared.Classifier, error) {
	return c, nil
}
func (c *classifier) Classify(_ context.Context, req *shared.Request) (shared.Classification, error) {
	c.calls.Add(1)
	return c.f(req)
}

// recorder is an event listener keeping "kind:id@worker" lines.
type recorder struct {
	mu  sync.Mutex
	got []string
}

func (r *recorder) OnEvents(evs []shared.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range evs {
		s := e.Kind.String() + ":" + e.RequestID
		if e.HasWorker {
			s += fmt.Sprintf("@%d", e.Worker)
		}
		r.got = append(r.got, s)
	}
}

func (r *recorder) events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

func rrPolicy() *policy.Policy {
	return &policy.Policy{Name: "rr", PickerName: "pick", Picker: builtin.NewRoundRobin()}
}

func kvPolicy(t *testing.T) *policy.Policy {
	t.Helper()
	kv, err := builtin.NewKVCost(nil)
	if err != nil {
		t.Fatal(err)
	}
	mc, err := builtin.NewMinCost(shared.Params{builtin.ParamSeed: int64(1)})
	if err != nil {
		t.Fatal(err)
	}
	return &policy.Policy{Name: "kv", Scorers: []policy.WeightedScorer{{Name: "cost", Weight: 1, Scorer: kv}}, PickerName: "pick", Picker: mc}
}

// newRouter is a router with block size 4 and workers 1..n of role
// aggregated, deciding with p.
func newRouter(t *testing.T, p *policy.Policy, workers int) *router.Router {
	t.Helper()
	r, err := router.New(router.Options{BlockSize: 4, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: p}, BookingsAreLoad: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	for i := range workers {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Role: shared.RoleAggregated, TotalKVBlocks: 100}); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func newController(t *testing.T, r *router.Router, o admission.Options) *admission.Controller {
	t.Helper()
	c, err := admission.New(r, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// env is a Controller over a round-robin router, with inline events
// recorded and a fake clock.
type env struct {
	r   *router.Router
	c   *admission.Controller
	rec *recorder
	now time.Time
}

func newEnv(t *testing.T, workers int, q config.Queue, cls shared.ClassifierFactory) *env {
	t.Helper()
	return newEnvWith(t, rrPolicy(), workers, q, cls)
}

func newEnvWith(t *testing.T, p *policy.Policy, workers int, q config.Queue, cls shared.ClassifierFactory) *env {
	t.Helper()
	e := &env{rec: &recorder{}, now: time.Unix(1000, 0)}
	e.r = newRouter(t, p, workers)
	e.c = newController(t, e.r, admission.Options{Queue: q, Classifier: cls, Listeners: []shared.EventListener{e.rec},
		Now: func() time.Time { return e.now }, InlineEvents: true})
	return e
}

func (e *env) admit(t *testing.T, id string, opts ...admission.Option) *admission.Handle {
	t.Helper()
	h, err := e.c.Admit(context.Background(), &shared.Request{ID: id, Role: shared.RoleAggregated, PromptTokens: 8}, opts...)
	if err != nil {
		t.Fatalf("Admit(%s): %v", id, err)
	}
	return h
}

func capacityQueue(capacity int) config.Queue {
	q := config.DefaultQueue()
	q.MaxActiveRequests = capacity
	return q
}

// worker returns the handle's worker id, 0 when it has none.
func worker(h *admission.Handle) shared.WorkerID {
	if d := h.Decision(); d.Worker != nil {
		return d.Worker.ID
	}
	return 0
}

// active is every worker's ActiveRequests, by id.
func active(r *router.Router) map[shared.WorkerID]int64 {
	m := map[shared.WorkerID]int64{}
	for _, w := range r.Workers("", shared.RoleAggregated) {
		m[w.ID] = w.ActiveRequests()
	}
	return m
}

func TestQueuesAtCapacityAndDispatchesWhenFreed(t *testing.T) {
	e := newEnv(t, 2, capacityQueue(1), nil)
	a, b, c := e.admit(t, "a"), e.admit(t, "b"), e.admit(t, "c")
	if a.Queued() || b.Queued() || !c.Queued() {
		t.Fatalf("queued: a %v b %v c %v; want only c", a.Queued(), b.Queued(), c.Queued())
	}
	if got := e.c.Waiting(shared.RoleAggregated); got != 1 {
		t.Fatalf("waiting = %d", got)
	}
	if out := e.c.Dispatch(context.Background(), nil); len(out) != 0 {
		t.Fatalf("dispatched %d with no capacity free", len(out))
	}
	e.now = e.now.Add(3 * time.Second)
	a.FirstToken()
	a.End(admission.Completed(20))
	out := e.c.Dispatch(context.Background(), nil)
	if len(out) != 1 || out[0] != c || c.Waited() != 3*time.Second || worker(c) != worker(a) || c.Err() != nil {
		t.Fatalf("dispatch = %v: c waited %v on %d (err %v); want c after 3s on %d", out, c.Waited(), worker(c), c.Err(), worker(a))
	}
	if d, err := c.Wait(context.Background()); err != nil || d.Worker.ID != worker(a) {
		t.Fatalf("c.Wait = %+v, %v", d, err)
	}
	if e.c.Queued() != 0 || e.c.Waiting(shared.RoleAggregated) != 0 {
		t.Fatalf("queued %d, waiting %d after the dispatch", e.c.Queued(), e.c.Waiting(shared.RoleAggregated))
	}
	want := []string{"sent:a@1", "sent:b@2", "first_token:a@1", "completed:a@1", "sent:c@1"}
	if diff := cmp.Diff(want, e.rec.events()); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	// A completed id may come back; a live one may not.
	e.admit(t, "a")
	h, err := e.c.Admit(context.Background(), &shared.Request{ID: "b", Role: shared.RoleAggregated})
	if !errors.Is(err, admission.ErrDuplicateRequest) || h != nil {
		t.Fatalf("duplicate live id: handle %v, err = %v", h, err)
	}
	if got := worker(b); got != 2 || b.Queued() {
		t.Fatalf("the refused duplicate moved b: on %d, queued %v", got, b.Queued())
	}
}

// The same classifier failure on two requests reads the same: the error
// text carries no request id (ClassifyError.RequestID does), so callers
// can group refusals by it.
func TestClassifierFailureTextHasNoRequestID(t *testing.T) {
	c := classifyWith(func(req *shared.Request) (shared.Classification, error) {
		if req.ID[0] == 'p' {
			panic("classifier bug")
		}
		return shared.Classification{}, errors.New("no such tenant")
	})
	e := newEnv(t, 1, config.DefaultQueue(), c)
	for _, tt := range []struct {
		ids  [2]string
		want string
	}{
		{[2]string{"e1", "e2"}, "classifier request_classifier: no such tenant"},
		{[2]string{"p1", "p2"}, "classifier request_classifier: panic: classifier bug"},
	} {
		for _, id := range tt.ids {
			_, err := e.c.Admit(context.Background(), &shared.Request{ID: id, Role: shared.RoleAggregated})
			var ce *admission.ClassifyError
			if !errors.As(err, &ce) || ce.RequestID != id || err.Error() != tt.want {
				t.Fatalf("%s: err = %v, want a *admission.ClassifyError reading %q", id, err, tt.want)
			}
		}
	}
}

func TestClassifierFailureFailsOnlyThatRequest(t *testing.T) {
	c := classifyWith(func(req *shared.Request) (shared.Classification, error) {
		switch req.ID {
		case "err":
			return shared.Classification{}, errors.New("no such tenant")
		case "panic":
			panic("classifier bug")
		}
		return shared.Classification{Priority: 3}, nil
	})
	e := newEnv(t, 1, config.DefaultQueue(), c)
	for _, id := range []string{"err", "panic"} {
		h, err := e.c.Admit(context.Background(), &shared.Request{ID: id, Role: shared.RoleAggregated})
		var ce *admission.ClassifyError
		if !errors.As(err, &ce) || ce.RequestID != id || h != nil {
			t.Fatalf("%s: handle %v, err = %v; want a *admission.ClassifyError", id, h, err)
		}
		// A failed request never became live.
		if _, live := e.c.Progress(id); live {
			t.Fatalf("%s is live after its classifier failed", id)
		}
	}
	h := e.admit(t, "ok")
	if h.Classification().Priority != 3 || h.Request().Priority != 3 || h.Queued() || worker(h) != 1 {
		t.Fatalf("the classifier must keep serving: class %+v, queued %v, on %d", h.Classification(), h.Queued(), worker(h))
	}
	if diff := cmp.Diff([]string{"sent:ok@1"}, e.rec.events()); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
}

func TestDueTimeRefusesQueuedRequests(t *testing.T) {
	due := time.Unix(1005, 0)
	c := classifyWith(func(req *shared.Request) (shared.Classification, error) {
		if req.ID == "late" {
			return shared.Classification{DueAt: due}, nil
		}
		return shared.Classification{}, nil
	})
	e := newEnv(t, 1, capacityQueue(1), c)
	busy := e.admit(t, "busy")
	late := e.admit(t, "late")
	if !late.Queued() {
		t.Fatal("late not queued")
	}
	e.now = due.Add(time.Millisecond)
	out := e.c.Dispatch(context.Background(), nil)
	if len(out) != 1 || out[0] != late || !errors.Is(late.Err(), admission.ErrDue) || late.Waited() != 5*time.Second+time.Millisecond {
		t.Fatalf("dispatch = %v: late err %v, waited %v", out, late.Err(), late.Waited())
	}
	if d, err := late.Wait(context.Background()); !errors.Is(err, admission.ErrDue) || d.Worker != nil {
		t.Fatalf("late.Wait = %+v, %v; want ErrDue", d, err)
	}
	want := []string{"sent:busy@1", "aborted:late"} // a request can end without sent
	if diff := cmp.Diff(want, e.rec.events()); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	if _, live := e.c.Progress("late"); live || e.c.Queued() != 0 {
		t.Fatalf("late is still live (%v) or queued (%d)", live, e.c.Queued())
	}
	// End after the refusal does nothing: no event, no release of
	// another request's booking.
	late.End(admission.Aborted("client went away"))
	if diff := cmp.Diff(want, e.rec.events()); diff != "" {
		t.Fatalf("events after End (-want +got):\n%s", diff)
	}
	if got := active(e.r)[1]; got != 1 {
		t.Fatalf("worker 1 has %d active requests, want busy's 1", got)
	}
	busy.End(admission.Completed(8))
	if got := active(e.r)[1]; got != 0 {
		t.Fatalf("worker 1 has %d active requests after busy ended", got)
	}
}

// A refusal for a full queue reads the same for every request, so that a
// replay's rejection reasons count them under one reason (the caller knows
// which request it admitted).
func TestQueueFullSameReasonForEveryRequest(t *testing.T) {
	q := capacityQueue(1)
	q.MaxWaiting = 1
	e := newEnv(t, 1, q, nil)
	e.admit(t, "a")
	e.admit(t, "b")
	for _, id := range []string{"c", "d"} {
		_, err := e.c.Admit(context.Background(), &shared.Request{ID: id, Role: shared.RoleAggregated, PromptTokens: 8})
		if !errors.Is(err, admission.ErrQueueFull) || err.Error() != admission.ErrQueueFull.Error() {
			t.Fatalf("request %s: err %q, want exactly %q", id, err, admission.ErrQueueFull)
		}
	}
}

func TestQueueFull(t *testing.T) {
	q := capacityQueue(1)
	q.MaxWaiting = 1
	e := newEnv(t, 1, q, nil)
	e.admit(t, "a")
	e.admit(t, "b")
	h, err := e.c.Admit(context.Background(), &shared.Request{ID: "c", Role: shared.RoleAggregated, PromptTokens: 8})
	if !errors.Is(err, admission.ErrQueueFull) {
		t.Fatalf("err = %v, want ErrQueueFull", err)
	}
	// The refused request's handle has ended, its classification readable.
	if h == nil || h.Queued() || h.Classification().SchedulingCostTokens != 8 {
		t.Fatalf("handle %v: want an ended handle charging 8 uncached tokens", h)
	}
	if _, err := h.Wait(context.Background()); !errors.Is(err, admission.ErrQueueFull) {
		t.Fatalf("c.Wait: %v, want ErrQueueFull", err)
	}
	if _, live := e.c.Progress("c"); live || e.c.Waiting(shared.RoleAggregated) != 1 {
		t.Fatalf("c live %v; waiting %d, want b's 1", live, e.c.Waiting(shared.RoleAggregated))
	}
	if diff := cmp.Diff([]string{"sent:a@1", "aborted:c"}, e.rec.events()); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
}

func TestAdvisoryTarget(t *testing.T) {
	c := classifyWith(func(req *shared.Request) (shared.Classification, error) {
		switch req.ID {
		case "pinned":
			return shared.Classification{Target: 3, HasTarget: true}, nil
		case "gone":
			return shared.Classification{Target: 99, HasTarget: true}, nil
		}
		return shared.Classification{}, nil
	})
	e := newEnv(t, 3, config.DefaultQueue(), c)
	if h := e.admit(t, "pinned"); worker(h) != 3 || !h.Decision().Target {
		t.Fatalf("pinned went to %d (target %v), want 3", worker(h), h.Decision().Target)
	}
	// A target that is not a candidate is ignored: the policy decides.
	if h := e.admit(t, "gone"); h.Decision().Target || worker(h) != 1 {
		t.Fatalf("gone went to %d (target %v), want the policy's 1", worker(h), h.Decision().Target)
	}
}

// An explicit pin in the request wins over the classifier's target.
func TestPinWinsOverTarget(t *testing.T) {
	c := classifyWith(func(*shared.Request) (shared.Classification, error) {
		return shared.Classification{Target: 3, HasTarget: true}, nil
	})
	e := newEnv(t, 3, config.DefaultQueue(), c)
	h, err := e.c.Admit(context.Background(), &shared.Request{ID: "p", Role: shared.RoleAggregated, Pin: 2, HasPin: true})
	if err != nil {
		t.Fatal(err)
	}
	if worker(h) != 2 || !h.Decision().Target {
		t.Fatalf("pinned request went to %d (target %v), want 2", worker(h), h.Decision().Target)
	}
}

// listeningPicker is a round-robin picker that also wants lifecycle events.
type listeningPicker struct {
	*builtin.RoundRobin
	recorder
}

func TestPolicyComponentsHearLifecycleEvents(t *testing.T) {
	lp := &listeningPicker{RoundRobin: builtin.NewRoundRobin()}
	r := newRouter(t, &policy.Policy{Name: "rr", PickerName: "pick", Picker: lp}, 2)
	c := newController(t, r, admission.Options{InlineEvents: true})
	h, err := c.Admit(context.Background(), &shared.Request{ID: "x", Role: shared.RoleAggregated, PromptTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	h.FirstToken()
	h.FirstToken() // recorded once
	h.End(admission.Aborted("client went away"))
	h.End(admission.Completed(4)) // idempotent
	if diff := cmp.Diff([]string{"sent:x@1", "first_token:x@1", "aborted:x@1"}, lp.events()); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
}

// A class the queue does not have fails the request even when a worker is
// free, so a typo in a classifier's configuration shows at once.
func TestUnknownClass(t *testing.T) {
	c := classifyWith(func(*shared.Request) (shared.Classification, error) {
		return shared.Classification{PolicyClass: "bulk"}, nil
	})
	e := newEnv(t, 2, config.DefaultQueue(), c)
	h, err := e.c.Admit(context.Background(), &shared.Request{ID: "a", Role: shared.RoleAggregated})
	// The text names no request id: replay counts rejections by it, and
	// serve and the EPP answer it to clients.
	if !errors.Is(err, admission.ErrUnknownClass) || err.Error() != `unknown policy class "bulk" (queue classes: default)` || h != nil {
		t.Fatalf("handle %v, err = %v", h, err)
	}
	if _, live := e.c.Progress("a"); live || len(e.rec.events()) != 0 {
		t.Fatalf("a is live (%v) or was heard of: %v", live, e.rec.events())
	}
}

// A reload that changes the request_classifier takes effect for the next
// admission; the old bundle's classifier is not called again.
func TestReloadSwapsTheClassifier(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.hcl")
	policy := func(priority int) {
		t.Helper()
		src := fmt.Sprintf("request_classifier {\n  type             = \"header-priority\"\n  default_priority = %d\n}\n", priority)
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	policy(1)
	b, diags := loader.LoadBundle(context.Background(), path, loader.LoadOptions{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	r, err := router.New(router.Options{Bundle: b.Bundle})
	if err != nil {
		_ = b.Close(context.Background())
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	x, err := loader.NewReloader(r, loader.ReloadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.AddWorker(fleet.Spec{ID: 1, Role: shared.RoleAggregated, TotalKVBlocks: 10}); err != nil {
		t.Fatal(err)
	}
	c := newController(t, r, admission.Options{InlineEvents: true})
	admit := func(id string) int {
		t.Helper()
		h, err := c.Admit(context.Background(), &shared.Request{ID: id, Role: shared.RoleAggregated, PromptTokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		defer h.End(admission.Completed(4))
		return h.Classification().Priority
	}
	if got := admit("a"); got != 1 {
		t.Fatalf("priority before reload = %d, want 1", got)
	}
	policy(2)
	if diags := x.Reload(context.Background(), path); diags.HasErrors() {
		t.Fatal(diags)
	}
	if got := admit("b"); got != 2 {
		t.Fatalf("priority after reload = %d, want 2", got)
	}
}

// prompt is a request of 64 tokens sharing one 16-block prefix.
func prompt(id string) *shared.Request {
	return &shared.Request{ID: id, Role: shared.RoleAggregated, PromptTokens: 64,
		BlockHashes: prefix.ChainHashes(nil, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})}
}

// TestExcludeAvoidsTheFailedWorker: the prefix index recorded a prompt as
// sent to a worker, so the KV-aware policy picks that worker again;
// excluded, it picks another.
func TestExcludeAvoidsTheFailedWorker(t *testing.T) {
	e := newEnvWith(t, kvPolicy(t), 3, config.DefaultQueue(), nil)
	ctx := context.Background()
	admit := func(id string, opts ...admission.Option) (*admission.Handle, error) {
		return e.c.Admit(ctx, prompt(id), opts...)
	}
	first, err := admit("x#0")
	if err != nil {
		t.Fatal(err)
	}
	failed := worker(first)
	first.End(admission.Aborted("worker error"))
	again, err := admit("x#1")
	if err != nil {
		t.Fatal(err)
	}
	if worker(again) != failed || again.Decision().OverlapBlocks == 0 {
		t.Fatalf("without Exclude the request went to %d (overlap %d); the test needs the policy to pick the failed %d again",
			worker(again), again.Decision().OverlapBlocks, failed)
	}
	again.End(admission.Aborted("worker error"))
	retry, err := admit("x#2", admission.Exclude(failed))
	if err != nil {
		t.Fatal(err)
	}
	second := worker(retry)
	if second == failed {
		t.Fatalf("the request excluding %d went to it", failed)
	}
	retry.End(admission.Aborted("worker error"))
	// Excluding two of three leaves the third.
	last, err := admit("x#3", admission.Exclude(failed), admission.Exclude(second))
	if err != nil {
		t.Fatal(err)
	}
	if got := worker(last); got == failed || got == second {
		t.Fatalf("excluding %d and %d went to %d", failed, second, got)
	}
	last.End(admission.Completed(64))
	// Excluding every candidate fails the request, which is not live after.
	h, err := admit("x#4", admission.Exclude(1, 2, 3))
	if !errors.Is(err, router.ErrAllExcluded) || !errors.Is(err, shared.ErrNoWorkers) {
		t.Fatalf("every worker excluded: err = %v, want ErrAllExcluded (an ErrNoWorkers)", err)
	}
	if _, werr := h.Wait(ctx); !errors.Is(werr, router.ErrAllExcluded) {
		t.Fatalf("the refused request's Wait = %v", werr)
	}
	if _, live := e.c.Progress("x#4"); live {
		t.Fatal("the refused request is live")
	}
	for id, n := range active(e.r) {
		if n != 0 {
			t.Errorf("worker %d: %d active requests after every request ended", id, n)
		}
	}
}

// TestDispatchHonoursExclude: a queued request with an exclusion is not
// dispatched to an excluded worker that frees first; it waits for another.
func TestDispatchHonoursExclude(t *testing.T) {
	e := newEnv(t, 2, capacityQueue(1), nil)
	a, b := e.admit(t, "a"), e.admit(t, "b") // round robin: a on 1, b on 2
	if worker(a) != 1 || worker(b) != 2 {
		t.Fatalf("a on %d, b on %d; want 1 and 2", worker(a), worker(b))
	}
	c := e.admit(t, "c", admission.Exclude(1))
	if !c.Queued() {
		t.Fatal("c not queued")
	}
	a.End(admission.Completed(8))
	if out := e.c.Dispatch(context.Background(), nil); len(out) != 0 || !c.Queued() {
		t.Fatalf("dispatched %v to the excluded worker 1 (c on %d)", out, worker(c))
	}
	b.End(admission.Completed(8))
	out := e.c.Dispatch(context.Background(), nil)
	if len(out) != 1 || out[0] != c || c.Err() != nil || worker(c) != 2 {
		t.Fatalf("dispatch = %v, c on %d (err %v); want c on 2", out, worker(c), c.Err())
	}
}

// TestRetryExcludesTheFailedWorkerAndKeepsTheClassification: Retry places
// the request again under a new id, without the failed workers, and never
// classifies it again.
func TestRetryExcludesTheFailedWorkerAndKeepsTheClassification(t *testing.T) {
	cls := classifyWith(func(*shared.Request) (shared.Classification, error) {
		return shared.Classification{Priority: 5}, nil
	})
	e := newEnvWith(t, kvPolicy(t), 3, config.DefaultQueue(), cls)
	ctx := context.Background()
	h, err := e.c.Admit(ctx, prompt("x#0"))
	if err != nil {
		t.Fatal(err)
	}
	first := worker(h)
	// Without an exclusion the policy follows the prefix back to first.
	if err := h.Retry(ctx, "x#1", "worker error"); err != nil {
		t.Fatal(err)
	}
	if worker(h) != first || h.Decision().OverlapBlocks == 0 {
		t.Fatalf("a retry without exclusion went to %d (overlap %d); the test needs the policy to pick %d again",
			worker(h), h.Decision().OverlapBlocks, first)
	}
	if err := h.Retry(ctx, "x#2", "worker error", first); err != nil {
		t.Fatal(err)
	}
	d, err := h.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	second := d.Worker.ID
	if second == first {
		t.Fatalf("the retry excluding %d went to it", first)
	}
	if h.Request().ID != "x#2" || h.Classification().Priority != 5 || h.Request().Priority != 5 {
		t.Fatalf("after the retry: id %q, class %+v", h.Request().ID, h.Classification())
	}
	if n := cls.calls.Load(); n != 1 {
		t.Fatalf("the classifier was called %d times across the retries, want 1", n)
	}
	for id, want := range map[string]bool{"x#0": false, "x#1": false, "x#2": true} {
		if _, live := e.c.Progress(id); live != want {
			t.Errorf("Progress(%s) live = %v, want %v", id, live, want)
		}
	}
	if got := active(e.r); got[first] != 0 || got[second] != 1 {
		t.Fatalf("active requests %v: want 0 on the failed %d, 1 on %d", got, first, second)
	}
	// The exclusions add up; excluding the last worker fails the request.
	if err := h.Retry(ctx, "x#3", "worker error", second); err != nil {
		t.Fatal(err)
	}
	third := worker(h)
	if third == first || third == second || third == 0 {
		t.Fatalf("excluding %d and %d the retry went to %d", first, second, third)
	}
	err = h.Retry(ctx, "x#4", "worker error", third)
	if !errors.Is(err, router.ErrAllExcluded) {
		t.Fatalf("retry with every worker excluded: %v, want ErrAllExcluded", err)
	}
	if _, werr := h.Wait(ctx); !errors.Is(werr, router.ErrAllExcluded) {
		t.Fatalf("Wait after the failed retry: %v", werr)
	}
	if err := h.Retry(ctx, "x#5", "again"); !errors.Is(err, admission.ErrEnded) {
		t.Fatalf("retry of an ended request: %v, want ErrEnded", err)
	}
	h.End(admission.Aborted("gave up")) // a no-op: it ended
	w := func(id shared.WorkerID) string { return fmt.Sprintf("@%d", id) }
	want := []string{
		"sent:x#0" + w(first), "aborted:x#0" + w(first), "sent:x#1" + w(first),
		"aborted:x#1" + w(first), "sent:x#2" + w(second),
		"aborted:x#2" + w(second), "sent:x#3" + w(third),
		"aborted:x#3" + w(third), "aborted:x#4",
	}
	if diff := cmp.Diff(want, e.rec.events()); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	if n := cls.calls.Load(); n != 1 {
		t.Fatalf("the classifier was called %d times, want 1", n)
	}
	for id, n := range active(e.r) {
		if n != 0 {
			t.Errorf("worker %d: %d active requests after the request ended", id, n)
		}
	}
}

// TestRetryRejoinedWorkerIsACandidateAgain: a worker that failed under a
// request is excluded from it while the join it failed in lasts; once it
// left the fleet and joined again (a restarted engine) the request may go
// back to it. An id excluded at Admit stays excluded in every join.
func TestRetryRejoinedWorkerIsACandidateAgain(t *testing.T) {
	e := newEnv(t, 2, config.DefaultQueue(), nil)
	ctx := context.Background()
	h := e.admit(t, "r")
	first := worker(h)
	if err := h.Retry(ctx, "r#m1", "engine failed", first); err != nil {
		t.Fatal(err)
	}
	second := worker(h)
	if second == first || second == 0 {
		t.Fatalf("the retry excluding %d went to %d", first, second)
	}
	// The failed worker leaves and joins again, empty.
	if err := e.r.RemoveWorker(first, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.r.AddWorker(fleet.Spec{ID: first, Role: shared.RoleAggregated, TotalKVBlocks: 100}); err != nil {
		t.Fatal(err)
	}
	// The second fails too, in its only join: the rejoined first takes it.
	if err := h.Retry(ctx, "r#m2", "engine failed", second); err != nil {
		t.Fatalf("retry with the first worker rejoined: %v, want a placement on it", err)
	}
	if got := worker(h); got != first {
		t.Fatalf("the retry went to %d, want the rejoined %d", got, first)
	}
	// It fails again in its new join: now both are out.
	if err := h.Retry(ctx, "r#m3", "engine failed", first); !errors.Is(err, router.ErrAllExcluded) {
		t.Fatalf("retry with both failed in their current joins: %v, want ErrAllExcluded", err)
	}

	// An exclusion given at Admit holds across joins.
	g := e.admit(t, "s", admission.Exclude(1))
	if worker(g) != 2 {
		t.Fatalf("s excluding 1 went to %d", worker(g))
	}
	if err := e.r.RemoveWorker(1, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.r.AddWorker(fleet.Spec{ID: 1, Role: shared.RoleAggregated, TotalKVBlocks: 100}); err != nil {
		t.Fatal(err)
	}
	if err := g.Retry(ctx, "s#m1", "engine failed", 2); !errors.Is(err, router.ErrAllExcluded) {
		t.Fatalf("retry of s with 1 excluded at Admit and 2 failed: %v, want ErrAllExcluded", err)
	}
}

// A retry under an id that is live changes nothing: the request stays
// dispatched on its worker under its id.
func TestRetryUnderALiveIDChangesNothing(t *testing.T) {
	e := newEnv(t, 2, config.DefaultQueue(), nil)
	other := e.admit(t, "other")
	h := e.admit(t, "x")
	before := h.Decision()
	err := h.Retry(context.Background(), "other", "worker error", before.Worker.ID)
	if !errors.Is(err, admission.ErrDuplicateRequest) {
		t.Fatalf("Retry under a live id: %v, want ErrDuplicateRequest", err)
	}
	d, err := h.Wait(context.Background())
	if err != nil || d.Worker != before.Worker || h.Request().ID != "x" || h.Queued() {
		t.Fatalf("after the refused retry: Wait %+v, %v; id %q; want still on %d as x", d, err, h.Request().ID, before.Worker.ID)
	}
	if got := active(e.r); got[1] != 1 || got[2] != 1 {
		t.Fatalf("active requests %v, want one on each worker", got)
	}
	h.End(admission.Completed(8))
	other.End(admission.Completed(8))
	want := []string{"sent:other@1", "sent:x@2", "completed:x@2", "completed:other@1"}
	if diff := cmp.Diff(want, e.rec.events()); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
}

// A retry when every other worker is at capacity queues the request; a
// dispatch places it when a worker it may use frees.
func TestRetryQueuesUntilAnotherWorkerFrees(t *testing.T) {
	e := newEnv(t, 2, capacityQueue(1), nil)
	h, busy := e.admit(t, "x#0"), e.admit(t, "busy") // x on 1, busy on 2
	if err := h.Retry(context.Background(), "x#1", "worker error", 1); err != nil {
		t.Fatal(err)
	}
	if !h.Queued() || e.c.Waiting(shared.RoleAggregated) != 1 || active(e.r)[1] != 0 {
		t.Fatalf("retry: queued %v, waiting %d, active %v; want queued with worker 1 released", h.Queued(), e.c.Waiting(shared.RoleAggregated), active(e.r))
	}
	if out := e.c.Dispatch(context.Background(), nil); len(out) != 0 {
		t.Fatalf("dispatched %v to the failed worker", out)
	}
	e.now = e.now.Add(2 * time.Second)
	busy.End(admission.Completed(8))
	if out := e.c.Dispatch(context.Background(), nil); len(out) != 1 || out[0] != h || worker(h) != 2 {
		t.Fatalf("dispatch = %v, x on %d; want x#1 on 2", out, worker(h))
	}
	h.End(admission.Completed(8))
	want := []string{"sent:x#0@1", "sent:busy@2", "aborted:x#0@1", "completed:busy@2", "sent:x#1@2", "completed:x#1@2"}
	if diff := cmp.Diff(want, e.rec.events()); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
}

// Wait on a queued request returns when its context ends; the request
// still waits until End takes it out of the queue.
func TestWaitReturnsWhenItsContextEnds(t *testing.T) {
	e := newEnv(t, 1, capacityQueue(1), nil)
	busy := e.admit(t, "busy")
	h := e.admit(t, "q")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := h.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v, want context.Canceled", err)
	}
	if !h.Queued() || e.c.Waiting(shared.RoleAggregated) != 1 {
		t.Fatalf("after Wait's context ended: queued %v, waiting %d; want still queued", h.Queued(), e.c.Waiting(shared.RoleAggregated))
	}
	h.End(admission.Aborted("request timeout"))
	if e.c.Waiting(shared.RoleAggregated) != 0 || e.c.Queued() != 0 {
		t.Fatalf("after End: waiting %d, queued %d", e.c.Waiting(shared.RoleAggregated), e.c.Queued())
	}
	if _, err := h.Wait(context.Background()); !errors.Is(err, admission.ErrEnded) {
		t.Fatalf("Wait after End = %v, want ErrEnded", err)
	}
	// Capacity that frees later goes to nobody: the queue is empty.
	busy.End(admission.Completed(8))
	if out := e.c.Dispatch(context.Background(), nil); len(out) != 0 {
		t.Fatalf("dispatched %v", out)
	}
	if diff := cmp.Diff([]string{"sent:busy@1", "aborted:q", "completed:busy@1"}, e.rec.events()); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
}
