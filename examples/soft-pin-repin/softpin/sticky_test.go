package softpin

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/shared"
)

func newSticky(t *testing.T, p shared.Params, workers *[]shared.WorkerInfo, clock *time.Time) *StickyPartition {
	t.Helper()
	ti := StickySessionType()
	comp, err := ti.New(shared.InstanceInfo{}, ti.WithDefaults(p))
	if err != nil {
		t.Fatal(err)
	}
	c, err := comp.(shared.ClassifierFactory).NewClassifier(shared.PartitionContext{
		Workers: func() []shared.WorkerInfo { return *workers },
		Now:     func() time.Time { return *clock },
	})
	if err != nil {
		t.Fatal(err)
	}
	return c.(*StickyPartition)
}

func sentEvents(p *StickyPartition, id string, w shared.WorkerID, at time.Time) {
	p.OnEvents([]shared.Event{{Kind: shared.EventSent, RequestID: id, Worker: w, HasWorker: true, At: at},
		{Kind: shared.EventCompleted, RequestID: id, Worker: w, HasWorker: true, At: at}})
}

func TestStickySessionTargetsLastWorker(t *testing.T) {
	ws := []shared.WorkerInfo{{ID: 1}, {ID: 2}}
	clock := time.Unix(100, 0)
	p := newSticky(t, nil, &ws, &clock)
	ctx := context.Background()
	cl, _ := p.Classify(ctx, &shared.Request{ID: "a", SessionID: "s"})
	if cl.HasTarget {
		t.Fatalf("unknown session targeted: %+v", cl)
	}
	sentEvents(p, "a", 2, clock)
	if cl, _ := p.Classify(ctx, &shared.Request{ID: "b", SessionID: "s"}); cl.Target != 2 || !cl.HasTarget {
		t.Fatalf("got %+v, want target 2", cl)
	}
	// Events of requests it did not classify are ignored.
	sentEvents(p, "other", 1, clock)
	if cl, _ := p.Classify(ctx, &shared.Request{ID: "c", SessionID: "s"}); cl.Target != 2 {
		t.Fatalf("foreign event moved the session: %+v", cl)
	}
	// No session: nothing.
	if cl, _ := p.Classify(ctx, &shared.Request{ID: "d"}); cl != (shared.Classification{}) {
		t.Fatalf("session-less: %+v", cl)
	}
	// A worker that left drops the binding.
	ws = []shared.WorkerInfo{{ID: 1}}
	if cl, _ := p.Classify(ctx, &shared.Request{ID: "e", SessionID: "s"}); cl.HasTarget || p.Sessions() != 0 {
		t.Fatalf("gone worker still targeted: %+v (%d sessions)", cl, p.Sessions())
	}
}

func TestStickySessionTTLAndBound(t *testing.T) {
	ws := []shared.WorkerInfo{{ID: 1}, {ID: 2}}
	clock := time.Unix(100, 0)
	p := newSticky(t, shared.Params{ParamTTL: time.Minute, ParamMaxSessions: int64(2)}, &ws, &clock)
	ctx := context.Background()
	for i := range 3 {
		id := fmt.Sprint("r", i)
		_, _ = p.Classify(ctx, &shared.Request{ID: id, SessionID: fmt.Sprint("s", i)})
		sentEvents(p, id, 1, clock)
	}
	if p.Sessions() != 2 {
		t.Fatalf("%d sessions bound, want the bound 2", p.Sessions())
	}
	if cl, _ := p.Classify(ctx, &shared.Request{ID: "x", SessionID: "s0"}); cl.HasTarget {
		t.Fatal("the least recently used session was not evicted")
	}
	clock = clock.Add(time.Minute + time.Second)
	if cl, _ := p.Classify(ctx, &shared.Request{ID: "y", SessionID: "s2"}); cl.HasTarget {
		t.Fatal("an expired binding targeted")
	}
}

func TestStickySessionParams(t *testing.T) {
	for _, p := range []shared.Params{{ParamTTL: time.Duration(0)}, {ParamMaxSessions: int64(0)}} {
		if _, err := NewStickySession(p); err == nil {
			t.Errorf("%v accepted", p)
		}
	}
	if ti := StickySessionType(); ti.Kind != shared.KindClassifier || !ti.Events {
		t.Errorf("descriptor %+v", ti)
	}
}
