package plugincheck

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard-router/switchyard/internal/pluginclient"
	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/shared"
	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
	"github.com/switchyard-router/switchyard/shared/pluginwire"
)

// wire speaks switchyard.plugin.v1 to the plugin directly, over the
// connection the host's own client uses, for the checks that need to
// compose messages themselves.
type wire struct {
	c    pluginv1.PluginClient
	role shared.Role
	// startTimeout bounds each Configure, as the router bounds one.
	startTimeout time.Duration
}

func newWire(conn *grpc.ClientConn, role shared.Role, startTimeout time.Duration) *wire {
	if startTimeout <= 0 {
		startTimeout = config.DefaultStartTimeout
	}
	return &wire{c: pluginv1.NewPluginClient(conn), role: role, startTimeout: startTimeout}
}

// answerWait bounds how long a wire check waits for the answers it is
// owed: the router kills a plugin that leaves its Decide calls unanswered
// this long (supervisor.DefaultStallTimeout). A variable so that a test of
// a plugin that drops an answer need not wait that long.
var answerWait = 30 * time.Second

// drainWait bounds how long a Decide stream the check closed is read for
// stray results before the plugin ends it.
const drainWait = 5 * time.Second

// taskIDBase is the first task id the wire checks send: above 2^62, and so
// above 2^53, like a long-running router's ids.
const taskIDBase = 1 << 62

// boundaryValues are the values of each parameter type the boundary check
// configures.
func boundaryValues(t shared.ParamType) []any {
	switch t {
	case shared.Int:
		return []any{int64(0), int64(-1), int64(1), int64(math.MinInt64), int64(math.MaxInt64)}
	case shared.Number:
		return []any{0.0, -1.0, math.SmallestNonzeroFloat64, math.MaxFloat64, -math.MaxFloat64}
	case shared.String:
		return []any{"", strings.Repeat("x", 1<<16), "ünïcödé ✓"}
	case shared.Duration:
		return []any{time.Duration(0), time.Duration(-1), time.Duration(1), time.Duration(math.MaxInt64), time.Duration(math.MinInt64)}
	case shared.Bool:
		return []any{false, true}
	case shared.StringList:
		return []any{[]string{}, []string{""}, []string{"a", "ünïcödé ✓", strings.Repeat("x", 1<<16)}}
	case shared.NumberList:
		return []any{[]float64{}, []float64{0, -1, math.SmallestNonzeroFloat64, math.MaxFloat64, -math.MaxFloat64}}
	}
	return nil
}

// showValue prints a boundary value shortly.
func showValue(v any) string {
	if s, ok := v.(string); ok && len(s) > 20 {
		return fmt.Sprintf("a string of %d bytes", len(s))
	}
	return fmt.Sprintf("%#v", v)
}

// checkBoundaries configures an instance of t once per boundary value of
// each parameter, the others as in params. Each must be accepted, or
// refused with a Diagnostic naming that parameter; a gRPC error (a crash,
// a hang past start_timeout, a transport error) or a refusal naming no
// parameter or another one fails.
func (w *wire) checkBoundaries(ctx context.Context, t shared.TypeInfo, params shared.Params) []Result {
	var out []Result
	for _, p := range t.Params {
		name := fmt.Sprintf("configure %q boundaries of %q", t.Name, p.Name)
		var accepted, refused int
		var bad *Result
		for _, v := range boundaryValues(p.Type) {
			ps := maps.Clone(params)
			ps[p.Name] = v
			expected := fmt.Sprintf("%s accepted, or refused with a Diagnostic naming %q", showValue(v), p.Name)
			resp, err := w.configure(ctx, t, instanceName(t.Name)+"-boundary", ps)
			if err != nil {
				bad = &Result{Name: name, Expected: expected, Got: err.Error()}
				break
			}
			diags := resp.GetDiagnostics()
			if len(diags) == 0 {
				accepted++
				continue
			}
			if !slices.ContainsFunc(diags, func(d *pluginv1.Diagnostic) bool { return d.GetParam() == p.Name }) {
				bad = &Result{Name: name, Expected: expected, Got: fmt.Sprintf("a refusal naming %q: %s", diags[0].GetParam(), diags[0].GetSummary())}
				break
			}
			refused++
		}
		if bad != nil {
			out = append(out, *bad)
			continue
		}
		out = append(out, pass(name, fmt.Sprintf("of %d values %d accepted, %d refused naming it", accepted+refused, accepted, refused)))
	}
	return out
}

