package shared

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
	"github.com/switchyard-router/switchyard/shared/pluginwire"
)

// server is the plugin side of switchyard.plugin.v1: it describes the
// types it was given, creates instances at Configure, runs Decide tasks
// over them, classifies requests (server_classify.go) and delivers
// lifecycle events to the instances that listen.
type server struct {
	pluginv1.UnimplementedPluginServer

	version string
	types   map[string]*TypeInfo
	order   []string // type names in the order given, for Describe
	log     hclog.Logger
	// expectedP99 is Describe's expected_decide_p99_nanos (0: none).
	expectedP99 time.Duration

	mu        sync.RWMutex
	instances map[string]*instance

	scratch sync.Pool // *taskScratch

	clock  atomic.Int64 // the latest router clock seen, unix nanoseconds
	events eventState
}

// instance is one configured component.
type instance struct {
	name      string
	kind      Kind
	comp      Component
	blockSize int
	// classifiers holds a classifier instance's partitions; nil for other
	// kinds.
	classifiers *classifierState
	// panics counts the instance's recovered panics; panicLog limits their
	// logging (see guard).
	panics   atomic.Int64
	panicLog rate.Sometimes
}

// panicLogInterval is how often guard logs an instance's panics after the
// first: a component that panics on every call of a busy router logs its
// stack a few times a minute, not once per request (the host logs every
// failed call's error, rate-limited too).
const panicLogInterval = 10 * time.Second

func newServer(version string, types []TypeInfo, log hclog.Logger) *server {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	s := &server{
		version:   version,
		types:     make(map[string]*TypeInfo, len(types)),
		log:       log,
		instances: make(map[string]*instance),
	}
	for i := range types {
		t := types[i]
		s.types[t.Name] = &t
		s.order = append(s.order, t.Name)
	}
	s.scratch.New = func() any { return new(taskScratch) }
	return s
}

// Describe returns the plugin version, API version 1 and the types.
func (s *server) Describe(context.Context, *pluginv1.DescribeRequest) (*pluginv1.DescribeResponse, error) {
	resp := &pluginv1.DescribeResponse{PluginVersion: s.version, ApiVersions: []uint32{APIVersion}, ExpectedDecideP99Nanos: uint64(max(s.expectedP99, 0))}
	for _, name := range s.order {
		ct, err := typeToProto(s.types[name])
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		resp.Types = append(resp.Types, ct)
	}
	return resp, nil
}

// Configure creates (or replaces) the named instance. Every problem with the
// request is a Diagnostic in the response, not a gRPC error.
func (s *server) Configure(_ context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	diag := func(param, summary, detail string) *pluginv1.ConfigureResponse {
		return &pluginv1.ConfigureResponse{Diagnostics: []*pluginv1.Diagnostic{{Param: param, Summary: summary, Detail: detail}}}
	}
	t, ok := s.types[req.GetType()]
	if !ok {
		return diag("", fmt.Sprintf("unknown component type %q", req.GetType()),
			fmt.Sprintf("this plugin provides %v", s.order)), nil
	}
	if req.GetInstance() == "" {
		return diag("", "empty instance name", ""), nil
	}
	var diags []*pluginv1.Diagnostic
	params := make(Params, len(req.GetParams()))
	names := make([]string, 0, len(req.GetParams()))
	for name := range req.GetParams() {
		names = append(names, name)
	}
	sort.Strings(names) // diagnostics in a stable order
	for _, name := range names {
		spec, ok := t.Param(name)
		if !ok {
			diags = append(diags, &pluginv1.Diagnostic{Param: name, Summary: fmt.Sprintf("unsupported parameter %q for type %q", name, t.Name)})
			continue
		}
		v, err := pluginwire.ValueFromProto(req.GetParams()[name], paramTypeToProto(spec.Type))
		if err != nil {
			diags = append(diags, &pluginv1.Diagnostic{Param: name, Summary: fmt.Sprintf("parameter %q: %v", name, err)})
			continue
		}
		params[name] = v
	}
	for _, spec := range t.Params {
		if _, given := req.GetParams()[spec.Name]; spec.Required && !given {
			diags = append(diags, &pluginv1.Diagnostic{Param: spec.Name, Summary: fmt.Sprintf("missing required parameter %q", spec.Name)})
		}
	}
	if len(diags) > 0 {
		return &pluginv1.ConfigureResponse{Diagnostics: diags}, nil
	}
	info := InstanceInfo{Name: req.GetInstance(), Role: Role(req.GetRole()), BlockSize: int(req.GetBlockSize())}
	comp, err := s.newInstance(t, info, t.WithDefaults(params))
	if err != nil {
		return &pluginv1.ConfigureResponse{Diagnostics: errorDiagnostics(err)}, nil
	}
	if comp == nil {
		return diag("", fmt.Sprintf("type %q returned a nil component", t.Name), ""), nil
	}
	if !implementsKind(comp, t.Kind) {
		return diag("", fmt.Sprintf("type %q: %T does not implement the %s interface", t.Name, comp, t.Kind), ""), nil
	}
	inst := &instance{name: info.Name, kind: t.Kind, comp: comp, blockSize: info.BlockSize,
		panicLog: rate.Sometimes{Interval: panicLogInterval}}
	_, events := comp.(EventListener)
	if t.Kind == KindClassifier {
		inst.classifiers = &classifierState{}
		events = events || t.Events
	}
	s.mu.Lock()
	s.instances[info.Name] = inst
	s.mu.Unlock()
	s.log.Debug("configured instance", "instance", info.Name, "type", t.Name, "role", info.Role, "events", events)
	return &pluginv1.ConfigureResponse{Inputs: inputsToProto(comp.Inputs()), Events: events}, nil
}

