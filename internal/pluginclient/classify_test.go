package pluginclient

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/switchyard-router/switchyard/shared"
	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
)

// recClassifier is a test classifier type served through the plugin
// protocol: "panic" and "fail" request ids fail; otherwise the priority
// is the number of workers the partition sees, the class is the role, and
// the target is the worker of the last sent event it heard.
type recFactory struct {
	mu     sync.Mutex
	events []shared.Event // every event heard, in order
	parts  []*recPartition
}

func (*recFactory) Inputs() shared.Inputs { return 0 }

func (f *recFactory) NewClassifier(pc shared.PartitionContext) (shared.Classifier, error) {
	p := &recPartition{f: f, pc: pc}
	f.mu.Lock()
	f.parts = append(f.parts, p)
	f.mu.Unlock()
	return p, nil
}

func (f *recFactory) OnEvents(evs []shared.Event) {
	f.mu.Lock()
	f.events = append(f.events, evs...)
	f.mu.Unlock()
}

func (f *recFactory) heard() []shared.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]shared.Event(nil), f.events...)
}

type recPartition struct {
	f  *recFactory
	pc shared.PartitionContext
}

func (p *recPartition) Classify(_ context.Context, r *shared.Request) (shared.Classification, error) {
	switch r.ID {
	case "panic":
		panic("boom")
	case "fail":
		return shared.Classification{}, errors.New("refused")
	}
	cl := shared.Classification{Priority: len(p.pc.Workers()), PolicyClass: string(p.pc.Role)}
	if _, ok := p.pc.Progress(r.ID); ok {
		cl.PolicyClass = "progress?"
	}
	evs := p.f.heard()
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Kind == shared.EventSent {
			cl.Target, cl.HasTarget = evs[i].Worker, true
			break
		}
	}
	if !p.pc.Now().Equal(time.Unix(0, 42e9)) {
		cl.PolicyClass = "clock " + p.pc.Now().String()
	}
	return cl, nil
}

// newClassifierClient serves one recFactory as type "rec" in process.
func newClassifierClient(t *testing.T) (*Client, *recFactory) {
	t.Helper()
	f := &recFactory{}
	types := []shared.TypeInfo{{Name: "rec", Kind: shared.KindClassifier,
		New: func(shared.InstanceInfo, shared.Params) (shared.Component, error) { return f, nil }}}
	rc, _ := serveInProcess(t, types, Options{})
	cr, err := rc.ConfigureInstance(context.Background(), ConfigureRequest{Info: shared.InstanceInfo{Name: "c", BlockSize: 16}, Type: "rec"})
	if err != nil || len(cr.Diagnostics) > 0 {
		t.Fatalf("configure: %v %v", err, cr.Diagnostics)
	}
	if !cr.Events {
		t.Fatal("a factory implementing EventListener did not declare events")
	}
	return rc, f
}

// Classify through the plugin protocol: the answer travels back, the
// worker list reaches the classifier (sent once per version, kept after),
// an error or a panic fails only that request, and the classifier keeps
// serving.
func TestRemoteClassify(t *testing.T) {
	rc, f := newClassifierClient(t)
	ctx := context.Background()
	now := time.Unix(0, 42e9)
	ws := []shared.WorkerInfo{{ID: 1, TotalKVBlocks: 100}, {ID: 2}, {ID: 7, DPRank: 1}}
	call := func(id string, send bool) (shared.Classification, error) {
		return rc.Classify(ctx, ClassifyCall{Instance: "c", Request: &shared.Request{ID: id, Role: shared.RoleDecode},
			WorkersVersion: 1, SendWorkers: send, Workers: ws, Now: now})
	}
	cl, err := call("a", true)
	if err != nil {
		t.Fatal(err)
	}
	if cl.Priority != 3 || cl.PolicyClass != "decode" || cl.HasTarget {
		t.Fatalf("classification %+v, want priority 3 (workers), class decode, no target", cl)
	}
	// Not sent again: the plugin keeps version 1.
	if cl, err := call("b", false); err != nil || cl.Priority != 3 {
		t.Fatalf("without the list: %+v %v", cl, err)
	}
	f.mu.Lock()
	got := f.parts[0].pc.Workers()
	bs := f.parts[0].pc.BlockSize
	f.mu.Unlock()
	if fmt.Sprint(got) != fmt.Sprint(ws) || bs != 16 {
		t.Fatalf("workers %v block size %d, want %v and 16", got, bs, ws)
	}
	for _, id := range []string{"fail", "panic"} {
		_, err := call(id, false)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("request %q", id)) || !strings.Contains(err.Error(), "classifier c") {
			t.Fatalf("%s: error %v, want one naming the classifier and the request", id, err)
		}
	}
	if _, err := call("after", false); err != nil {
		t.Fatalf("after a failure: %v", err)
	}
	if _, err := rc.Classify(ctx, ClassifyCall{Instance: "nope", Request: &shared.Request{ID: "x"}}); err == nil {
		t.Fatal("an unknown instance classified")
	}
}