// checkInputs configures an instance of t with params over the wire and
// checks the inputs its answer declares: a subset of the type's (the
// router collects only the type's for it).
func (w *wire) checkInputs(ctx context.Context, t shared.TypeInfo, params shared.Params) Result {
	name := fmt.Sprintf("configure %q inputs", t.Name)
	resp, err := w.configure(ctx, t, instanceName(t.Name)+"-inputs", params)
	switch {
	case err != nil:
		return fail(name, "the instance configured again", err.Error())
	case len(resp.GetDiagnostics()) > 0:
		return fail(name, "the instance configured again", resp.GetDiagnostics()[0].GetSummary())
	}
	got := resp.GetInputs()
	if extra := got &^ uint32(t.Inputs); extra != 0 {
		return fail(name, fmt.Sprintf("the instance's inputs a subset of its type's (%v)", t.Inputs),
			fmt.Sprintf("%v (%#x), of which %v (%#x) beyond its type's", shared.Inputs(got), got, shared.Inputs(extra), extra))
	}
	return pass(name, fmt.Sprintf("%v, a subset of its type's", shared.Inputs(got)))
}

// configure configures instance of t with params over the wire, under the
// plugin's start timeout.
func (w *wire) configure(ctx context.Context, t shared.TypeInfo, instance string, params shared.Params) (*pluginv1.ConfigureResponse, error) {
	req := &pluginv1.ConfigureRequest{Instance: instance, Type: t.Name, Role: string(instanceRole(t, w.role)), BlockSize: 16,
		Params: make(map[string]*pluginv1.Value, len(params))}
	for name, v := range params {
		pv, err := pluginwire.ValueToProto(v)
		if err != nil {
			return nil, fmt.Errorf("parameter %q: %w", name, err)
		}
		req.Params[name] = pv
	}
	cctx, cancel := context.WithTimeout(ctx, w.startTimeout)
	defer cancel()
	return w.c.Configure(cctx, req)
}

// columns are c's rows as the router sends them.
func columns(c *shared.Candidates) *pluginv1.Columns {
	col := &pluginv1.Columns{}
	pluginclient.CandidatesToProto(c, col)
	return col
}

// protoRequest is r as the router sends it.
func protoRequest(r *shared.Request) *pluginv1.Request {
	return &pluginv1.Request{Id: r.ID, Model: r.Model, Role: string(r.Role), PromptTokens: uint32(r.PromptTokens),
		BlockSize: uint32(r.BlockSize), BlockHashes: r.BlockHashes, SessionId: r.SessionID}
}

// want is what a task's answer must look like: the kind of its one stage
// over n rows, or an error.
type want struct {
	kind     shared.Kind
	instance string
	n        int
	wantErr  bool
}

// task is a DecideTask of one stage, instance of kind, over n rows with
// every column set: the batch and stream checks also check that a
// component ignores the columns it did not declare, which the router sends
// when another component of the policy declared them.
func (w *wire) task(id uint64, instance string, kind shared.Kind, n int) *pluginv1.DecideTask {
	weight := 0.0
	if kind == shared.KindScorer {
		weight = 1
	}
	return &pluginv1.DecideTask{TaskId: id, Request: protoRequest(request(w.role)), Candidates: columns(candidates(n, shared.AllInputs)),
		Stages: []*pluginv1.Stage{{Instance: instance, Weight: weight}}}
}

// checkResult says what the router would do with r as the answer wt
// describes, "" when it accepts it: the router's own check of an answer
// (pluginclient.CheckResult, by which the supervisor fails the call, and
// the policy's fallback decides) after the client's own reading of it
// (pluginclient.ResultFromProto). What the router ignores (costs from a
// task without a scorer, a picked row from one without a picker) is not
// a failure: routing accepts the answer; kept rows from a task without a
// filter are accepted when they are every row (CheckResult).
func checkResult(r *pluginv1.DecideResult, wt want) string {
	if wt.wantErr {
		if r.GetError() == "" {
			return "no error for a task naming an instance never configured"
		}
		return ""
	}
	if e := r.GetError(); e != "" {
		return `the error "` + untrusted.Text(e, untrusted.MaxLog) + `": the router would fall back on this decision`
	}
	stages := []pluginclient.Stage{{Instance: wt.instance, Kind: wt.kind}}
	task := &pluginclient.Task{Candidates: &shared.Candidates{IDs: make([]shared.WorkerID, wt.n)}, Stages: stages}
	if err := pluginclient.CheckResult(task, pluginclient.ResultFromProto(r, stages)); err != nil {
		return "the router would fall back on this decision because " + err.Error()
	}
	return ""
}