// newInstance calls the type's New, turning a panic into an error.
func (s *server) newInstance(t *TypeInfo, info InstanceInfo, p Params) (c Component, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("component constructor panicked", "type", t.Name, "instance", info.Name, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = fmt.Errorf("type %q panicked creating instance %q: %v", t.Name, info.Name, r)
		}
	}()
	return t.New(info, p)
}

// errorDiagnostics turns a constructor error into diagnostics: every
// *ParamError in an errors.Join tree names its parameter; the rest of the
// error is one diagnostic for the whole block.
func errorDiagnostics(err error) []*pluginv1.Diagnostic {
	var out []*pluginv1.Diagnostic
	var walk func(error)
	walk = func(err error) {
		var pe *ParamError
		switch {
		case err == nil:
		case errors.As(err, &pe) && pe == err:
			out = append(out, &pluginv1.Diagnostic{Param: pe.Param, Summary: pe.Error()})
		default:
			if j, ok := err.(interface{ Unwrap() []error }); ok {
				for _, e := range j.Unwrap() {
					walk(e)
				}
				return
			}
			if errors.As(err, &pe) {
				out = append(out, &pluginv1.Diagnostic{Param: pe.Param, Summary: err.Error()})
				return
			}
			out = append(out, &pluginv1.Diagnostic{Summary: err.Error()})
		}
	}
	walk(err)
	if len(out) == 0 {
		out = append(out, &pluginv1.Diagnostic{Summary: err.Error()})
	}
	return out
}

// implementsKind reports whether c provides the interface of kind k.
func implementsKind(c Component, k Kind) bool {
	switch k {
	case KindFilter:
		_, ok := c.(Filter)
		return ok
	case KindScorer:
		_, ok := c.(Scorer)
		return ok
	case KindPicker:
		_, ok := c.(Picker)
		return ok
	case KindClassifier:
		_, ok := c.(ClassifierFactory)
		return ok
	}
	return false
}

func (s *server) lookup(name string) *instance {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.instances[name]
}

// decideStream is the plugin side of one Decide stream. Results are sent by
// whichever goroutine finishes a task and finds no send in flight; it sends
// everything that finished meanwhile in one DecideResults (flat combining,
// no timer).
type decideStream struct {
	s      *server
	stream pluginv1.Plugin_DecideServer
	ctx    context.Context
	log    hclog.Logger

	// running counts the tasks received and not yet run; lastInline is
	// how long the last lone task ran, in nanoseconds.
	running    atomic.Int64
	lastInline atomic.Int64
	wg         sync.WaitGroup // every goroutine but the handler's

	mu      sync.Mutex
	out     []*pluginv1.DecideResult
	spare   []*pluginv1.DecideResult
	sending bool
	err     error                  // the first Send error; later results are dropped
	results pluginv1.DecideResults // owned by the sender

	// recvErr is the first receive error, set by the goroutine that got it.
	recvErr  error
	recvDone chan struct{}
	// sendFailed is closed (under mu) when err is set: Decide then ends
	// the stream, so the host fails its pending calls at once.
	sendFailed chan struct{}
}

