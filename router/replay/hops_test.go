package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/trace"
	"github.com/switchyard-router/switchyard/shared"
)

// lifecycle is one admitted hop's events, by request id.
type lifecycle struct {
	sent, end time.Duration // simulated; -1 when it has none
	worker    shared.WorkerID
	ended     shared.EventKind
	first     bool
}

// hops checks every admitted request's events (ids "i" and "i#d"): sent?
// -> first_token? -> exactly one completed or aborted, in time order; it
// returns each id's lifecycle.
func (l *eventLog) hops(t *testing.T) map[string]*lifecycle {
	t.Helper()
	out := map[string]*lifecycle{}
	var last time.Time
	for _, e := range l.events {
		if e.At.Before(last) {
			t.Fatalf("event %+v before the previous one at %v", e, last)
		}
		last = e.At
		lc := out[e.RequestID]
		if lc == nil {
			lc = &lifecycle{sent: -1, end: -1}
			out[e.RequestID] = lc
		}
		at := e.At.Sub(Epoch())
		ok := lc.ended == 0
		switch e.Kind {
		case shared.EventSent:
			ok = ok && lc.sent < 0
			lc.sent, lc.worker = at, e.Worker
		case shared.EventFirstToken:
			ok = ok && lc.sent >= 0 && !lc.first && e.Worker == lc.worker
			lc.first = true
		case shared.EventCompleted, shared.EventAborted:
			ok = ok && (e.Kind == shared.EventAborted || lc.sent >= 0)
			lc.ended, lc.end = e.Kind, at
		}
		if !ok {
			t.Fatalf("request %s: %s out of order (%+v)", e.RequestID, e.Kind, lc)
		}
	}
	for id, lc := range out {
		if lc.ended == 0 {
			t.Fatalf("request %s never ended: %+v", id, lc)
		}
	}
	return out
}

// classifyLog is a classifier factory that records every request it
// classifies, per partition, and classifies nothing.
type classifyLog struct {
	mu   sync.Mutex
	seen map[string]shared.Request // by request id
	role map[string]shared.Role    // the partition's role, by request id
}

func (*classifyLog) Inputs() shared.Inputs { return 0 }

func (c *classifyLog) NewClassifier(pc shared.PartitionContext) (shared.Classifier, error) {
	return classifyFunc(func(req *shared.Request) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.seen[req.ID] = *req
		c.role[req.ID] = pc.Role
	}), nil
}

type classifyFunc func(*shared.Request)

func (f classifyFunc) Classify(_ context.Context, req *shared.Request) (shared.Classification, error) {
	f(req)
	return shared.Classification{}, nil
}

