package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/trace"
	"github.com/switchyard-router/switchyard/shared"
)

// queuePolicy is a round-robin policy with a queue block and the
// header-priority classifier: priority and class come from the trace's
// priority and policy_class fields.
func queuePolicy(queue string) string {
	return queue + `
request_classifier {
  type = "header-priority"
}
policy "rr" {
  picker "rr" { type = "round-robin" }
}
worker_selection { aggregated = "rr" }
`
}

// eventLog is a listener that records every lifecycle event and checks the
// per-request order: sent? -> first_token? -> completed | aborted.
type eventLog struct {
	mu     sync.Mutex
	events []shared.Event
}

func (l *eventLog) OnEvents(evs []shared.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, evs...)
}

// check asserts the lifecycle order of every request and that every one
// of n requests ended exactly once; it returns each request's sent time
// (simulated, -1 when never sent).
func (l *eventLog) check(t *testing.T, n int) []time.Duration {
	t.Helper()
	sent := make([]time.Duration, n)
	state := make([]shared.EventKind, n) // the last event
	for i := range sent {
		sent[i] = -1
	}
	last := time.Time{}
	for _, e := range l.events {
		if e.At.Before(last) {
			t.Fatalf("event %+v before the previous one at %v", e, last)
		}
		last = e.At
		i, err := strconv.Atoi(e.RequestID)
		if err != nil || i < 0 || i >= n {
			t.Fatalf("event for request %q", e.RequestID)
		}
		prev := state[i]
		ok := false
		switch e.Kind {
		case shared.EventSent:
			ok = prev == 0
			sent[i] = e.At.Sub(Epoch())
		case shared.EventFirstToken:
			ok = prev == shared.EventSent
		case shared.EventCompleted:
			ok = prev == shared.EventSent || prev == shared.EventFirstToken
		case shared.EventAborted:
			ok = prev == 0 || prev == shared.EventSent || prev == shared.EventFirstToken
		}
		if !ok {
			t.Fatalf("request %d: %s after %s", i, e.Kind, prev)
		}
		state[i] = e.Kind
	}
	for i, s := range state {
		if s != shared.EventCompleted && s != shared.EventAborted {
			t.Fatalf("request %d ended with %v", i, s)
		}
	}
	return sent
}