// decideStream is one Decide stream the check opened, its results read
// into a channel.
type decideStream struct {
	s      grpc.BidiStreamingClient[pluginv1.DecideBatch, pluginv1.DecideResults]
	cancel context.CancelFunc
	in     chan *pluginv1.DecideResult
	// ended is closed once the plugin ended the stream; err says how.
	ended chan struct{}
	err   error
}

func (w *wire) openDecide(ctx context.Context) (*decideStream, error) {
	sctx, cancel := context.WithCancel(ctx)
	s, err := w.c.Decide(sctx)
	if err != nil {
		cancel()
		return nil, err
	}
	d := &decideStream{s: s, cancel: cancel, in: make(chan *pluginv1.DecideResult, 64), ended: make(chan struct{})}
	go func() {
		defer close(d.ended)
		for {
			m, err := s.Recv()
			if err != nil {
				d.err = err
				return
			}
			for _, r := range m.GetResults() {
				select {
				case d.in <- r:
				case <-sctx.Done():
					d.err = sctx.Err()
					return
				}
			}
		}
	}()
	return d, nil
}

// exchange sends tasks in one DecideBatch and reads results until every
// task has one or answerWait passes, recording them in answered (shared by
// the exchanges of a stream). It returns the task ids in the order
// answered and the problems seen: a result for a task not sent (or sent
// on another stream), a second result for a task, a malformed one, a
// missing one.
func (d *decideStream) exchange(tasks []*pluginv1.DecideTask, wants map[uint64]want, answered map[uint64]bool) (order []uint64, problems []string) {
	if err := d.s.Send(&pluginv1.DecideBatch{Tasks: tasks}); err != nil {
		return nil, []string{"sending the batch failed: " + err.Error()}
	}
	pending := make(map[uint64]bool, len(tasks))
	for _, t := range tasks {
		pending[t.GetTaskId()] = true
	}
	take := func(r *pluginv1.DecideResult) {
		if p := d.take(r, wants, answered); p != "" {
			problems = append(problems, p)
		} else {
			order = append(order, r.GetTaskId())
		}
		delete(pending, r.GetTaskId())
	}
	timeout := time.NewTimer(answerWait)
	defer timeout.Stop()
	for len(pending) > 0 {
		select {
		case r := <-d.in:
			take(r)
		case <-d.ended:
			// Results read before the end are still in d.in.
			for len(d.in) > 0 {
				take(<-d.in)
			}
			return order, append(problems, missing(tasks, answered, fmt.Sprintf("the stream ended (%v)", d.err))...)
		case <-timeout.C:
			return order, append(problems, missing(tasks, answered, "no result within "+answerWait.String())...)
		}
	}
	return order, problems
}

// take records one result in answered and says what is wrong with it, ""
// when nothing is.
func (d *decideStream) take(r *pluginv1.DecideResult, wants map[uint64]want, answered map[uint64]bool) string {
	id := r.GetTaskId()
	wt, ok := wants[id]
	switch {
	case !ok:
		return fmt.Sprintf("a result for task %d, which was not sent on this stream", id)
	case answered[id]:
		return fmt.Sprintf("a second result for task %d", id)
	}
	answered[id] = true
	if p := checkResult(r, wt); p != "" {
		return fmt.Sprintf("for task %d (%d rows): %s", id, wt.n, p)
	}
	return ""
}

// missing lists the tasks without a result.
func missing(tasks []*pluginv1.DecideTask, answered map[uint64]bool, why string) []string {
	var out []string
	for _, t := range tasks {
		if !answered[t.GetTaskId()] {
			out = append(out, fmt.Sprintf("no result for task %d: %s", t.GetTaskId(), why))
		}
	}
	return out
}