// The decode hop is admitted like the prefill hop: classified (in the
// decode partition, as "i#d", without block hashes, with the request's
// session and metadata), queued when every decode worker is at capacity,
// dispatched when a decode worker completes a request, and ended with
// completed at the decode worker's last token, which is the request's
// end. Every hop ends exactly once, no booking is left, nothing waits,
// and no worker ever holds more than max_active_requests.
func TestDisaggDecodeHopIsAdmitted(t *testing.T) {
	b := loadPolicy(t, `
queue {
  max_active_requests = 2
  class "all" {}
}
policy "rr" {
  picker "rr" { type = "round-robin" }
}
worker_selection {
  prefill = "rr"
  decode  = "rr"
}
`)
	const n, capacity = 40, 2
	recs := make([]trace.Record, n)
	for i := range recs {
		// Short prompts and long answers at 1 ms intervals: the two
		// prefill workers outpace the one decode worker.
		recs[i] = trace.Record{Index: i, Line: i + 1, Arrival: time.Duration(i) * time.Millisecond, InputLength: 256,
			OutputLength: 64, SessionID: "s" + strconv.Itoa(i%4), Priority: i % 3, HasPriority: true}
	}
	log := &eventLog{}
	cls := &classifyLog{seen: map[string]shared.Request{}, role: map[string]shared.Role{}}
	var perReq bytes.Buffer
	o := Options{PolicyName: "rr", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "generated", Records: recs,
		PrefillWorkers: 2, DecodeWorkers: 1, PerRequest: &perReq, Queue: b.Queue, Classifier: cls,
		Listeners: []shared.EventListener{log}}
	rep, d, err := execute(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed != n || rep.Rejected != 0 {
		t.Fatalf("completed %d rejected %d (%v), want %d, 0", rep.Completed, rep.Rejected, rep.RejectionReasons, n)
	}
	checkBookingsReleased(t, d)
	if d.waiting != 0 || d.decodeWaiting != 0 || d.reps[0].adm.Queued() != 0 {
		t.Fatalf("still waiting: driver %d (decode %d), router %d", d.waiting, d.decodeWaiting, d.reps[0].adm.Queued())
	}
	outs := decodeOutcomes(t, perReq.Bytes(), n)
	hops := log.hops(t)
	if len(hops) != 2*n {
		t.Fatalf("%d admitted requests, want %d (a prefill and a decode hop each)", len(hops), 2*n)
	}
	waited := 0
	for i, o := range outs {
		id := strconv.Itoa(i)
		p, dc := hops[id], hops[id+DecodeIDSuffix]
		if p == nil || dc == nil || p.ended != shared.EventCompleted || dc.ended != shared.EventCompleted || !p.first || !dc.first {
			t.Fatalf("request %d: prefill %+v, decode %+v", i, p, dc)
		}
		// Events name fleet ids, shared.WorkerIDOf of the simulated
		// workers' names; the outcome names their indexes.
		if p.worker != shared.WorkerIDOf("prefill-"+strconv.Itoa(o.Worker)) || dc.worker != shared.WorkerIDOf("decode-2") || o.DecodeWorker != 2 {
			t.Fatalf("request %d: events name workers %d and %d, outcome %d and %d", i, p.worker, dc.worker, o.Worker, o.DecodeWorker)
		}
		// The decode hop is admitted when its prefill completes and
		// ends when the request does.
		if dc.sent < p.end {
			t.Fatalf("request %d: decode hop sent at %v, before its prefill completed at %v", i, dc.sent, p.end)
		}
		if dc.sent > p.end {
			waited++
		}
		if end := recs[i].Arrival + time.Duration(math.Round(o.E2EMs*1e6)); absDuration(dc.end-end) > time.Microsecond {
			t.Fatalf("request %d: decode hop completed at %v, the request at %v (e2e_ms %v)", i, dc.end, end, o.E2EMs)
		}
		// Classified in the decode partition like a request of its own.
		seen, role := cls.seen[id+DecodeIDSuffix], cls.role[id+DecodeIDSuffix]
		if role != shared.RoleDecode || seen.Role != shared.RoleDecode || seen.BlockHashes != nil || seen.PromptTokens != 256 ||
			seen.SessionID != recs[i].SessionID || seen.Metadata[MetadataPriority] != strconv.Itoa(i%3) {
			t.Fatalf("request %d: decode hop classified as %+v in partition %q", i, seen, role)
		}
		if cls.role[id] != shared.RolePrefill {
			t.Fatalf("request %d: prefill hop classified in partition %q", i, cls.role[id])
		}
	}
	if waited == 0 {
		t.Fatal("no decode hop waited for capacity: the test does not load the decode worker")
	}
	if m := maxInFlight(log.events); m != capacity {
		t.Fatalf("at most %d requests in flight on a worker, want max_active_requests %d", m, capacity)
	}
	t.Logf("%d of %d decode hops waited for the decode worker", waited, n)
}

func absDuration(d time.Duration) time.Duration { return max(d, -d) }

// busyPicker picks the first candidate with fewer than limit requests in
// flight and answers shared.ErrAllBusy when there is none: a policy that
// queues requests by itself, without a queue block.
type busyPicker struct{ limit int64 }

func (busyPicker) Inputs() shared.Inputs { return shared.InputActiveRequests }

func (p busyPicker) Pick(_ context.Context, _ *shared.Request, c *shared.Candidates) (int, error) {
	for row, n := range c.ActiveRequests {
		if n < p.limit {
			return row, nil
		}
	}
	return -1, shared.ErrAllBusy
}

// A decode hop whose policy finds every decode worker busy, in a replay
// without a queue block, waits in the decode queue and is dispatched when
// a decode worker completes a request: the replay then steps event by
// event until nothing waits, terminates, and completes every request, no
// decode worker ever holding more than the policy's limit.
func TestDecodePolicyAllBusyWaits(t *testing.T) {
	b := loadPolicy(t, seededDefault)
	roles := map[shared.Role]*policy.Policy{
		shared.RolePrefill: b.Roles[shared.RolePrefill],
		shared.RoleDecode:  {Name: "one-each", PickerName: "p", PickerType: "busy-picker", Picker: busyPicker{limit: 1}},
	}
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")[:60]
	log := &eventLog{}
	o := Options{PolicyName: "busy", Roles: roles, BlockSize: b.BlockSize, TraceName: "arxiv", Records: recs,
		PrefillWorkers: 2, DecodeWorkers: 2, Listeners: []shared.EventListener{log}}
	rep, d, err := execute(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed != len(recs) || rep.Rejected != 0 {
		t.Fatalf("completed %d rejected %d (%v), want %d, 0", rep.Completed, rep.Rejected, rep.RejectionReasons, len(recs))
	}
	checkBookingsReleased(t, d)
	if d.waiting != 0 || d.reps[0].adm.Queued() != 0 {
		t.Fatalf("still waiting: driver %d, router %d", d.waiting, d.reps[0].adm.Queued())
	}
	hops := log.hops(t)
	// A decode hop that waited was dispatched the instant a decode hop on
	// its worker completed.
	freed := map[shared.WorkerID]map[time.Duration]bool{}
	for id, lc := range hops {
		if strings.HasSuffix(id, DecodeIDSuffix) {
			if freed[lc.worker] == nil {
				freed[lc.worker] = map[time.Duration]bool{}
			}
			freed[lc.worker][lc.end] = true
		}
	}
	waited := 0
	for i := range recs {
		id := strconv.Itoa(i)
		if recs[i].OutputLength <= 1 {
			continue
		}
		p, dc := hops[id], hops[id+DecodeIDSuffix]
		if p == nil || dc == nil || dc.ended != shared.EventCompleted {
			t.Fatalf("request %d: prefill %+v, decode %+v", i, p, dc)
		}
		if dc.sent > p.end {
			waited++
			if !freed[dc.worker][dc.sent] {
				t.Fatalf("request %d: decode hop waited from %v and was dispatched at %v, when no decode hop on worker %d completed",
					i, p.end, dc.sent, dc.worker)
			}
		}
	}
	if waited == 0 {
		t.Fatal("no decode hop waited: the policy never found every decode worker busy")
	}
	active := map[shared.WorkerID]int{}
	for _, e := range log.events {
		if !strings.HasSuffix(e.RequestID, DecodeIDSuffix) {
			continue
		}
		switch e.Kind {
		case shared.EventSent:
			if active[e.Worker]++; active[e.Worker] > 1 {
				t.Fatalf("decode worker %d holds %d requests, the policy allows 1", e.Worker, active[e.Worker])
			}
		case shared.EventCompleted, shared.EventAborted:
			active[e.Worker]--
		}
	}
	t.Logf("%d decode hops waited", waited)
}

// failPicker always fails, so its policy's fallback decides.
type failPicker struct{}

func (failPicker) Inputs() shared.Inputs { return 0 }
func (failPicker) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	return -1, errors.New("injected failure")
}

// firstPicker picks row 0.
type firstPicker struct{}

func (firstPicker) Inputs() shared.Inputs { return 0 }
func (firstPicker) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	return 0, nil
}