// testHookServerSend, when set, runs before each Send of results; an error
// it returns stands for a failed Send.
var testHookServerSend atomic.Pointer[func() error]

// maxResultBytes bounds one DecideResults message; a variable so tests can
// lower it.
var maxResultBytes = MaxMessageBytes

// resultOverhead is the most a DecideResult adds to DecideResults besides
// its own size: its field tag and length prefix.
const resultOverhead = 1 + 5

// resultSize returns r's encoded size in DecideResults, cheaply: an upper
// bound while that is far below the limit, the exact size otherwise.
func resultSize(r *pluginv1.DecideResult) int {
	// task_id, picked (10 bytes when negative), tags, lengths: < 64.
	bound := 64 + len(r.Error) + len(r.FilteredBy) + 5*len(r.Kept) + 8*len(r.Costs)
	if bound < maxResultBytes/2 {
		return bound
	}
	return proto.Size(r) + resultOverhead
}

// fitResult replaces a result over the message-size limit with an error
// result for its task, so the host gets an answer instead of a stream that
// cannot send it.
func fitResult(r *pluginv1.DecideResult) *pluginv1.DecideResult {
	if n := resultSize(r); n > maxResultBytes {
		return &pluginv1.DecideResult{TaskId: r.TaskId, Picked: -1, Error: pluginwire.TooLargeMessage(n-resultOverhead, maxResultBytes)}
	}
	return r
}

// deliver queues r and, when no other goroutine is sending, sends the queue
// until it is empty. A result over the message-size limit is replaced by an
// error result (fitResult), and a queue whose results would not fit one
// message goes out in several. After a failed Send nothing more is sent and
// Decide ends the stream.
func (d *decideStream) deliver(r *pluginv1.DecideResult) {
	r = fitResult(r)
	d.mu.Lock()
	d.out = append(d.out, r)
	if d.sending {
		d.mu.Unlock()
		return
	}
	d.sending = true
	for len(d.out) > 0 && d.err == nil {
		batch := d.out
		d.out, d.spare = d.spare[:0], nil
		d.mu.Unlock()
		var err error
		for rest := batch; len(rest) > 0 && err == nil; {
			n, size := 0, 0
			for n < len(rest) {
				size += resultSize(rest[n])
				if n > 0 && size > maxResultBytes {
					break
				}
				n++
			}
			d.results.Results = rest[:n]
			if h := testHookServerSend.Load(); h != nil {
				err = (*h)()
			}
			if err == nil {
				err = d.stream.Send(&d.results)
			}
			rest = rest[n:]
		}
		d.results.Results = nil
		clear(batch)
		d.mu.Lock()
		d.spare = batch[:0]
		if err != nil && d.err == nil {
			d.err = err
			close(d.sendFailed)
			if c := status.Code(err); c == codes.Unavailable || c == codes.Canceled {
				d.log.Debug("decide stream send failed; ending the stream", "error", err)
			} else {
				d.log.Warn("decide stream send failed; ending the stream", "error", err)
			}
		}
	}
	d.out = d.out[:0]
	d.sending = false
	d.mu.Unlock()
}

// failed reports whether a Send failed.
func (d *decideStream) failed() bool {
	select {
	case <-d.sendFailed:
		return true
	default:
		return false
	}
}

// Decide runs every received task and answers each with one DecideResult,
// matched by task_id.
//
// A batch of one task that arrives while no other task of the stream is
// running runs at once on the goroutine that received it, and its result
// is sent from there: no goroutine handoff on a lone decision's path. The
// stream is not read while it runs, so this is done only while lone tasks
// are short (the last one ran at most inlineMax); otherwise the goroutine
// first starts a new one to go on receiving, and a slow component holds
// up at most the one task that showed it slow. Larger batches, and tasks
// that arrive while others run, run concurrently on up to GOMAXPROCS
// goroutines that take the batch's tasks in turn.
//
// When a Send fails (a result that cannot be encoded, a broken transport),
// Decide returns at once with that error, which ends the stream: the host
// fails the calls pending on it instead of waiting for answers that will
// never come. Goroutines still running tasks then finish without sending,
// and the one receiving, if any, stops when its Recv fails on the ended
// stream.
func (s *server) Decide(stream pluginv1.Plugin_DecideServer) error {
	d := &decideStream{s: s, stream: stream, ctx: stream.Context(), log: s.log,
		recvDone: make(chan struct{}), sendFailed: make(chan struct{})}
	// The handler only waits: a goroutine reads the stream (for the
	// stream's lifetime, not per decision), so that a failed Send can end
	// the stream even while a Recv blocks.
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.receive()
	}()
	select {
	case <-d.recvDone:
	case <-d.sendFailed:
	}
	if d.failed() {
		d.mu.Lock()
		err := d.err
		d.mu.Unlock()
		return status.Errorf(codes.Internal, "sending decide results: %v", err)
	}
	d.wg.Wait() // no Send after the handler returns
	err := d.recvErr
	if status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) {
		return nil
	}
	return ignoreEOF(err)
}