// finish closes the stream's sending side and reads what the plugin still
// sends until it ends the stream (drainWait at most): any result then is
// one no task is owed.
func (d *decideStream) finish(wants map[uint64]want, answered map[uint64]bool) []string {
	defer d.cancel()
	if err := d.s.CloseSend(); err != nil {
		return nil
	}
	var problems []string
	timeout := time.NewTimer(drainWait)
	defer timeout.Stop()
	for {
		select {
		case r := <-d.in:
			if p := d.take(r, wants, answered); p != "" {
				problems = append(problems, p)
			}
		case <-d.ended:
			for len(d.in) > 0 {
				if p := d.take(<-d.in, wants, answered); p != "" {
					problems = append(problems, p)
				}
			}
			return problems
		case <-timeout.C:
			return problems
		}
	}
}

// problemsGot joins the first few problems for a failed check.
func problemsGot(problems []string) string {
	const show = 3
	got := strings.Join(problems[:min(len(problems), show)], "; ")
	if len(problems) > show {
		got += fmt.Sprintf("; and %d more", len(problems)-show)
	}
	return got
}

// oneResultPerTask is what the wire Decide checks expect.
const oneResultPerTask = "exactly one well-formed result per task, matched by task_id"

// batchRows are the row counts of the tasks of the batch check, per type:
// the largest first, so that a plugin running tasks concurrently answers
// the small ones before it.
var batchRows = []int{4096, 1, 64, 8, 2}

// checkBatch sends, on a Decide stream of its own, one DecideBatch holding
// a task of each of batchRows for every decision type, plus a task naming
// an instance never configured, and checks each result by its task id,
// in whatever order and grouping they come: exactly one each, well formed
// for its own rows, an error for the unknown instance.
func (w *wire) checkBatch(ctx context.Context, types []configured) Result {
	const name = "decide batch"
	d, err := w.openDecide(ctx)
	if err != nil {
		return fail(name, "a Decide stream", err.Error())
	}
	wants := map[uint64]want{}
	var tasks []*pluginv1.DecideTask
	id := uint64(taskIDBase)
	for _, c := range types {
		for _, n := range batchRows {
			id++
			tasks = append(tasks, w.task(id, c.instance, c.t.Kind, n))
			wants[id] = want{kind: c.t.Kind, instance: c.instance, n: n}
		}
	}
	id++
	tasks = append(tasks, w.task(id, "check/no-such-instance", types[0].t.Kind, 1))
	wants[id] = want{n: 1, wantErr: true}
	answered := make(map[uint64]bool, len(tasks))
	order, problems := d.exchange(tasks, wants, answered)
	problems = append(problems, d.finish(wants, answered)...)
	if len(problems) > 0 {
		return fail(name, oneResultPerTask, problemsGot(problems))
	}
	how := "in the order sent"
	if !slices.IsSorted(order) {
		how = "out of order"
	}
	return pass(name, fmt.Sprintf("%d tasks in one DecideBatch, answered %s", len(tasks), how))
}

// Several streams at once: streams streams, each sending streamMessages
// messages of one task per decision type, in turn, waiting for each
// message's answers.
const (
	streams        = 4
	streamMessages = 8
)

// checkStreams opens several Decide streams at once and sends traffic on
// each concurrently: every result must come on the stream that sent its
// task.
func (w *wire) checkStreams(ctx context.Context, types []configured) Result {
	name := fmt.Sprintf("decide streams=%d", streams)
	problems := make([][]string, streams)
	var wg sync.WaitGroup
	for s := range streams {
		wg.Go(func() {
			d, err := w.openDecide(ctx)
			if err != nil {
				problems[s] = []string{fmt.Sprintf("stream %d: %v", s, err)}
				return
			}
			wants := map[uint64]want{}
			answered := map[uint64]bool{}
			for m := range streamMessages {
				var tasks []*pluginv1.DecideTask
				for i, c := range types {
					id := taskIDBase + uint64(1000*(s+1)+100*m+i)
					n := 1 + (s+m+i)%8
					tasks = append(tasks, w.task(id, c.instance, c.t.Kind, n))
					wants[id] = want{kind: c.t.Kind, instance: c.instance, n: n}
				}
				if _, p := d.exchange(tasks, wants, answered); len(p) > 0 {
					problems[s] = p
					d.cancel()
					return
				}
			}
			problems[s] = d.finish(wants, answered)
		})
	}
	wg.Wait()
	if all := slices.Concat(problems...); len(all) > 0 {
		return fail(name, oneResultPerTask+", on the stream that sent it", problemsGot(all))
	}
	return pass(name, fmt.Sprintf("%d streams at once, %d messages each", streams, streamMessages))
}

