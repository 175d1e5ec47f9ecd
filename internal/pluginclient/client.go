package pluginclient

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/shared"
	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
	"github.com/switchyard-router/switchyard/shared/pluginwire"
)

// ErrPluginClosed is returned (wrapped) by Client calls when the
// plugin's Decide stream or process is gone: the plugin exited, the
// connection broke, or the client was closed. Callers branch on it with
// errors.Is to tell a dead plugin from a component's own error.
var ErrPluginClosed = errors.New("plugin closed")

// ErrProtocol is wrapped (with ErrPluginClosed) by the calls in flight on a
// Decide stream the router ended because the plugin broke the protocol:
// it answered a task id the router never sent. The next call opens a new
// stream.
var ErrProtocol = errors.New("protocol violation")

// ErrResultTooLarge is wrapped by a Decide call whose result the plugin
// could not send: it was over the message-size limit
// (shared.MaxMessageBytes), and the SDK answered the task with an error
// instead (pluginwire.TooLargeMessage).
var ErrResultTooLarge = errors.New("result over the message-size limit")

// ErrComponentPanicked is wrapped by a Decide call whose component panicked
// in the plugin: the SDK recovered the panic and answered the task with an
// error naming the component (`scorer "NAME" panicked: VALUE`). The error's
// text is the plugin's, unchanged.
var ErrComponentPanicked = errors.New("component panicked")

// panicError is a task error that is the SDK's answer to a panic.
type panicError struct{ msg string }

func (e *panicError) Error() string        { return e.msg }
func (e *panicError) Is(target error) bool { return target == ErrComponentPanicked }

// panicMessage reports whether a task's error is the SDK's answer to a
// component's panic (pluginwire.PanicMessage) in one of a task's stages.
func panicMessage(msg string) bool {
	return pluginwire.IsPanicMessage(msg, shared.KindFilter.String(), shared.KindScorer.String(), shared.KindPicker.String())
}

// Client is the host side of one plugin process: go-plugin dispenses it
// (see PluginSets). Its methods are safe for concurrent use.
//
// Decide calls share one long-lived Decide stream, opened on first use. One
// goroutine per stream, the sender, does every Send: a caller queues its
// task, wakes the sender if it is idle, and waits only for its result, its
// context or the stream's end. A caller never blocks in Send, where HTTP/2
// flow control would hold it, past its deadline, while the plugin is frozen
// and stops reading: the caller's deadline (call_timeout) is a hard bound.
// Every task that arrives while a Send is in flight is queued, and the
// sender takes the whole queue into the next DecideBatch (batching under
// load, no timer; Options.DecideBatch sees each batch's size), or into
// several when together they would exceed the message-size limit. A receiver
// goroutine completes each caller's (pooled) result channel directly.
type Client struct {
	client pluginv1.PluginClient
	done   context.Context // cancelled when the plugin process exits
	// onEventsBroken is Options.EventsBroken.
	onEventsBroken func(error)

	mu     sync.Mutex
	stream *remoteStream
	closed bool

	ev eventSender // the Events stream (classify.go)

	nextID  atomic.Uint64
	tasks   sync.Pool // *pluginv1.DecideTask, reused after Send
	waiters sync.Pool // *waiter, reused once its channel is empty again

	// lastAnswer is when a Decide stream last received a message from the
	// plugin, as nanoseconds since clockBase (monotonic); 0: never.
	lastAnswer atomic.Int64

	// onBatch is Options.DecideBatch; nil: none.
	onBatch func(tasks int)

	// Counters for tests and diagnostics.
	batches   atomic.Int64 // DecideBatch messages sent
	sentTasks atomic.Int64 // tasks sent
	maxBatch  atomic.Int64 // most tasks in one DecideBatch
}

// New returns a client over conn. done should be cancelled when the plugin
// process exits (go-plugin's GRPCClient passes such a context); nil means
// never.
func New(done context.Context, conn grpc.ClientConnInterface, opts Options) *Client {
	if done == nil {
		done = context.Background()
	}
	c := &Client{client: pluginv1.NewPluginClient(conn), done: done, onBatch: opts.DecideBatch, onEventsBroken: opts.EventsBroken}
	c.ev.c = c
	return c
}

// clockBase anchors the monotonic clock readings stored as int64s
// (Client.lastAnswer).
var clockBase = time.Now()

