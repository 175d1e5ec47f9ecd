package router

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/shared"
)

// classifyFunc is a classifier factory whose classifier is a function.
type classifyFunc func(req *shared.Request) (shared.Classification, error)

func (classifyFunc) Inputs() shared.Inputs { return 0 }
func (f classifyFunc) NewClassifier(shared.PartitionContext) (shared.Classifier, error) {
	return f, nil
}
func (f classifyFunc) Classify(_ context.Context, req *shared.Request) (shared.Classification, error) {
	return f(req)
}

// recorder is an event listener keeping "kind:id@worker" lines.
type recorder struct{ got []string }

func (r *recorder) OnEvents(evs []shared.Event) {
	for _, e := range evs {
		s := e.Kind.String() + ":" + e.RequestID
		if e.HasWorker {
			s += fmt.Sprintf("@%d", e.Worker)
		}
		r.got = append(r.got, s)
	}
}

type admitEnv struct {
	r   *Router
	rec *recorder
	now time.Time
}

func newAdmitEnv(t *testing.T, workers int, q config.Queue, c shared.ClassifierFactory) *admitEnv {
	t.Helper()
	e := &admitEnv{rec: &recorder{}, now: time.Unix(1000, 0)}
	e.r = newRouter(t, mustPolicy(t, "rr", nil, builtin.NewRoundRobin()), workers)
	if err := e.r.EnableAdmission(AdmissionOptions{Queue: q, Classifier: c, Listeners: []shared.EventListener{e.rec},
		Now: func() time.Time { return e.now }}); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *admitEnv) admit(t *testing.T, id string) Ticket {
	t.Helper()
	tk, err := e.r.Admit(context.Background(), &shared.Request{ID: id, Role: shared.RoleAggregated, PromptTokens: 8})
	if err != nil {
		t.Fatalf("Admit(%s): %v", id, err)
	}
	return tk
}

func capacityQueue(capacity int) config.Queue {
	q := config.DefaultQueue()
	q.MaxActiveRequests = capacity
	return q
}

func TestAdmitQueuesAtCapacityAndDispatchesWhenFreed(t *testing.T) {
	e := newAdmitEnv(t, 2, capacityQueue(1), nil)
	a, b, c := e.admit(t, "a"), e.admit(t, "b"), e.admit(t, "c")
	if a.Queued || b.Queued || !c.Queued {
		t.Fatalf("queued: a %v b %v c %v; want only c", a.Queued, b.Queued, c.Queued)
	}
	if got := e.r.Waiting(shared.RoleAggregated); got != 1 {
		t.Fatalf("waiting = %d", got)
	}
	if out := e.r.Dispatch(context.Background(), nil); len(out) != 0 {
		t.Fatalf("dispatched %d with no capacity free", len(out))
	}
	e.now = e.now.Add(3 * time.Second)
	if err := e.r.FirstToken("a"); err != nil {
		t.Fatal(err)
	}
	if err := e.r.Complete("a", 20); err != nil {
		t.Fatal(err)
	}
	out := e.r.Dispatch(context.Background(), nil)
	if len(out) != 1 || out[0].ID != "c" || out[0].Waited != 3*time.Second || out[0].Decision.Worker.ID != a.Decision.Worker.ID {
		t.Fatalf("dispatch = %+v", out)
	}
	want := []string{"sent:a@1", "sent:b@2", "first_token:a", "completed:a@1", "sent:c@1"}
	if diff := cmp.Diff(want, e.rec.got); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	// A completed id may come back; a live one may not.
	e.admit(t, "a")
	if _, err := e.r.Admit(context.Background(), &shared.Request{ID: "b", Role: shared.RoleAggregated}); !errors.Is(err, ErrDuplicateRequest) {
		t.Fatalf("duplicate live id: err = %v", err)
	}
}

func TestAdmitClassifierFailureFailsOnlyThatRequest(t *testing.T) {
	c := classifyFunc(func(req *shared.Request) (shared.Classification, error) {
		switch req.ID {
		case "err":
			return shared.Classification{}, errors.New("no such tenant")
		case "panic":
			panic("classifier bug")
		}
		return shared.Classification{Priority: 3}, nil
	})
	e := newAdmitEnv(t, 1, config.DefaultQueue(), c)
	for _, id := range []string{"err", "panic"} {
		_, err := e.r.Admit(context.Background(), &shared.Request{ID: id, Role: shared.RoleAggregated})
		var ce *shared.ClassifyError
		if !errors.As(err, &ce) || ce.RequestID != id {
			t.Fatalf("%s: err = %v, want a *shared.ClassifyError", id, err)
		}
	}
	tk := e.admit(t, "ok")
	if tk.Classification.Priority != 3 || tk.Queued {
		t.Fatalf("the classifier must keep serving: %+v", tk)
	}
	// A failed request never became live.
	e.admit(t, "err2")
}

func TestAdmitDueTimeRejectsQueuedRequests(t *testing.T) {
	due := time.Unix(1005, 0)
	c := classifyFunc(func(req *shared.Request) (shared.Classification, error) {
		if req.ID == "late" {
			return shared.Classification{DueAt: due}, nil
		}
		return shared.Classification{}, nil
	})
	e := newAdmitEnv(t, 1, capacityQueue(1), c)
	e.admit(t, "busy")
	if tk := e.admit(t, "late"); !tk.Queued {
		t.Fatal("late not queued")
	}
	e.now = due.Add(time.Millisecond)
	out := e.r.Dispatch(context.Background(), nil)
	if len(out) != 1 || !errors.Is(out[0].Err, ErrDue) || out[0].ID != "late" {
		t.Fatalf("dispatch = %+v", out)
	}
	if got := e.rec.got[len(e.rec.got)-1]; !strings.HasPrefix(got, "aborted:late") {
		t.Fatalf("last event %q, want aborted:late (a request can end without sent)", got)
	}
	if err := e.r.Complete("late", 0); !errors.Is(err, ErrUnknownRequest) {
		t.Fatalf("late is not live any more: err = %v", err)
	}
}

