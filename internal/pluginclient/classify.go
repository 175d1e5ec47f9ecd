package pluginclient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/shared"
	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
	"github.com/switchyard-router/switchyard/shared/pluginwire"
)

// maxDiagnostic bounds a Configure diagnostic's summary and its detail, in
// bytes, as the router quotes them (untrusted.Text): a reason and the
// values allowed, not a payload.
const maxDiagnostic = 1 << 10

// ConfigureInstance is Configure, also returning whether the instance wants
// lifecycle events. The diagnostics' strings are bounded and escaped
// (untrusted.Text): a parameter name to untrusted.MaxLog bytes, a summary
// and a detail to 1 KiB each.
func (c *Client) ConfigureInstance(ctx context.Context, req ConfigureRequest) (ConfigureResult, error) {
	if c.isClosed() {
		return ConfigureResult{}, fmt.Errorf("plugin configure %q: %w", req.Info.Name, ErrPluginClosed)
	}
	params, err := paramsToProto(req.Params)
	if err != nil {
		return ConfigureResult{}, fmt.Errorf("plugin configure %q: %w", req.Info.Name, err)
	}
	resp, err := c.client.Configure(ctx, &pluginv1.ConfigureRequest{
		Instance:  req.Info.Name,
		Type:      req.Type,
		Role:      string(req.Info.Role),
		BlockSize: pluginwire.ClampU32(req.Info.BlockSize),
		Params:    params,
	}, callOpts...)
	if err != nil {
		return ConfigureResult{}, c.rpcError(fmt.Sprintf("configure %q", req.Info.Name), err)
	}
	if len(resp.GetDiagnostics()) > 0 {
		diags := make([]Diagnostic, 0, len(resp.GetDiagnostics()))
		for _, d := range resp.GetDiagnostics() {
			diags = append(diags, Diagnostic{
				Param:   untrusted.Text(d.GetParam(), untrusted.MaxLog),
				Summary: untrusted.Text(d.GetSummary(), maxDiagnostic),
				Detail:  untrusted.Text(d.GetDetail(), maxDiagnostic),
			})
		}
		return ConfigureResult{Diagnostics: diags}, nil
	}
	return ConfigureResult{Inputs: inputsFromProto(resp.GetInputs()), Events: resp.GetEvents()}, nil
}

// Classify classifies one request in the plugin. The plugin first delivers
// every lifecycle event this client queued before the call (SendEvents), so
// the classifier has heard the end of every earlier request. A classifier
// error or panic, and a plugin that is gone, are errors.
func (c *Client) Classify(ctx context.Context, call ClassifyCall) (shared.Classification, error) {
	if c.isClosed() {
		return shared.Classification{}, fmt.Errorf("plugin classify: %w", ErrPluginClosed)
	}
	now := call.Now
	if now.IsZero() {
		now = time.Now()
	}
	preq := &pluginv1.ClassifyRequest{
		Instance:       call.Instance,
		Request:        &pluginv1.Request{},
		WorkersVersion: call.WorkersVersion,
		EventsThrough:  c.ev.through(),
		NowUnixNano:    now.UnixNano(),
	}
	requestIntoProto(call.Request, preq.Request)
	if call.SendWorkers {
		preq.HasWorkers = true
		preq.Workers = workersToProto(call.Workers)
	}
	resp, err := c.client.Classify(ctx, preq, callOpts...)
	if err != nil {
		return shared.Classification{}, c.rpcError("classify", err)
	}
	return classificationFromProto(resp), nil
}

// MaxQueuedEvents bounds the lifecycle events a Client holds for a
// plugin that does not acknowledge them; beyond it events are dropped and
// counted (EventStats). It only matters for a plugin that stopped reading
// for a long time: the health checks and call timeouts kill such a plugin.
const MaxQueuedEvents = 1 << 20

// EventStats returns the client's event counters.
func (c *Client) EventStats() EventStats {
	return EventStats{Sent: c.ev.sent.Load(), Batches: c.ev.batches.Load(), MaxBatch: c.ev.maxBatch.Load(),
		Acked: c.ev.acked.Load(), Dropped: c.ev.dropped.Load()}
}

// queuedEvent is one event waiting for the sender, for one instance.
type queuedEvent struct {
	instance string
	ev       *pluginv1.Event
	seq      uint64
}

// eventSender is a Client's Events stream: callers queue events
// (never blocking), one goroutine at a time sends them. It runs while the
// queue is not empty: it takes the whole queue, sends it as one EventBatch
// per instance (in order within each), waits for the plugin to acknowledge
// them all, and goes on with what queued meanwhile. So at most one round is
// in flight, and every event that queues while it is goes out together in
// the next: batching under load, without a timer.
type eventSender struct {
	c *Client

	mu      sync.Mutex
	queue   []queuedEvent
	seq     uint64 // the last sequence number assigned
	running bool   // a sender goroutine owns the stream
	broken  error  // the stream failed: events are dropped from now on
	stream  pluginv1.Plugin_EventsClient
	cancel  context.CancelFunc
	nextID  uint64

	sent, batches, maxBatch, acked, dropped atomic.Int64
}

// through is the events_through of a Classify call: every event queued so
// far, or 0 once the stream failed (they will never be delivered).
func (e *eventSender) through() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.broken != nil {
		return 0
	}
	return e.seq
}