// LastAnswer is when the plugin last sent anything on a Decide stream: a
// batch of results, including results for calls whose callers had already
// given up (a late answer is still an answer). It is the zero time when no
// Decide stream has received anything yet. The time carries a monotonic
// clock reading, so comparing it with time.Now or time.Since is immune to
// wall-clock steps. A host uses it to tell a plugin that answers late (a
// starved machine) from one that answers nothing at all (a wedged
// handler).
func (c *Client) LastAnswer() time.Time {
	ns := c.lastAnswer.Load()
	if ns == 0 {
		return time.Time{}
	}
	return clockBase.Add(time.Duration(ns))
}

// Pending returns how many Decide calls wait for their answer on the
// current Decide stream: queued for the sender, or sent and not yet
// answered. Calls that gave up (their context ended) are not counted; 0
// when no stream is open or the last one broke.
func (c *Client) Pending() int {
	c.mu.Lock()
	s := c.stream
	c.mu.Unlock()
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

// maxMessageBytes bounds one DecideBatch message (the plugin's receive
// limit, shared.MaxMessageBytes); a variable so tests can lower it.
var maxMessageBytes = shared.MaxMessageBytes

// callOpts are the explicit message-size limits of every call.
var callOpts = []grpc.CallOption{grpc.MaxCallRecvMsgSize(shared.MaxMessageBytes), grpc.MaxCallSendMsgSize(shared.MaxMessageBytes)}

// rpcError wraps a call's error with what was called, mapping a gone
// plugin (Unavailable, or Canceled once the plugin's context is done) to
// ErrPluginClosed. A status error's message, which the plugin may have
// written, is bounded (boundStatus).
func (c *Client) rpcError(what string, err error) error {
	err = boundStatus(err)
	code := status.Code(err)
	if code == codes.Unavailable || (code == codes.Canceled && c.done.Err() != nil) {
		return fmt.Errorf("plugin %s: %w: %w", what, ErrPluginClosed, err)
	}
	return fmt.Errorf("plugin %s: %w", what, err)
}

// boundStatus returns err, a gRPC status error as a call returns it, with
// its message bounded and escaped (untrusted.Text, untrusted.MaxLog): a
// plugin's handler chooses it (a classifier's error, a Decide stream's end),
// and it reaches logs and clients' answers. The code is kept; any other
// error is returned as it is.
func boundStatus(err error) error {
	se, ok := err.(interface{ GRPCStatus() *status.Status })
	if !ok {
		return err
	}
	st := se.GRPCStatus()
	msg := st.Message()
	if b := untrusted.Text(msg, untrusted.MaxLog); b != msg {
		return status.Error(st.Code(), b)
	}
	return err
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Describe returns the plugin's version, API versions and component types
// (with New nil).
func (c *Client) Describe(ctx context.Context) (*Description, error) {
	if c.isClosed() {
		return nil, fmt.Errorf("plugin describe: %w", ErrPluginClosed)
	}
	resp, err := c.client.Describe(ctx, &pluginv1.DescribeRequest{ApiVersions: []uint32{shared.APIVersion}}, callOpts...)
	if err != nil {
		return nil, c.rpcError("describe", err)
	}
	d := &Description{PluginVersion: untrusted.Text(resp.GetPluginVersion(), untrusted.MaxLog), APIVersions: resp.GetApiVersions(),
		ExpectedDecideP99: time.Duration(min(resp.GetExpectedDecideP99Nanos(), math.MaxInt64))}
	for _, ct := range resp.GetTypes() {
		t, err := typeFromProto(ct)
		if err != nil {
			return nil, fmt.Errorf("plugin describe: %w", err)
		}
		d.Types = append(d.Types, t)
	}
	return d, nil
}

// Configure asks the plugin for a new instance (replacing one of the same
// name) and returns the inputs it declares, or the plugin's diagnostics.
// The error is for the call itself (transport, a parameter value that
// cannot travel); a refused configuration is diagnostics with a nil error.
// ConfigureInstance also returns whether the instance wants lifecycle
// events.
func (c *Client) Configure(ctx context.Context, req ConfigureRequest) (shared.Inputs, []Diagnostic, error) {
	r, err := c.ConfigureInstance(ctx, req)
	return r.Inputs, r.Diagnostics, err
}

// Decide runs t in the plugin and waits for its result or ctx. The task's
// deadline is ctx's; a result arriving after ctx is done is dropped. A
// component's failure is an error; a broken stream fails with an error
// wrapping ErrPluginClosed, and a later call opens a new stream.
func (c *Client) Decide(ctx context.Context, t *Task) (TaskResult, error) {
	if t == nil || t.Candidates == nil {
		return TaskResult{Picked: -1}, errors.New("plugin decide: nil task or candidates")
	}
	if err := ctx.Err(); err != nil {
		return TaskResult{Picked: -1}, fmt.Errorf("plugin decide: %w", err)
	}
	s, err := c.openStream()
	if err != nil {
		return TaskResult{Picked: -1}, err
	}
	pt := c.newTask(ctx, t)
	id := pt.TaskId
	w := c.getWaiter()
	if err := s.submit(id, pt, w); err != nil {
		c.waiters.Put(w)
		return TaskResult{Picked: -1}, err
	}
	select {
	case r := <-w.ch:
		c.waiters.Put(w)
		if raw := r.GetError(); raw != "" {
			// The plugin's words reach logs and clients: bounded and
			// escaped, once recognised.
			msg := untrusted.Text(raw, untrusted.MaxLog)
			if err := ctx.Err(); err != nil {
				return TaskResult{Picked: -1}, fmt.Errorf("plugin decide: %w (plugin: %s)", err, msg)
			}
			if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
				// The task ran out of the caller's time in the plugin, a
				// moment before ctx's own timer fired.
				return TaskResult{Picked: -1}, fmt.Errorf("plugin decide: %w (plugin: %s)", context.DeadlineExceeded, msg)
			}
			if pluginwire.IsTooLargeMessage(raw) {
				return TaskResult{Picked: -1}, fmt.Errorf("plugin decide: %w: %s", ErrResultTooLarge, msg)
			}
			if panicMessage(raw) {
				return TaskResult{Picked: -1}, fmt.Errorf("plugin decide: %w", &panicError{msg})
			}
			return TaskResult{Picked: -1}, fmt.Errorf("plugin decide: %s", msg)
		}
		return resultFromProto(r, t.Stages), nil
	case <-ctx.Done():
		s.release(id, w)
		return TaskResult{Picked: -1}, fmt.Errorf("plugin decide: %w", ctx.Err())
	case <-s.broken:
		s.release(id, w)
		return TaskResult{Picked: -1}, s.err
	}
}

// getWaiter returns a pooled waiter with an empty channel.
func (c *Client) getWaiter() *waiter {
	if w, ok := c.waiters.Get().(*waiter); ok {
		return w
	}
	return &waiter{ch: make(chan *pluginv1.DecideResult, 1)}
}

// newTask converts t into a (pooled) DecideTask. Everything the caller owns
// is copied, so the caller may return before the task is sent.
func (c *Client) newTask(ctx context.Context, t *Task) *pluginv1.DecideTask {
	pt, _ := c.tasks.Get().(*pluginv1.DecideTask)
	if pt == nil {
		pt = &pluginv1.DecideTask{Request: &pluginv1.Request{}, Candidates: &pluginv1.Columns{}}
	}
	pt.TaskId = c.nextID.Add(1)
	pt.DeadlineUnixNano = 0
	if dl, ok := ctx.Deadline(); ok {
		pt.DeadlineUnixNano = dl.UnixNano()
	}
	requestIntoProto(t.Request, pt.Request)
	CandidatesToProto(t.Candidates, pt.Candidates)
	stages := pt.Stages[:cap(pt.Stages)]
	for i := range stages {
		if stages[i] == nil {
			stages[i] = &pluginv1.Stage{}
		}
	}
	for len(stages) < len(t.Stages) {
		stages = append(stages, &pluginv1.Stage{})
	}
	stages = stages[:len(t.Stages)]
	for i, st := range t.Stages {
		stages[i].Instance, stages[i].Weight = st.Instance, st.Weight
	}
	pt.Stages = stages
	return pt
}

// openStream returns the current Decide stream, opening one if none is
// usable.
func (c *Client) openStream() (*remoteStream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("plugin decide: %w", ErrPluginClosed)
	}
	if s := c.stream; s != nil {
		select {
		case <-s.broken:
		default:
			return s, nil
		}
		c.stream = nil
	}
	if err := c.done.Err(); err != nil {
		return nil, fmt.Errorf("plugin decide: %w: plugin process exited", ErrPluginClosed)
	}
	ctx, cancel := context.WithCancel(c.done)
	st, err := c.client.Decide(ctx, callOpts...)
	if err != nil {
		cancel()
		return nil, c.rpcError("decide: opening stream", err)
	}
	s := &remoteStream{
		c:       c,
		stream:  st,
		cancel:  cancel,
		wake:    make(chan struct{}, 1),
		broken:  make(chan struct{}),
		pending: make(map[uint64]*waiter),
	}
	s.wg.Add(2)
	go s.sendLoop(ctx)
	go s.recvLoop()
	c.stream = s
	return s, nil
}