// eventsInstance is the instance the events check configures.
func eventsInstance(typ string) string { return "check/" + typ + "-events" }

// checkClassify calls Classify on the classifier instance of t (already
// configured with params) for a few sample requests, some of them at
// once, and checks the answers; then, when an instance configured with
// params says it wants lifecycle events, checks the Events stream and
// events_through.
func (w *wire) checkClassify(ctx context.Context, t shared.TypeInfo, params shared.Params) []Result {
	name := fmt.Sprintf("classify %q", t.Name)
	workers := make([]*pluginv1.WorkerInfo, 4)
	for i := range workers {
		workers[i] = &pluginv1.WorkerInfo{Id: idBase + uint64(i)*7919, TotalKvBlocks: 10000}
	}
	now := time.Now().UnixNano()
	calls := []*pluginv1.ClassifyRequest{
		{Request: protoRequest(request(shared.RoleAggregated))},
		{Request: protoRequest(request(w.role)), WorkersVersion: 1, HasWorkers: true, Workers: workers},
		{Request: protoRequest(request(w.role)), WorkersVersion: 1},
	}
	for i := range 16 {
		r := request(w.role)
		r.ID, r.SessionID = fmt.Sprintf("check-%d", i+2), fmt.Sprintf("session-%d", i%4)
		calls = append(calls, &pluginv1.ClassifyRequest{Request: protoRequest(r), WorkersVersion: uint64(1 + i%3), HasWorkers: i%2 == 0, Workers: workers})
	}
	errs := make([]string, len(calls))
	classify := func(i int) {
		c := calls[i]
		c.Instance, c.NowUnixNano = instanceName(t.Name), now
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		resp, err := w.c.Classify(cctx, c)
		switch {
		case err != nil:
			errs[i] = err.Error()
		case resp.GetDueUnixNano() < 0:
			errs[i] = fmt.Sprintf("due_unix_nano %d", resp.GetDueUnixNano())
		}
	}
	for i := range 3 {
		classify(i)
	}
	var wg sync.WaitGroup
	for i := 3; i < len(calls); i++ {
		wg.Go(func() { classify(i) })
	}
	wg.Wait()
	var out []Result
	if i := slices.IndexFunc(errs, func(s string) bool { return s != "" }); i >= 0 {
		out = append(out, fail(name, fmt.Sprintf("an answer to call %d (of %d; the last %d at once), due_unix_nano >= 0", i+1, len(calls), len(calls)-3), errs[i]))
	} else {
		out = append(out, pass(name, fmt.Sprintf("%d calls, %d at once", len(calls), len(calls)-3)))
	}
	resp, err := w.configure(ctx, t, eventsInstance(t.Name), params)
	switch {
	case err != nil:
		return append(out, fail(fmt.Sprintf("events %q", t.Name), "the instance configured again", err.Error()))
	case len(resp.GetDiagnostics()) > 0:
		return append(out, fail(fmt.Sprintf("events %q", t.Name), "the instance configured again", resp.GetDiagnostics()[0].GetSummary()))
	case !resp.GetEvents():
		return append(out, pass(fmt.Sprintf("events %q", t.Name), "not checked: the instance wants no events"))
	}
	return append(out, w.checkEvents(ctx, t.Name)...)
}

// Event helpers for checkEvents.
func event(req string, kind pluginv1.EventKind, worker uint64) *pluginv1.Event {
	return &pluginv1.Event{RequestId: req, Kind: kind, Worker: worker, HasWorker: worker != 0, UnixNano: time.Now().UnixNano()}
}