// runQueued replays recs with b's queue and classifier (and extra options
// applied by opt), checks the lifecycle events and returns the report, the
// per-request outcomes and each request's dispatch time.
func runQueued(t *testing.T, b *config.PolicyFile, recs []trace.Record, workers int, opt func(*Options)) (*report.Report, []Outcome, []time.Duration) {
	t.Helper()
	var perReq bytes.Buffer
	log := &eventLog{}
	o := Options{PolicyName: "q", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "generated", Records: recs,
		Workers: workers, PerRequest: &perReq, Queue: b.Queue, Listeners: []shared.EventListener{log}}
	if b.Classifier != nil {
		o.Classifier = b.Classifier.Instance.(shared.ClassifierFactory)
	}
	if opt != nil {
		opt(&o)
	}
	rep, d, err := execute(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkBookingsReleased(t, d)
	if d.waiting != 0 || d.reps[0].adm.Waiting(shared.RoleAggregated) != 0 {
		t.Fatalf("%d requests still queued (router: %d)", d.waiting, d.reps[0].adm.Waiting(shared.RoleAggregated))
	}
	outs := decodeOutcomes(t, perReq.Bytes(), len(recs))
	return rep, outs, log.check(t, len(recs))
}

func decodeOutcomes(t *testing.T, b []byte, n int) []Outcome {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != n {
		t.Fatalf("%d per-request lines, want %d", len(lines), n)
	}
	outs := make([]Outcome, n)
	for i, l := range lines {
		if err := json.Unmarshal([]byte(l), &outs[i]); err != nil {
			t.Fatal(err)
		}
		if outs[i].Priority == nil {
			t.Fatalf("line %d has no priority: %s", i, l)
		}
	}
	return outs
}

// (a) Two classes, "a" of weight 3 and "b" of weight 1, with equal prompts,
// under a burst far beyond capacity: 2,000 requests at t=0, alternating a
// and b, on 4 workers that take 2 each. Over the period both classes are
// backlogged, class a gets 3/4 of the dispatches (within 10%), counted from
// the per-request lines in dispatch order (queue_ms: all arrive at 0, and a
// dispatched request is scheduled at its dispatch instant); the lifecycle
// events' exact dispatch order agrees.
func TestQueueWeightedShareOfDispatches(t *testing.T) {
	b := loadPolicy(t, queuePolicy(`
queue {
  max_active_requests = 2
  class "a" {
    weight = 3
  }
  class "b" {
    weight = 1
  }
}`))
	const n, workers, capacity = 2000, 4, 2
	recs := make([]trace.Record, n)
	for i := range recs {
		recs[i] = trace.Record{Index: i, Line: i + 1, InputLength: 1024, OutputLength: 16, PolicyClass: "ab"[i%2 : i%2+1]}
	}
	var events *eventLog
	rep, outs, sent := runQueued(t, b, recs, workers, func(o *Options) { events = o.Listeners[0].(*eventLog) })
	log := func(*testing.T) []shared.Event { return events.events }
	if rep.Completed != n || rep.Rejected != 0 {
		t.Fatalf("completed %d rejected %d, want %d, 0", rep.Completed, rep.Rejected, n)
	}
	for _, c := range []string{"a", "b"} {
		cr := rep.Classes[c]
		if cr == nil || cr.Requests != n/2 || cr.Completed != n/2 || cr.Rejected != 0 {
			t.Fatalf("class %s: %+v", c, cr)
		}
	}
	if len(rep.Classes) != 2 {
		t.Fatalf("classes %v, want a and b", rep.Classes)
	}
	// Class a, served 3:1, runs out after about (n/2)/(3/4) dispatches; b
	// waits throughout. Count the first 1,200 (a would take 900).
	const window, want = 1200, 0.75
	share := func(order []int) float64 {
		a := 0
		for _, i := range order[:window] {
			if outs[i].PolicyClass == "a" {
				a++
			}
		}
		return float64(a) / window
	}
	byLines := make([]int, n)
	for i := range byLines {
		byLines[i] = i
	}
	slices.SortStableFunc(byLines, func(x, y int) int {
		if outs[x].QueueMs != outs[y].QueueMs {
			if outs[x].QueueMs < outs[y].QueueMs {
				return -1
			}
			return 1
		}
		return 0
	})
	bySent := slices.Clone(byLines)
	slices.SortStableFunc(bySent, func(x, y int) int { return int(sent[x] - sent[y]) })
	for _, c := range []struct {
		name  string
		order []int
	}{{"per-request lines (queue_ms)", byLines}, {"sent events", bySent}} {
		got := share(c.order)
		if math.Abs(got-want) > 0.1*want {
			t.Errorf("%s: class a has %.3f of the first %d dispatches, want %.2f ± 10%%", c.name, got, window, want)
		}
		t.Logf("%s: class a share of the first %d dispatches %.4f (want 0.75 ± 0.075)", c.name, window, got)
	}
	// The heavier class waits less.
	if a, bb := rep.Classes["a"].Queue.Mean, rep.Classes["b"].Queue.Mean; a >= bb {
		t.Errorf("class a mean queue %.1f ms >= class b %.1f ms", a, bb)
	}
	for i, o := range outs {
		if time.Duration(math.Round(o.QueueMs*float64(time.Millisecond))) < sent[i]-time.Microsecond { // queue_ms is rounded to 1 µs
			t.Fatalf("request %d: queue_ms %v before its dispatch at %v", i, o.QueueMs, sent[i])
		}
	}
	if m := maxInFlight(log(t)); m != capacity {
		t.Fatalf("at most %d requests in flight on a worker, want max_active_requests %d", m, capacity)
	}
}

// maxInFlight is the most requests any worker had between sent and
// completed (or aborted) at once.
func maxInFlight(events []shared.Event) int {
	active := map[shared.WorkerID]int{}
	worst := 0
	for _, e := range events {
		switch {
		case e.Kind == shared.EventSent:
			active[e.Worker]++
			worst = max(worst, active[e.Worker])
		case (e.Kind == shared.EventCompleted || e.Kind == shared.EventAborted) && e.HasWorker:
			active[e.Worker]--
		}
	}
	return worst
}

// serviceTime is how long one request of the given shape takes alone on an
// idle simulated worker (arrival to last token).
func serviceTime(t *testing.T, input, output int) time.Duration {
	t.Helper()
	var buf bytes.Buffer
	run(t, loadPolicy(t, roundRobin), "rr", []trace.Record{{InputLength: input, OutputLength: output}}, 1, &buf)
	var o Outcome
	if err := json.Unmarshal(buf.Bytes(), &o); err != nil {
		t.Fatal(err)
	}
	return time.Duration(math.Round(o.E2EMs * float64(time.Millisecond)))
}

// (b) Starvation bound. One worker takes one request at a time; a
// priority-0 request waits under a never-ending stream of priority-10
// arrivals, aging 1 s (FCFS). The queue promises (router/queue/README.md,
// "Bounded waiting") that a request of priority p is served before any
// request of priority p+g arriving g or more aging intervals after it: only
// the requests already waiting and those arriving within g·aging can pass
// it.
//
//   - At one arrival per service time, as the README's example, nothing
//     else waits, so the wait is at most g·aging plus one service time:
//     10 s + S.
//   - At two arrivals per service time the backlog grows without end, and
//     every request that arrived in the next g·aging passes the low one:
//     2·g·aging/S of them, so the wait is about 2·g·aging, not g·aging + S.
//     The test asserts the promise itself: every request dispatched before
//     the low one arrived before the grid tick g intervals after it, so the
//     wait is at most (requests waiting or arriving before that tick) × S.
func TestQueueAgingBoundsStarvation(t *testing.T) {
	b := loadPolicy(t, queuePolicy(`
queue {
  max_active_requests = 1
  aging               = "1s"
  class "all" {
    order = "fcfs"
  }
}`))
	const gap, aging = 10, time.Second
	const input, output = 512, 4
	S := serviceTime(t, input, output)
	if S <= 0 || S > 200*time.Millisecond {
		t.Fatalf("service time %v", S)
	}
	for _, c := range []struct {
		name     string
		interval time.Duration // between high-priority arrivals
		offset   time.Duration // each arrives this much before a service ends
	}{
		{"one arrival per service", S, S / 4},
		{"two arrivals per service", S / 2, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The stream runs for 4·gap·aging, far past the low request's
			// dispatch; the low one arrives 1.5 s in, after high 0 and
			// the backlog so far.
			t0 := 1500 * time.Millisecond
			var recs []trace.Record
			low := -1
			for k := 0; ; k++ {
				at := time.Duration(k)*c.interval - c.offset
				if k == 0 {
					at = 0
				}
				if at > 4*gap*aging {
					break
				}
				if low < 0 && at > t0 {
					low = len(recs)
					recs = append(recs, trace.Record{Arrival: t0, InputLength: input, OutputLength: output, Priority: 0, HasPriority: true})
				}
				recs = append(recs, trace.Record{Arrival: at, InputLength: input, OutputLength: output, Priority: gap, HasPriority: true})
			}
			for i := range recs {
				recs[i].Index, recs[i].Line = i, i+1
			}
			_, outs, sent := runQueued(t, b, recs, 1, nil)
			if outs[low].Status != "ok" || *outs[low].Priority != 0 || *outs[low+1].Priority != gap {
				t.Fatalf("low request %+v", outs[low])
			}
			wait := sent[low] - t0
			if q := time.Duration(math.Round(outs[low].QueueMs * float64(time.Millisecond))); q < wait-time.Microsecond {
				t.Fatalf("queue_ms %v < router wait %v", q, wait)
			}
			// The grid tick g intervals after the low request's arrival:
			// requests arriving at or after it rank below it.
			tick := (t0/aging + gap) * aging
			passed, ahead := 0, 0
			for i := range recs {
				if i == low {
					continue
				}
				if recs[i].Arrival < tick && sent[i] >= t0 {
					ahead++ // waiting at t0 or arriving in the window: may pass it
				}
				if sent[i] < sent[low] || (sent[i] == sent[low] && i < low) {
					if sent[i] >= t0 && recs[i].Arrival >= tick {
						t.Fatalf("request %d arrived at %v, after the tick %v, and was dispatched at %v before the low request (%v)",
							i, recs[i].Arrival, tick, sent[i], sent[low])
					}
					if sent[i] >= t0 {
						passed++
					}
				}
			}
			bound := time.Duration(ahead+1) * S
			simple := gap*aging + S
			t.Logf("S %v; low request waited %v, passed by %d; bound (%d waiting or arriving before %v, +1) × S = %v; g·aging + S = %v",
				S, wait, passed, ahead, tick, bound, simple)
			if passed == 0 {
				t.Fatal("no high-priority request passed the low one: the stream did not load the queue")
			}
			if wait > bound {
				t.Fatalf("wait %v > bound %v", wait, bound)
			}
			if c.interval == S && wait > simple {
				t.Fatalf("one arrival per service: wait %v > g·aging + S = %v", wait, simple)
			}
			// The stream goes on after the low request was served.
			if recs[len(recs)-1].Arrival < sent[low]+10*aging {
				t.Fatalf("stream ended at %v, low dispatched at %v", recs[len(recs)-1].Arrival, sent[low])
			}
		})
	}
}