// Close ends the Decide and Events streams and stops the Decide stream's
// goroutines (events still queued are dropped); calls in flight
// and later calls fail with ErrPluginClosed. It does not end the plugin
// process (go-plugin's Client.Kill does).
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	s := c.stream
	c.stream = nil
	c.mu.Unlock()
	c.ev.close()
	if s != nil {
		s.fail(errors.New("client closed"))
		s.wg.Wait()
	}
	return nil
}

// waiter is one Decide call waiting for its result. Waiters are pooled:
// one goes back to the pool only once nothing can send on ch any more and
// ch is empty.
type waiter struct {
	ch chan *pluginv1.DecideResult // buffered: the receiver never blocks
}

// remoteStream is one Decide stream with its receiver and sender.
type remoteStream struct {
	c      *Client
	stream pluginv1.Plugin_DecideClient
	cancel context.CancelFunc
	wg     sync.WaitGroup

	wake   chan struct{} // buffered: the sender has tasks to send
	broken chan struct{} // closed once, when the stream fails; err is set before
	err    error

	mu      sync.Mutex
	queue   []*pluginv1.DecideTask // tasks waiting for the next send
	spare   []*pluginv1.DecideTask // the last batch's buffer, for the next queue
	sending bool                   // the sender was woken and has not yet found the queue empty
	pending map[uint64]*waiter
	failed  bool

	batch pluginv1.DecideBatch // owned by the sender
}