// latencyRun replays recs on one aggregated worker with the given roles,
// latency and options, and returns the per-request outcomes and the
// lifecycle of each request.
func latencyRun(t *testing.T, roles map[shared.Role]*policy.Policy, recs []trace.Record, lat DecisionLatency, opt func(*Options)) ([]Outcome, map[string]*lifecycle) {
	t.Helper()
	var perReq bytes.Buffer
	log := &eventLog{}
	o := Options{PolicyName: "lat", Roles: roles, BlockSize: 16, TraceName: "generated", Records: recs, Workers: 1,
		PerRequest: &perReq, Listeners: []shared.EventListener{log}, DecisionLatency: lat}
	if opt != nil {
		opt(&o)
	}
	_, d, err := execute(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkBookingsReleased(t, d)
	var outs []Outcome
	for line := range strings.Lines(perReq.String()) {
		var out Outcome
		if err := json.Unmarshal([]byte(line), &out); err != nil {
			t.Fatal(err)
		}
		outs = append(outs, out)
	}
	if len(outs) != len(recs) {
		t.Fatalf("%d lines for %d requests", len(outs), len(recs))
	}
	return outs, log.hops(t)
}

// A decision's latency is charged in simulated time: the router decides
// and books at the decision (sent), and the worker receives the request
// the latency later, so queue_ms, TTFT and E2E grow by exactly it. The
// charge is the role policy's, plus the fallback's when the fallback
// decided, plus the classifier's for a classified request; an advisory
// target taken without the policy charges only the classifier.
func TestDecisionLatencyIsChargedInSimulatedTime(t *testing.T) {
	rr := loadPolicy(t, "router { block_size = 16 }\n"+roundRobin)
	recs := []trace.Record{
		{Index: 0, InputLength: 1000, OutputLength: 8, SessionID: "a"},
		{Index: 1, Arrival: time.Second, InputLength: 1000, OutputLength: 8, SessionID: "a"},
	}
	base, _ := latencyRun(t, rr.Roles, recs, DecisionLatency{}, nil)
	for i, o := range base {
		if o.DecisionMs != 0 || o.QueueMs != 0 || o.Status != "ok" {
			t.Fatalf("without latency, request %d: %+v", i, o)
		}
	}
	// shift checks that request i's latencies are base's plus ms, and
	// that it was sent (decided) on arrival.
	shift := func(t *testing.T, outs []Outcome, hops map[string]*lifecycle, i int, ms float64) {
		t.Helper()
		o, b := outs[i], base[i]
		if o.DecisionMs != ms || o.QueueMs != b.QueueMs+ms || round3(o.TTFTMs-b.TTFTMs) != ms || round3(o.E2EMs-b.E2EMs) != ms {
			t.Errorf("request %d: decision %v queue %v TTFT %v E2E %v; want decision %v and base's (%v, %v, %v) + %v",
				i, o.DecisionMs, o.QueueMs, o.TTFTMs, o.E2EMs, ms, b.QueueMs, b.TTFTMs, b.E2EMs, ms)
		}
		if lc := hops[strconv.Itoa(i)]; lc.sent != recs[i].Arrival {
			t.Errorf("request %d sent (decided and booked) at %v, want its arrival %v", i, lc.sent, recs[i].Arrival)
		}
	}

	t.Run("policy", func(t *testing.T) {
		outs, hops := latencyRun(t, rr.Roles, recs, DecisionLatency{Policies: map[string]time.Duration{"rr": 300 * time.Microsecond}}, nil)
		shift(t, outs, hops, 0, 0.3)
		shift(t, outs, hops, 1, 0.3)
	})
	t.Run("fallback", func(t *testing.T) {
		roles := map[shared.Role]*policy.Policy{shared.RoleAggregated: {Name: "bad", PickerName: "p", PickerType: "fail", Picker: failPicker{},
			Fallback: &policy.Policy{Name: "first", PickerName: "p", PickerType: "first", Picker: firstPicker{}}}}
		outs, hops := latencyRun(t, roles, recs, DecisionLatency{Policies: map[string]time.Duration{"bad": 300 * time.Microsecond, "first": 100 * time.Microsecond}}, nil)
		shift(t, outs, hops, 0, 0.4)
		if !outs[0].Fallback {
			t.Error("the fallback decided but the line does not say so")
		}
	})
	t.Run("classifier and target", func(t *testing.T) {
		b := loadPolicy(t, "router { block_size = 16 }\nrequest_classifier {\n  type = \"session-affinity\"\n}\n"+roundRobin)
		cls := b.Classifier.Instance.(shared.ClassifierFactory)
		lat := DecisionLatency{Policies: map[string]time.Duration{"rr": 300 * time.Microsecond}, Classifier: 50 * time.Microsecond}
		outs, hops := latencyRun(t, b.Roles, recs, lat, func(o *Options) { o.Classifier = cls })
		// Request 0 is classified and placed by the policy; request 1,
		// of the same session, goes to its session's worker (the
		// advisory target) without the policy.
		shift(t, outs, hops, 0, 0.35)
		shift(t, outs, hops, 1, 0.05)
	})
}

// With a queue, a dispatched request reaches its worker the decision
// latency after its dispatch: one worker that takes one request at a
// time, a burst of five, 1 ms per decision. Each request is dispatched
// when the one before completes and is scheduled exactly 1 ms later.
func TestDecisionLatencyAfterDispatch(t *testing.T) {
	b := loadPolicy(t, "router { block_size = 16 }\nqueue {\n  max_active_requests = 1\n  class \"all\" {}\n}\n"+roundRobin)
	recs := make([]trace.Record, 5)
	for i := range recs {
		recs[i] = trace.Record{Index: i, InputLength: 500, OutputLength: 4}
	}
	outs, hops := latencyRun(t, b.Roles, recs, DecisionLatency{Policies: map[string]time.Duration{"rr": time.Millisecond}},
		func(o *Options) { o.Queue = b.Queue })
	prevEnd := time.Duration(0)
	for i, o := range outs {
		lc := hops[strconv.Itoa(i)]
		if o.Status != "ok" || o.DecisionMs != 1 {
			t.Fatalf("request %d: %+v", i, o)
		}
		if i > 0 && lc.sent != prevEnd {
			t.Errorf("request %d dispatched at %v, want when request %d completed, %v", i, lc.sent, i-1, prevEnd)
		}
		if want := report.Millis(lc.sent + time.Millisecond); o.QueueMs != want {
			t.Errorf("request %d: queue_ms %v, want its dispatch at %v + 1 ms = %v", i, o.QueueMs, lc.sent, want)
		}
		prevEnd = lc.end
	}
}

// In disaggregated mode each hop is charged its own role's policy, and
// the decode hop's KV transfer starts when its decision latency ends.
func TestDecisionLatencyDisaggregated(t *testing.T) {
	b := loadPolicy(t, "router {\n  block_size = 16\n}\n")
	recs := []trace.Record{{Index: 0, InputLength: 1000, OutputLength: 3}}
	var plain, charged bytes.Buffer
	runDisagg(t, b, recs, 1, 1, 0, &plain)
	o := Options{PolicyName: "default", Roles: b.Roles, BlockSize: 16, TraceName: "t", Records: recs,
		PrefillWorkers: 1, DecodeWorkers: 1, PerRequest: &charged,
		DecisionLatency: DecisionLatency{Policies: map[string]time.Duration{config.DefaultPolicyName: 200 * time.Microsecond}}}
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	// TestDisaggOneRequest derives the plain line by hand: TTFT 23.53 ms,
	// transfer 2.621 ms, E2E 39.314 ms. The charged one has 0.2 ms before
	// the prefill and 0.2 ms before the transfer.
	want := `{"index":0,"arrival_ms":0,"worker":0,"decode_worker":1,"input_length":1000,"output_length":3,"overlap_blocks":0,"cached_tokens":0,"decision_ms":0.4,"queue_ms":0.2,"ttft_ms":23.73,"kv_transfer_ms":2.621,"e2e_ms":39.714,"status":"ok"}` + "\n"
	if charged.String() != want {
		t.Fatalf("per-request line\n%s\nwant\n%s\n(without latency:\n%s)", charged.String(), want, plain.String())
	}
}

// Without a queue block the replay runs first-hop steps in batches up to
// the next arrival; a decode hop that starts waiting inside such a batch
// is still dispatched the instant the decode worker frees, not at the
// next arrival ten seconds later.
func TestDecodeHopDispatchedWhenDecodeWorkerFrees(t *testing.T) {
	b := loadPolicy(t, "router {\n  block_size = 16\n}\n")
	roles := map[shared.Role]*policy.Policy{
		shared.RolePrefill: b.Roles[shared.RolePrefill],
		shared.RoleDecode:  {Name: "one", PickerName: "p", PickerType: "busy-picker", Picker: busyPicker{limit: 1}},
	}
	recs := []trace.Record{
		{Index: 0, InputLength: 1000, OutputLength: 200},
		{Index: 1, Arrival: time.Millisecond, InputLength: 100, OutputLength: 10},
		{Index: 2, Arrival: 10 * time.Second, InputLength: 100, OutputLength: 10},
	}
	log := &eventLog{}
	o := Options{PolicyName: "one", Roles: roles, BlockSize: 16, TraceName: "t", Records: recs,
		PrefillWorkers: 1, DecodeWorkers: 1, Listeners: []shared.EventListener{log}}
	rep, d, err := execute(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkBookingsReleased(t, d)
	if rep.Completed != 3 {
		t.Fatalf("completed %d of 3: %v", rep.Completed, rep.RejectionReasons)
	}
	hops := log.hops(t)
	d0, p1, d1 := hops["0"+DecodeIDSuffix], hops["1"], hops["1"+DecodeIDSuffix]
	if !(p1.end < d0.end && d0.end < recs[2].Arrival) {
		t.Fatalf("request 1's prefill ended at %v, request 0's decode at %v: the decode hop of 1 did not wait", p1.end, d0.end)
	}
	if d1.sent != d0.end {
		t.Fatalf("request 1's decode hop was dispatched at %v, want when request 0's decode completed, %v", d1.sent, d0.end)
	}
}

// rejectReason cuts the hop's own id out of an error that carries it (a
// plugin classifier's answer, in the SDK's words) and leaves other text.
func TestRejectReasonDropsTheRequestID(t *testing.T) {
	cause := errors.New(`plugin p: classifier c: request "12": no such tenant`)
	for _, tt := range []struct {
		err  error
		i, k int
		want string
	}{
		{fmt.Errorf("classifier request_classifier: %w", cause), 12, firstHop, "classifier request_classifier: plugin p: classifier c: no such tenant"},
		{errors.New(`classifier c: request "12#d": no such tenant`), 12, decodeHop, "classifier c: no such tenant"},
		{errors.New(`classifier c: request "120": no such tenant`), 12, firstHop, `classifier c: request "120": no such tenant`},
		{fmt.Errorf("x: %w", &shared.NoHeadroomError{}), 3, firstHop, RejectNoHeadroom},
	} {
		if got := rejectReason(tt.err, tt.i, tt.k); got != tt.want {
			t.Errorf("rejectReason(%q, %d, %d) = %q, want %q", tt.err, tt.i, tt.k, got, tt.want)
		}
	}
}