// receive reads batches until the stream ends, or until it hands the
// stream's reading to a new goroutine to run a lone task inline.
func (d *decideStream) receive() {
	for {
		batch, err := d.stream.Recv()
		if err != nil {
			d.recvErr = err
			close(d.recvDone)
			return
		}
		tasks := batch.GetTasks()
		if len(tasks) == 0 {
			continue
		}
		if d.running.Add(int64(len(tasks))) == 1 {
			// A lone task on an idle stream. While such tasks are short,
			// run it here and go on receiving after its result is sent.
			// After a long one, or while one runs long, hand the reading
			// to a new goroutine first, so a slow component neither holds
			// up the tasks behind it nor serializes them.
			if time.Duration(d.lastInline.Load()) <= inlineMax {
				d.deliver(d.runLone(tasks[0]))
				if d.failed() {
					return // Decide ends the stream
				}
				continue
			}
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				d.receive()
			}()
			d.deliver(d.runLone(tasks[0]))
			return
		}
		var next atomic.Int64
		for range min(len(tasks), runtime.GOMAXPROCS(0)) {
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				for i := next.Add(1) - 1; i < int64(len(tasks)); i = next.Add(1) - 1 {
					r := d.s.runTask(d.ctx, tasks[i])
					d.running.Add(-1)
					d.deliver(r)
				}
			}()
		}
	}
}

// inlineMax is the longest a lone task may have run for the next one to run
// on the receiving goroutine (see receive).
const inlineMax = 50 * time.Microsecond

// runLone runs a lone task, records how long it ran, and counts it done.
func (d *decideStream) runLone(t *pluginv1.DecideTask) *pluginv1.DecideResult {
	start := time.Now()
	r := d.s.runTask(d.ctx, t)
	d.lastInline.Store(int64(time.Since(start)))
	d.running.Add(-1)
	return r
}

func ignoreEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// taskScratch holds the buffers of one task run.
type taskScratch struct {
	req   Request
	c     Candidates
	orig  []uint32 // orig[i] is the sent row of current row i
	keep  []bool
	costs []float64 // one scorer's costs
	sum   []float64 // the task's own weighted sum per current row
	total []float64 // incoming costs plus sum: what a picker sees
	pairs []Label   // storage of c.Labels
}