// submit registers w for id and queues the task, waking the sender when it
// is idle. It never blocks on the stream.
func (s *remoteStream) submit(id uint64, pt *pluginv1.DecideTask, w *waiter) error {
	s.mu.Lock()
	if s.failed {
		s.mu.Unlock()
		s.c.tasks.Put(pt)
		return s.err
	}
	s.pending[id] = w
	s.queue = append(s.queue, pt)
	if s.sending {
		s.mu.Unlock()
		return nil
	}
	s.sending = true
	s.mu.Unlock()
	// At most one wake-up is outstanding: the sender takes it before it
	// clears sending.
	s.wake <- struct{}{}
	return nil
}

// takeQueue returns the queued tasks and starts an empty queue in the spare
// buffer. s.mu is held.
func (s *remoteStream) takeQueue() []*pluginv1.DecideTask {
	tasks := s.queue
	s.queue, s.spare = s.spare[:0], nil
	return tasks
}

// send sends tasks, then every batch that queued meanwhile, until the queue
// is empty or the stream failed. Tasks that would not fit one message
// together (maxMessageBytes) go out in several.
func (s *remoteStream) send(tasks []*pluginv1.DecideTask) {
	for {
		var err error
		for rest := tasks; len(rest) > 0 && err == nil; {
			n := fitBatch(rest)
			err = s.sendBatch(rest[:n])
			rest = rest[n:]
		}
		for i, pt := range tasks {
			s.c.tasks.Put(pt)
			tasks[i] = nil
		}
		// Let the goroutines that are ready to run (callers about to
		// submit, the receiver completing results) run before the queue
		// is taken again: under load the next message then carries
		// everything they queued, rather than one task each (measured in
		// BENCHMARKS.md: 1.2 tasks per message without it, 9-10 with it,
		// at equal throughput and serial latency). With nothing else
		// ready, Gosched returns at once; no timer is involved.
		runtime.Gosched()
		s.mu.Lock()
		s.spare = tasks[:0]
		if err != nil {
			s.sending = false
			s.mu.Unlock()
			s.fail(err)
			return
		}
		if len(s.queue) == 0 || s.failed {
			s.sending = false
			s.mu.Unlock()
			return
		}
		tasks = s.takeQueue()
		s.mu.Unlock()
	}
}

// sendBatch sends tasks as one DecideBatch and counts it.
func (s *remoteStream) sendBatch(tasks []*pluginv1.DecideTask) error {
	if f := s.c.onBatch; f != nil {
		f(len(tasks))
	}
	s.batch.Tasks = tasks
	err := s.stream.Send(&s.batch)
	s.batch.Tasks = nil
	s.c.batches.Add(1)
	s.c.sentTasks.Add(int64(len(tasks)))
	for n := int64(len(tasks)); ; {
		m := s.c.maxBatch.Load()
		if n <= m || s.c.maxBatch.CompareAndSwap(m, n) {
			break
		}
	}
	return err
}