// Events through the plugin protocol: 64 concurrent emitters; each
// emitter's events arrive in order, none lost, in batches (at least one of
// more than one event), every batch acknowledged, and a Classify after
// emitting sees every event emitted before it.
func TestRemoteEventsOrderedBatchedAcked(t *testing.T) {
	rc, f := newClassifierClient(t)
	const emitters, per = 64, 50
	var wg sync.WaitGroup
	for e := range emitters {
		wg.Go(func() {
			for i := range per {
				rc.SendEvents("c", []shared.Event{{Kind: shared.EventSent, RequestID: fmt.Sprintf("%d/%d", e, i), Worker: shared.WorkerID(i), HasWorker: true,
					At: time.Unix(0, int64(i+1))}})
			}
		})
	}
	wg.Wait()
	// The barrier: Classify waits for every event queued before it.
	if _, err := rc.Classify(context.Background(), ClassifyCall{Instance: "c", Request: &shared.Request{ID: "z"}}); err != nil {
		t.Fatal(err)
	}
	evs := f.heard()
	if len(evs) != emitters*per {
		t.Fatalf("heard %d events, want %d", len(evs), emitters*per)
	}
	next := map[int]int{}
	for _, ev := range evs {
		var e, i int
		if _, err := fmt.Sscanf(ev.RequestID, "%d/%d", &e, &i); err != nil {
			t.Fatal(err)
		}
		if i != next[e] || ev.Worker != shared.WorkerID(i) || !ev.HasWorker || ev.Kind != shared.EventSent || ev.At.UnixNano() != int64(i+1) {
			t.Fatalf("emitter %d: got event %+v, want #%d", e, ev, next[e])
		}
		next[e]++
	}
	// The barrier says the plugin heard every event; the acknowledgement
	// of the last batch may reach the client just after it.
	st := rc.EventStats()
	for deadline := time.Now().Add(30 * time.Second); st.Acked != st.Batches && time.Now().Before(deadline); st = rc.EventStats() {
		time.Sleep(time.Millisecond)
	}
	if st.Sent != emitters*per || st.Dropped != 0 || st.Acked != st.Batches || st.MaxBatch < 2 || st.Batches >= st.Sent {
		t.Fatalf("stats %+v: want all sent, none dropped, every batch acked, batching under load", st)
	}
	t.Logf("%d events in %d batches (largest %d)", st.Sent, st.Batches, st.MaxBatch)
}

// TestRemoteEventsOverTheMessageLimit: events queued together whose batch
// would exceed the message-size limit go out in several EventBatch
// messages, each within it, all delivered in order and acknowledged. One
// message of all of them failed the Events stream for good (events are
// dropped from then on, silently): under router serve, a few dozen
// requests with 900 KB X-Request-Id values (which every event carries)
// stopped the sticky-session classifier from ever learning again.
func TestRemoteEventsOverTheMessageLimit(t *testing.T) {
	const limit = 1 << 20 // under the test server's 4 MiB receive limit
	old := maxMessageBytes
	maxMessageBytes = limit
	t.Cleanup(func() { maxMessageBytes = old })
	rc, f := newClassifierClient(t)

	const n = 24 // about 7 MB together
	pad := strings.Repeat("x", 300<<10)
	evs := make([]shared.Event, n)
	for i := range evs {
		evs[i] = shared.Event{Kind: shared.EventSent, RequestID: fmt.Sprintf("%d/%s", i, pad), Worker: shared.WorkerID(i), HasWorker: true}
	}
	rc.SendEvents("c", evs) // one queue, one round
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The barrier: Classify waits for every event queued before it.
	if _, err := rc.Classify(ctx, ClassifyCall{Instance: "c", Request: &shared.Request{ID: "z"}}); err != nil {
		t.Fatal(err)
	}
	heard := f.heard()
	if len(heard) != n {
		t.Fatalf("heard %d events, want %d (stats %+v)", len(heard), n, rc.EventStats())
	}
	for i, ev := range heard {
		if ev.Worker != shared.WorkerID(i) || !strings.HasPrefix(ev.RequestID, fmt.Sprintf("%d/", i)) {
			t.Fatalf("event %d is for worker %d, want the events in order", i, ev.Worker)
		}
	}
	// The plugin delivered every event before it classified, but its ack
	// of the last batch may still be on its way back: wait for it.
	st := rc.EventStats()
	for st.Acked != st.Batches && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
		st = rc.EventStats()
	}
	if st.Sent != n || st.Dropped != 0 || st.Acked != st.Batches || st.Batches < 2 {
		t.Fatalf("stats %+v: want all %d sent in several batches, each acked, none dropped", st, n)
	}
}

// TestEventSizeBound: eventSize is at least an event's encoded size in an
// EventBatch (its tag and length prefix included), also with every
// numeric field at its longest encoding.
func TestEventSizeBound(t *testing.T) {
	for _, ev := range []*pluginv1.Event{
		{},
		{RequestId: "sy-0123abcd-1#0", Kind: pluginv1.EventKind_EVENT_KIND_COMPLETED, Worker: 7, HasWorker: true, ContextTokens: 900, UnixNano: 1},
		{RequestId: strings.Repeat("r", 1<<20), Reason: strings.Repeat("why", 300), Kind: pluginv1.EventKind(math.MinInt32), Worker: math.MaxUint64,
			HasWorker: true, ContextTokens: math.MaxUint64, UnixNano: math.MinInt64},
	} {
		b := &pluginv1.EventBatch{Events: []*pluginv1.Event{ev}}
		if got, min := eventSize(ev), proto.Size(b); got < min {
			t.Errorf("eventSize = %d, below the %d bytes of a batch holding only the event (request id of %d bytes)", got, min, len(ev.RequestId))
		}
	}
}