// SendEvents queues events for the plugin's instance (which declared
// interest at Configure) and returns at once; the events are copied. They
// are delivered in the order queued, batched, lossless while the plugin
// process and its Events stream live. Events queued after the stream failed
// or beyond MaxQueuedEvents are dropped and counted (EventStats.Dropped).
func (c *Client) SendEvents(instance string, events []shared.Event) {
	if len(events) == 0 {
		return
	}
	e := &c.ev
	closed := c.isClosed()
	e.mu.Lock()
	if e.broken != nil || closed || len(e.queue)+len(events) > MaxQueuedEvents {
		e.mu.Unlock()
		e.dropped.Add(int64(len(events)))
		return
	}
	for i := range events {
		pe := &pluginv1.Event{}
		eventToProto(&events[i], pe)
		e.seq++
		e.queue = append(e.queue, queuedEvent{instance: instance, ev: pe, seq: e.seq})
	}
	if e.running {
		e.mu.Unlock()
		return
	}
	e.running = true
	e.mu.Unlock()
	go e.run()
}

// run sends rounds until the queue is empty or the stream fails.
func (e *eventSender) run() {
	for {
		e.mu.Lock()
		q := e.queue
		e.queue = nil
		if len(q) == 0 || e.broken != nil {
			e.running = false
			e.mu.Unlock()
			return
		}
		st := e.stream
		e.mu.Unlock()
		var err error
		if st == nil {
			st, err = e.open()
		}
		if err == nil {
			err = e.round(st, q)
		}
		if err != nil {
			e.mu.Lock()
			e.broken = err
			n := len(e.queue)
			e.queue = nil
			e.running = false
			cancel := e.cancel
			e.mu.Unlock()
			// The failed round's events were not all acknowledged: count
			// them with the queue's.
			e.dropped.Add(int64(n + len(q)))
			if cancel != nil {
				cancel()
			}
			if cb := e.c.onEventsBroken; cb != nil && e.c.done.Err() == nil && !e.c.isClosed() {
				cb(err)
			}
			return
		}
	}
}

// open opens the Events stream.
func (e *eventSender) open() (pluginv1.Plugin_EventsClient, error) {
	ctx, cancel := context.WithCancel(e.c.done)
	st, err := e.c.client.Events(ctx, callOpts...)
	if err != nil {
		cancel()
		return nil, e.c.rpcError("events: opening stream", err)
	}
	e.mu.Lock()
	e.stream, e.cancel = st, cancel
	e.mu.Unlock()
	return st, nil
}

// round sends q as one batch per instance, several when an instance's
// events would not fit one message (maxMessageBytes), and waits for every
// ack. Only the round's last batch carries through_seq, so the plugin
// counts the round delivered only once all of it is.
func (e *eventSender) round(st pluginv1.Plugin_EventsClient, q []queuedEvent) error {
	var order []string
	groups := make(map[string][]*pluginv1.Event, 1)
	for _, qe := range q {
		if _, ok := groups[qe.instance]; !ok {
			order = append(order, qe.instance)
		}
		groups[qe.instance] = append(groups[qe.instance], qe.ev)
	}
	var batches []*pluginv1.EventBatch
	for _, inst := range order {
		for rest := groups[inst]; len(rest) > 0; {
			n := fitEvents(inst, rest)
			e.nextID++
			batches = append(batches, &pluginv1.EventBatch{BatchId: e.nextID, Instance: inst, Events: rest[:n]})
			rest = rest[n:]
		}
	}
	batches[len(batches)-1].ThroughSeq = q[len(q)-1].seq
	for _, b := range batches {
		if err := st.Send(b); err != nil {
			return fmt.Errorf("plugin events: %w: %w", ErrPluginClosed, boundStatus(err))
		}
		n := int64(len(b.Events))
		e.sent.Add(n)
		e.batches.Add(1)
		for {
			m := e.maxBatch.Load()
			if n <= m || e.maxBatch.CompareAndSwap(m, n) {
				break
			}
		}
	}
	for _, b := range batches {
		ack, err := st.Recv()
		if err != nil {
			return fmt.Errorf("plugin events: %w: %w", ErrPluginClosed, boundStatus(err))
		}
		if ack.GetBatchId() != b.BatchId {
			return fmt.Errorf("plugin events: acknowledged batch %d, expected %d", ack.GetBatchId(), b.BatchId)
		}
		e.acked.Add(1)
	}
	return nil
}

// eventBatchOverhead bounds what an EventBatch adds to its events besides
// the instance name: batch_id, through_seq, their tags and lengths.
const eventBatchOverhead = 32

// fitEvents returns how many of the leading events fit one EventBatch of
// instance inst of at most maxMessageBytes, at least 1 (an event is
// bounded far below the limit: its request id is a header of at most 1
// MiB in serve).
func fitEvents(inst string, evs []*pluginv1.Event) int {
	size := eventBatchOverhead + len(inst)
	for i, ev := range evs {
		size += eventSize(ev)
		if i > 0 && size > maxMessageBytes {
			return i
		}
	}
	return len(evs)
}

// eventSize bounds ev's encoded size in an EventBatch without encoding it:
// its two strings, five numeric fields of at most 11 bytes with their
// tags, the strings' tags and length prefixes (6 bytes each), and its own
// tag and length prefix (6).
func eventSize(ev *pluginv1.Event) int {
	return len(ev.RequestId) + len(ev.Reason) + 5*11 + 2*6 + 6
}

// close ends the Events stream (Client.Close).
func (e *eventSender) close() {
	e.mu.Lock()
	if e.broken == nil {
		e.broken = errors.New("client closed")
	}
	cancel := e.cancel
	e.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}