func TestAdmitQueueFull(t *testing.T) {
	q := capacityQueue(1)
	q.MaxWaiting = 1
	e := newAdmitEnv(t, 1, q, nil)
	e.admit(t, "a")
	e.admit(t, "b")
	if _, err := e.r.Admit(context.Background(), &shared.Request{ID: "c", Role: shared.RoleAggregated}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("err = %v, want ErrQueueFull", err)
	}
}

func TestAdmitAdvisoryTarget(t *testing.T) {
	c := classifyFunc(func(req *shared.Request) (shared.Classification, error) {
		switch req.ID {
		case "pinned":
			return shared.Classification{Target: 3, HasTarget: true}, nil
		case "gone":
			return shared.Classification{Target: 99, HasTarget: true}, nil
		}
		return shared.Classification{}, nil
	})
	e := newAdmitEnv(t, 3, config.DefaultQueue(), c)
	if tk := e.admit(t, "pinned"); tk.Decision.Worker.ID != 3 || !tk.Decision.Target {
		t.Fatalf("pinned went to %d (target %v), want 3", tk.Decision.Worker.ID, tk.Decision.Target)
	}
	// A target that is not a candidate is ignored: the policy decides.
	if tk := e.admit(t, "gone"); tk.Decision.Target || tk.Decision.Worker.ID != 1 {
		t.Fatalf("gone went to %d (target %v), want the policy's 1", tk.Decision.Worker.ID, tk.Decision.Target)
	}
}

// listeningPicker is a round-robin picker that also wants lifecycle events.
type listeningPicker struct {
	*builtin.RoundRobin
	recorder
}

func TestPolicyComponentsHearLifecycleEvents(t *testing.T) {
	lp := &listeningPicker{RoundRobin: builtin.NewRoundRobin()}
	r := newRouter(t, mustPolicy(t, "rr", nil, lp), 2)
	if err := r.EnableAdmission(AdmissionOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Admit(context.Background(), &shared.Request{ID: "x", Role: shared.RoleAggregated, PromptTokens: 4}); err != nil {
		t.Fatal(err)
	}
	if err := r.FirstToken("x"); err != nil {
		t.Fatal(err)
	}
	if err := r.Abort("x", "client went away"); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"sent:x@1", "first_token:x", "aborted:x@1"}, lp.got); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
}

// A class the queue does not have fails the request even when a worker is
// free, so a typo in a classifier's configuration shows at once.
func TestAdmitUnknownClass(t *testing.T) {
	c := classifyFunc(func(req *shared.Request) (shared.Classification, error) {
		return shared.Classification{PolicyClass: "bulk"}, nil
	})
	e := newAdmitEnv(t, 2, config.DefaultQueue(), c)
	_, err := e.r.Admit(context.Background(), &shared.Request{ID: "a", Role: shared.RoleAggregated})
	if !errors.Is(err, ErrUnknownClass) || !strings.Contains(err.Error(), `"bulk" (queue classes: default)`) {
		t.Fatalf("err = %v", err)
	}
}

// An explicit pin in the request wins over the classifier's target.
func TestAdmitPinWinsOverTarget(t *testing.T) {
	c := classifyFunc(func(*shared.Request) (shared.Classification, error) {
		return shared.Classification{Target: 3, HasTarget: true}, nil
	})
	e := newAdmitEnv(t, 3, config.DefaultQueue(), c)
	tk, err := e.r.Admit(context.Background(), &shared.Request{ID: "p", Role: shared.RoleAggregated, Pin: 2, HasPin: true})
	if err != nil {
		t.Fatal(err)
	}
	if tk.Decision.Worker.ID != 2 {
		t.Fatalf("pinned request went to %d, want 2", tk.Decision.Worker.ID)
	}
}

// A reload that changes the request_classifier takes effect for the next
// admission; the old bundle's classifier is not called again.
func TestReloadSwapsTheClassifier(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p.hcl")
	policy := func(priority int) {
		t.Helper()
		src := fmt.Sprintf("request_classifier {\n  type             = \"header-priority\"\n  default_priority = %d\n}\n", priority)
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	policy(1)
	b, diags := LoadBundle(context.Background(), path, LoadOptions{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	r, err := New(Options{Bundle: b})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	if _, err := r.AddWorker(fleet.Spec{ID: 1, Role: shared.RoleAggregated, TotalKVBlocks: 10}); err != nil {
		t.Fatal(err)
	}
	if err := r.EnableAdmission(AdmissionOptions{}); err != nil {
		t.Fatal(err)
	}
	admit := func(id string) int {
		t.Helper()
		tk, err := r.Admit(context.Background(), &shared.Request{ID: id, Role: shared.RoleAggregated, PromptTokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		return tk.Classification.Priority
	}
	if got := admit("a"); got != 1 {
		t.Fatalf("priority before reload = %d, want 1", got)
	}
	policy(2)
	if diags := r.Reload(context.Background(), path); diags.HasErrors() {
		t.Fatal(diags)
	}
	if got := admit("b"); got != 2 {
		t.Fatalf("priority after reload = %d, want 2", got)
	}
}
