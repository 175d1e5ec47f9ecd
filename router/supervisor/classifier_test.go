package supervisor

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/pluginclient"
	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/shared"
)

// An out-of-process classifier in a real process (the soft-pin-repin
// example's sticky-session): the remote factory is a ClassifierFactory and
// an EventListener; a session's next request is targeted at the worker its
// last request was sent to, learned from the events the host forwarded; a
// worker that leaves the partition drops the binding (the list reached the
// plugin); a killed plugin fails only the calls made while it is gone,
// events emitted meanwhile are dropped and counted, and after the restart
// the classifier serves again (its bindings forgotten).
func TestRemoteClassifierRealProcess(t *testing.T) {
	bin := testkit.Build(t, "../../examples/soft-pin-repin")
	h := newHost(t)
	b := config.Plugin{Name: "pins", Command: bin, StartTimeout: 5 * time.Second, CallTimeout: 2 * time.Second,
		Restart: config.RestartPolicy{MaxRestarts: 3, Window: time.Minute, BackoffMin: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}}
	types, err := h.Start(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	ti := typeByName(t, types, "sticky-session")
	if ti.Kind != shared.KindClassifier {
		t.Fatalf("kind %v", ti.Kind)
	}
	comp, err := ti.New(shared.InstanceInfo{Name: "request_classifier", BlockSize: 16}, ti.WithDefaults(nil))
	if err != nil {
		t.Fatal(err)
	}
	f, ok := comp.(shared.ClassifierFactory)
	if !ok {
		t.Fatalf("%T is not a ClassifierFactory", comp)
	}
	l, ok := comp.(shared.EventListener)
	if !ok {
		t.Fatalf("%T is not an EventListener although the type's classifiers listen", comp)
	}
	workers := []shared.WorkerInfo{{ID: 1}, {ID: 2}, {ID: 3}}
	clock := time.Unix(1000, 0)
	c, err := f.NewClassifier(shared.PartitionContext{Role: shared.RoleAggregated, BlockSize: 16,
		Workers: func() []shared.WorkerInfo { return workers }, Now: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	classify := func(id string) shared.Classification {
		t.Helper()
		cl, err := c.Classify(ctx, &shared.Request{ID: id, Role: shared.RoleAggregated, SessionID: "s1"})
		if err != nil {
			t.Fatalf("classify %s: %v", id, err)
		}
		return cl
	}
	sent := func(id string, w shared.WorkerID) {
		l.OnEvents([]shared.Event{{Kind: shared.EventSent, RequestID: id, Worker: w, HasWorker: true, At: clock},
			{Kind: shared.EventCompleted, RequestID: id, Worker: w, HasWorker: true, ContextTokens: 10, At: clock}})
	}
	if cl := classify("r1"); cl.HasTarget {
		t.Fatalf("first turn targeted: %+v", cl)
	}
	sent("r1", 3)
	if cl := classify("r2"); !cl.HasTarget || cl.Target != 3 {
		t.Fatalf("second turn: %+v, want target 3", cl)
	}
	sent("r2", 3)
	// Worker 3 leaves: a new snapshot (a new slice) is sent, and the
	// binding is dropped.
	workers = []shared.WorkerInfo{{ID: 1}, {ID: 2}}
	if cl := classify("r3"); cl.HasTarget {
		t.Fatalf("target %d outside the partition", cl.Target)
	}
	sent("r3", 2)
	if cl := classify("r4"); cl.Target != 2 {
		t.Fatalf("after re-binding: %+v, want target 2", cl)
	}

	pid := currentPID(h, "pins")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !testkit.Poll(time.Minute, func() bool { return h.Status("pins") != StatusUp || currentPID(h, "pins") != pid }) {
		t.Fatal("the kill was not noticed")
	}
	// While it is gone (or just back), calls may fail: only the call.
	l.OnEvents([]shared.Event{{Kind: shared.EventAborted, RequestID: "r4", Reason: "test"}})
	if !testkit.Poll(time.Minute, func() bool { return h.Status("pins") == StatusUp && currentPID(h, "pins") != pid }) {
		t.Fatalf("not restarted: %v", h.Status("pins"))
	}
	var cl shared.Classification
	if !testkit.Poll(time.Minute, func() bool { cl, err = c.Classify(ctx, &shared.Request{ID: "r5", SessionID: "s1"}); return err == nil }) {
		t.Fatalf("classify after the restart: %v", err)
	}
	if cl.HasTarget {
		t.Fatalf("the restarted plugin remembered a binding: %+v", cl)
	}
	if st := h.Stats("pins"); st.Restarts < 1 {
		t.Fatalf("stats %+v", st)
	}
	// An unknown instance's error is the call's, wrapped with the plugin.
	bad := &remoteClassifier{f: &classifierFactory{&component{m: f.(*listeningFactory).m, name: "nope", typ: "sticky-session"}}}
	if _, err := bad.Classify(ctx, &shared.Request{ID: "x"}); err == nil || errors.Is(err, pluginclient.ErrPluginClosed) {
		t.Fatalf("unknown instance: %v", err)
	}
}