// checkEvents opens the Events stream and checks the acknowledgements and
// events_through on the instance eventsInstance(typ):
//
//   - batches 1-3 (events for the instance, for an unknown one, and an
//     empty one with through_seq 4) are acknowledged, each once, in order;
//   - a Classify with events_through 4 answers;
//   - one with events_through 5, never sent, waits: it gets
//     DEADLINE_EXCEEDED at its deadline (1 s), not an answer;
//   - one with events_through 6 answers once batch 4 (through_seq 6) is
//     sent after it.
func (w *wire) checkEvents(ctx context.Context, typ string) []Result {
	acksName := fmt.Sprintf("events %q", typ)
	throughName := fmt.Sprintf("events %q events_through", typ)
	inst := eventsInstance(typ)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := w.c.Events(sctx)
	if err != nil {
		return []Result{fail(acksName, "an Events stream", err.Error())}
	}
	acks := make(chan uint64, 8)
	go func() {
		defer close(acks)
		for {
			a, err := s.Recv()
			if err != nil {
				return
			}
			acks <- a.GetBatchId()
		}
	}()
	w1 := uint64(idBase)
	batches := []*pluginv1.EventBatch{
		{BatchId: 1, Instance: inst, Events: []*pluginv1.Event{
			event("check-ev-1", pluginv1.EventKind_EVENT_KIND_SENT, w1),
			event("check-ev-1", pluginv1.EventKind_EVENT_KIND_FIRST_TOKEN, w1),
			event("check-ev-1", pluginv1.EventKind_EVENT_KIND_COMPLETED, w1)}},
		{BatchId: 2, Instance: "check/no-such-instance", Events: []*pluginv1.Event{
			event("check-ev-2", pluginv1.EventKind_EVENT_KIND_ABORTED, 0)}},
		{BatchId: 3, Instance: inst, ThroughSeq: 4},
	}
	expectAcks := func(ids ...uint64) string {
		timeout := time.NewTimer(answerWait)
		defer timeout.Stop()
		for _, id := range ids {
			select {
			case got, ok := <-acks:
				if !ok {
					return fmt.Sprintf("the stream ended before the ack of batch %d", id)
				}
				if got != id {
					return fmt.Sprintf("the ack of batch %d where batch %d's was due", got, id)
				}
			case <-timeout.C:
				return fmt.Sprintf("no ack of batch %d within %v", id, answerWait)
			}
		}
		return ""
	}
	for _, b := range batches {
		if err := s.Send(b); err != nil {
			return []Result{fail(acksName, "batches sent", err.Error())}
		}
	}
	var out []Result
	if p := expectAcks(1, 2, 3); p != "" {
		return append(out, fail(acksName, "each batch acknowledged once, in order (1, 2, 3)", p))
	}
	out = append(out, pass(acksName, "3 batches acknowledged in order"))

	classify := func(through uint64, timeout time.Duration) error {
		r := request(w.role)
		r.ID = fmt.Sprintf("check-through-%d", through)
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		_, err := w.c.Classify(cctx, &pluginv1.ClassifyRequest{Instance: inst, Request: protoRequest(r), EventsThrough: through, NowUnixNano: time.Now().UnixNano()})
		return err
	}
	if err := classify(4, time.Minute); err != nil {
		return append(out, fail(throughName, "an answer with events_through 4, delivered", err.Error()))
	}
	if err := classify(5, time.Second); err == nil || !isDeadline(err) {
		got := "an answer"
		if err != nil {
			got = err.Error()
		}
		return append(out, fail(throughName, "DEADLINE_EXCEEDED with events_through 5, never sent", got))
	}
	done := make(chan error, 1)
	go func() { done <- classify(6, time.Minute) }()
	if err := s.Send(&pluginv1.EventBatch{BatchId: 4, Instance: inst, ThroughSeq: 6, Events: []*pluginv1.Event{
		event("check-ev-3", pluginv1.EventKind_EVENT_KIND_SENT, w1),
		event("check-ev-3", pluginv1.EventKind_EVENT_KIND_ABORTED, w1)}}); err != nil {
		return append(out, fail(throughName, "batch 4 sent", err.Error()))
	}
	if err := <-done; err != nil {
		return append(out, fail(throughName, "an answer with events_through 6 once batch 4 came", err.Error()))
	}
	if p := expectAcks(4); p != "" {
		return append(out, fail(acksName+" after Classify", "batch 4 acknowledged", p))
	}
	_ = s.CloseSend()
	return append(out, pass(throughName, "waits for the events it names"))
}

// isDeadline reports whether err is a gRPC DEADLINE_EXCEEDED, from the
// plugin or the client's own deadline.
func isDeadline(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded
}