// dueClassifier gives every request a due time `within` after its arrival
// on the router's clock, and checks what the replay puts in each request.
type dueClassifier struct {
	within time.Duration
	mu     sync.Mutex
	bad    []string
}

func (*dueClassifier) Inputs() shared.Inputs { return 0 }

func (c *dueClassifier) NewClassifier(pc shared.PartitionContext) (shared.Classifier, error) {
	return &dueClassify{c: c, now: pc.Now}, nil
}

type dueClassify struct {
	c   *dueClassifier
	now func() time.Time
}

func (d *dueClassify) Classify(_ context.Context, req *shared.Request) (shared.Classification, error) {
	i, _ := strconv.Atoi(req.ID)
	want := fmt.Sprintf("session-%d", i%3)
	if req.SessionID != want || req.Metadata[MetadataPriority] != strconv.Itoa(i%5) || req.Metadata[MetadataPolicyClass] != "" {
		d.c.mu.Lock()
		d.c.bad = append(d.c.bad, fmt.Sprintf("request %s: session %q metadata %v", req.ID, req.SessionID, req.Metadata))
		d.c.mu.Unlock()
	}
	return shared.Classification{Priority: i % 5, DueAt: d.now().Add(d.c.within)}, nil
}

// (c) Due times: 30 requests at t=0 on one worker that takes one at a time,
// each due 10 service times after arrival. About ten are dispatched; the
// others are rejected when their due time passes in the queue, with a
// status that says so, and none is dispatched after its due time.
func TestQueueDueTimesReject(t *testing.T) {
	b := loadPolicy(t, `
queue {
  max_active_requests = 1
  class "all" {}
}
policy "rr" {
  picker "rr" { type = "round-robin" }
}
worker_selection { aggregated = "rr" }
`)
	const input, output = 512, 4
	S := serviceTime(t, input, output)
	cl := &dueClassifier{within: 10*S - S/2}
	recs := make([]trace.Record, 30)
	for i := range recs {
		recs[i] = trace.Record{Index: i, Line: i + 1, InputLength: input, OutputLength: output,
			Priority: i % 5, HasPriority: true, SessionID: fmt.Sprintf("session-%d", i%3)}
	}
	rep, outs, sent := runQueued(t, b, recs, 1, func(o *Options) { o.Classifier = cl })
	if len(cl.bad) > 0 {
		t.Fatalf("requests as classified: %v", cl.bad)
	}
	const status = "rejected: the request's due time passed while it was queued"
	due, ok := 0, 0
	for i, o := range outs {
		switch {
		case o.Status == "ok":
			ok++
			if sent[i] < 0 || sent[i] > cl.within {
				t.Errorf("request %d dispatched at %v, due at %v", i, sent[i], cl.within)
			}
		case o.Status == status:
			due++
			if o.Worker != -1 || sent[i] != -1 || o.TTFTMs != 0 {
				t.Errorf("rejected request %d: %+v, sent at %v", i, o, sent[i])
			}
		default:
			t.Errorf("request %d: status %q", i, o.Status)
		}
		if *o.Priority != i%5 || o.PolicyClass != "all" {
			t.Errorf("request %d: priority %d class %q", i, *o.Priority, o.PolicyClass)
		}
	}
	if ok < 9 || ok > 11 || due != len(recs)-ok {
		t.Fatalf("%d ok, %d rejected by due time; want about 10 ok and the rest rejected", ok, due)
	}
	if !strings.Contains(status, "due time passed") || rep.RejectionReasons[strings.TrimPrefix(status, "rejected: ")] != due {
		t.Fatalf("rejection reasons %v", rep.RejectionReasons)
	}
	if c := rep.Classes["all"]; len(rep.Classes) != 1 || c == nil || c.Requests != 30 || c.Rejected != due || c.Completed != ok {
		t.Fatalf("classes %+v", rep.Classes)
	}
	// Higher priorities went first: every dispatched request (after the
	// first, placed on arrival) has priority 4 or 3.
	for i, o := range outs {
		if o.Status == "ok" && sent[i] > 0 && *o.Priority < 3 {
			t.Errorf("request %d of priority %d dispatched at %v", i, *o.Priority, sent[i])
		}
	}
}

// Without a queue block or classifier the lines carry no priority or
// policy_class (the default configuration's output is unchanged, see
// TestDefaultConfigOutputUnchanged), and the report has the one class
// "default" and no class rows in the table.
func TestDefaultConfigHasOneClass(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")[:50]
	var buf bytes.Buffer
	rep := run(t, loadPolicy(t, roundRobin), "rr", recs, 2, &buf)
	if strings.Contains(buf.String(), `"priority"`) || strings.Contains(buf.String(), `"policy_class"`) {
		t.Fatalf("default lines carry class fields:\n%s", buf.String()[:300])
	}
	if c := rep.Classes["default"]; len(rep.Classes) != 1 || c == nil || c.Requests != 50 || c.Completed != 50 || c.TTFT != rep.TTFT || c.Queue != rep.Queue {
		t.Fatalf("classes %+v", rep.Classes)
	}
	var table bytes.Buffer
	if err := report.WriteTable(&table, []*report.Report{rep}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(table.String(), "rr/default") || strings.Contains(table.String(), "POLICY/CLASS") {
		t.Fatalf("table has class rows:\n%s", table.String())
	}
}