// runTask runs one task's stages and returns its result; it never panics.
func (s *server) runTask(ctx context.Context, t *pluginv1.DecideTask) *pluginv1.DecideResult {
	res := &pluginv1.DecideResult{TaskId: t.GetTaskId(), Picked: -1}
	if dl := t.GetDeadlineUnixNano(); dl != 0 {
		deadline := time.Unix(0, dl)
		if !time.Now().Before(deadline) {
			res.Error = "deadline passed before the task ran"
			return res
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	sc := s.scratch.Get().(*taskScratch)
	defer s.scratch.Put(sc)
	if err := s.execute(ctx, t, sc, res); err != nil {
		// proto3 strings must be UTF-8, or the whole message fails to send.
		*res = pluginv1.DecideResult{TaskId: t.GetTaskId(), Picked: -1, Error: strings.ToValidUTF8(err.Error(), "\uFFFD")}
	}
	return res
}

// execute runs the stages like the host pipeline: filters compact the rows
// (none left: filtered_by), scorers add their weighted costs, a picker
// chooses a row and ends the task.
func (s *server) execute(ctx context.Context, t *pluginv1.DecideTask, sc *taskScratch, res *pluginv1.DecideResult) error {
	requestFromProto(t.GetRequest(), &sc.req)
	req := &sc.req
	c := &sc.c
	if err := candidatesFromProto(t.GetCandidates(), c, &sc.pairs); err != nil {
		return err
	}
	n := c.Len()
	if n == 0 {
		return ErrNoWorkers
	}
	sc.orig = pluginwire.GrowTo(sc.orig, n)
	for i := range sc.orig {
		sc.orig[i] = uint32(i)
	}
	// c.Costs is what the picker reads: incoming costs plus the task's.
	if c.Costs != nil {
		sc.total = append(sc.total[:0], c.Costs...)
		c.Costs = sc.total
	}
	filtered, scored := false, false
	for si, st := range t.GetStages() {
		inst := s.lookup(st.GetInstance())
		if inst == nil {
			return fmt.Errorf("unknown instance %q (not configured)", st.GetInstance())
		}
		switch inst.kind {
		case KindFilter:
			filtered = true
			n := c.Len()
			sc.keep = pluginwire.GrowTo(sc.keep, n)
			for i := range sc.keep {
				sc.keep[i] = true
			}
			if err := s.guard(inst, func() error { return inst.comp.(Filter).Filter(ctx, req, c, sc.keep) }); err != nil {
				return err
			}
			k := 0
			for i, keep := range sc.keep {
				if keep {
					sc.orig[k] = sc.orig[i]
					if scored {
						sc.sum[k] = sc.sum[i]
					}
					k++
				}
			}
			sc.orig = sc.orig[:k]
			if scored {
				sc.sum = sc.sum[:k]
			}
			if c.Compact(sc.keep) == 0 {
				res.FilteredBy = inst.name
				res.Kept = []uint32{}
				return nil
			}
		case KindScorer:
			n := c.Len()
			sc.costs = pluginwire.GrowTo(sc.costs, n)
			clear(sc.costs)
			if err := s.guard(inst, func() error { return inst.comp.(Scorer).Score(ctx, req, c, sc.costs) }); err != nil {
				return err
			}
			if !scored {
				sc.sum = pluginwire.GrowTo(sc.sum, n)
				clear(sc.sum)
				scored = true
			}
			if c.Costs == nil {
				sc.total = pluginwire.GrowTo(sc.total, n)
				clear(sc.total)
				c.Costs = sc.total
			}
			w := st.GetWeight()
			for i, v := range sc.costs[:n] {
				sum, total := sc.sum[i]+w*v, c.Costs[i]+w*v
				if math.IsNaN(sum) || math.IsInf(sum, 0) || math.IsNaN(total) || math.IsInf(total, 0) {
					return &NonFiniteCostError{Scorer: si, Name: inst.name, Row: i, Cost: v, Sum: total}
				}
				sc.sum[i], c.Costs[i] = sum, total
			}
		case KindPicker:
			if si != len(t.GetStages())-1 {
				return fmt.Errorf("picker %q is not the task's last stage", inst.name)
			}
			var row int
			if err := s.guard(inst, func() (err error) { row, err = inst.comp.(Picker).Pick(ctx, req, c); return err }); err != nil {
				return err
			}
			if row < 0 || row >= c.Len() {
				return fmt.Errorf("picker %q: %w", inst.name, &RowOutOfRangeError{Row: row, Count: c.Len()})
			}
			res.Picked = int32(sc.orig[row])
		default:
			return fmt.Errorf("instance %q is a %s, which Decide cannot run", inst.name, inst.kind)
		}
	}
	if filtered {
		res.Kept = append([]uint32(nil), sc.orig...)
	}
	if scored {
		res.Costs = append([]float64(nil), sc.sum...)
	}
	return nil
}

// guard runs one component call, turning a panic into an error naming the
// instance (pluginwire.PanicMessage: `KIND "NAME" panicked: VALUE`, which
// the router's client recognises), and wraps the component's error
// with its kind and name. A panic is logged at error level with its stack:
// an instance's first, then at most one every panicLogInterval, with the
// count so far.
func (s *server) guard(inst *instance, call func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			n := inst.panics.Add(1)
			log := false
			inst.panicLog.Do(func() { log = true })
			if log {
				s.log.Error("component panicked", "instance", inst.name, "kind", inst.kind.String(), "panics", n,
					"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			}
			err = errors.New(pluginwire.PanicMessage(inst.kind.String(), inst.name, r))
		}
	}()
	if err := call(); err != nil {
		return fmt.Errorf("%s %q: %w", inst.kind, inst.name, err)
	}
	return nil
}