// taskOverhead is the most a DecideTask adds to DecideBatch besides its
// own size: its field tag and length prefix.
const taskOverhead = 1 + 5

// fitBatch returns how many of the leading tasks fit one DecideBatch of
// at most maxMessageBytes, at least 1. A lone task is not measured: the
// request behind it is bounded far below the limit (a body of at most 32
// MiB in serve), and one that did not fit could not be split anyway.
func fitBatch(tasks []*pluginv1.DecideTask) int {
	if len(tasks) == 1 {
		return 1
	}
	size := 0
	for i, pt := range tasks {
		size += proto.Size(pt) + taskOverhead
		if i > 0 && size > maxMessageBytes {
			return i
		}
	}
	return len(tasks)
}

// release drops the waiter of a call that gave up (its result, if it
// comes, is discarded) and returns w to the pool. After the delete under
// s.mu the receiver can no longer send on w.ch, so one drain empties it.
func (s *remoteStream) release(id uint64, w *waiter) {
	s.mu.Lock()
	delete(s.pending, id)
	s.mu.Unlock()
	select {
	case <-w.ch:
	default:
	}
	s.c.waiters.Put(w)
}

// fail breaks the stream once: every pending call fails with an error
// wrapping ErrPluginClosed and cause, and both goroutines stop.
func (s *remoteStream) fail(cause error) {
	s.mu.Lock()
	if s.failed {
		s.mu.Unlock()
		return
	}
	s.failed = true
	cause = boundStatus(cause)
	if errors.Is(cause, context.Canceled) || errors.Is(cause, context.DeadlineExceeded) {
		// The stream's own context (the plugin's process), never the
		// caller's: wrapping it would make a plugin that died look like
		// a caller that gave up, and callers do not fall back for that.
		s.err = fmt.Errorf("plugin decide: %w: stream ended (%v)", ErrPluginClosed, cause)
	} else {
		s.err = fmt.Errorf("plugin decide: %w: %w", ErrPluginClosed, cause)
	}
	clear(s.pending)
	queued := s.queue
	s.queue = nil
	close(s.broken)
	s.mu.Unlock()
	for _, pt := range queued {
		s.c.tasks.Put(pt)
	}
	s.cancel()
}

// sendLoop is the sender: woken by submit, it sends until the queue is
// empty. A Send blocked by flow control holds up only this goroutine; the
// callers' contexts bound their waits, and failing the stream (fail
// cancels it) ends the Send.
func (s *remoteStream) sendLoop(ctx context.Context) {
	defer s.wg.Done()
	for {
		select {
		case <-s.wake:
		case <-ctx.Done():
			s.fail(context.Cause(ctx))
			return
		}
		s.mu.Lock()
		if len(s.queue) == 0 || s.failed { // only after fail
			s.sending = false
			s.mu.Unlock()
			continue
		}
		tasks := s.takeQueue()
		s.mu.Unlock()
		s.send(tasks)
	}
}

// recvLoop completes each result's waiting caller, and records when the
// plugin last answered (LastAnswer).
func (s *remoteStream) recvLoop() {
	defer s.wg.Done()
	for {
		msg, err := s.stream.Recv()
		if err != nil {
			s.fail(err)
			return
		}
		// max 1: a reading within clockBase's own nanosecond is not "never".
		s.c.lastAnswer.Store(max(int64(time.Since(clockBase)), 1))
		s.mu.Lock()
		for _, r := range msg.GetResults() {
			id := r.GetTaskId()
			if w, ok := s.pending[id]; ok {
				delete(s.pending, id)
				w.ch <- r
				continue
			}
			// Not waited for: a late or repeated answer (ignored), or an
			// id the router never sent. The calls in flight cannot be
			// matched to their answers then, so they fail now rather
			// than at their deadlines.
			if sent := s.c.nextID.Load(); id == 0 || id > sent {
				s.mu.Unlock()
				s.fail(fmt.Errorf("%w: a result for task %d, which the router never sent (task ids sent so far: 1 to %d); DecideResult.task_id must echo DecideTask.task_id", ErrProtocol, id, sent))
				return
			}
		}
		s.mu.Unlock()
	}
}
