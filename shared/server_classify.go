package shared

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
)

// The plugin side of Classify and Events.
//
// A classifier instance (a ClassifierFactory configured by Configure) gets
// one Classifier per partition, (model, role), created by NewClassifier on
// the partition's first Classify. The PartitionContext it is given has no
// router behind it:
//
//   - Workers returns the worker list the host last sent for the
//     partition (the host sends it only when it changed, keyed by a
//     version number; nil before the first);
//   - Progress always returns false: out-of-process classifiers do not see
//     live requests' progress;
//   - Now returns the latest router clock the plugin has seen (each
//     ClassifyRequest carries it: simulated time in replay), or time.Now
//     before the first call; it never goes back.
//
// Events: each EventBatch names one instance; its events go, in order, to
// the instance when it implements EventListener and, for a classifier
// instance, to each of its partition Classifiers that does. One goroutine
// (the stream's handler) delivers, so OnEvents never runs concurrently with
// itself. A panic in OnEvents is logged and the batch still acknowledged.

// partKey names one classifier partition of an instance.
type partKey struct {
	model string
	role  Role
}

// partition is one classifier partition in the plugin.
type partition struct {
	once    sync.Once
	ready   atomic.Bool // c is set (after once, without error)
	c       Classifier
	err     error // NewClassifier's; the entry is then dropped, so the next request tries again
	version atomic.Uint64
	workers atomic.Pointer[[]WorkerInfo]
}

// classifierState is a classifier instance's partitions.
type classifierState struct {
	mu    sync.Mutex
	parts map[partKey]*partition
}

// eventState is the server's event delivery progress: delivered is the
// highest through_seq delivered; changed is closed (and replaced) when it
// advances.
type eventState struct {
	delivered atomic.Uint64
	mu        sync.Mutex
	changed   chan struct{}
}

// advance records seq as delivered.
func (e *eventState) advance(seq uint64) {
	if seq == 0 || seq <= e.delivered.Load() {
		return
	}
	e.mu.Lock()
	if seq > e.delivered.Load() {
		e.delivered.Store(seq)
		if e.changed != nil {
			close(e.changed)
			e.changed = nil
		}
	}
	e.mu.Unlock()
}

// wait blocks until seq is delivered or ctx ends.
func (e *eventState) wait(ctx context.Context, seq uint64) error {
	for e.delivered.Load() < seq {
		e.mu.Lock()
		if e.delivered.Load() >= seq {
			e.mu.Unlock()
			return nil
		}
		if e.changed == nil {
			e.changed = make(chan struct{})
		}
		ch := e.changed
		e.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("lifecycle events through #%d not delivered: %w", seq, ctx.Err())
		}
	}
	return nil
}

// observeClock records a router clock reading (unix nanoseconds).
func (s *server) observeClock(ns int64) {
	for {
		cur := s.clock.Load()
		if ns <= cur || s.clock.CompareAndSwap(cur, ns) {
			return
		}
	}
}

// now is the partitions' PartitionContext.Now.
func (s *server) now() time.Time {
	if ns := s.clock.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Now()
}

// Classify classifies one request with a classifier instance. A classifier
// error or panic is the call's error (gRPC Unknown), naming the instance
// and the request; the classifier keeps serving.
func (s *server) Classify(ctx context.Context, req *pluginv1.ClassifyRequest) (*pluginv1.ClassifyResponse, error) {
	inst := s.lookup(req.GetInstance())
	if inst == nil {
		return nil, status.Errorf(codes.NotFound, "unknown instance %q (not configured)", req.GetInstance())
	}
	if inst.kind != KindClassifier {
		return nil, status.Errorf(codes.InvalidArgument, "instance %q is a %s, not a classifier", inst.name, inst.kind)
	}
	if ns := req.GetNowUnixNano(); ns != 0 {
		s.observeClock(ns)
	}
	if err := s.events.wait(ctx, req.GetEventsThrough()); err != nil {
		return nil, status.Error(codes.DeadlineExceeded, err.Error())
	}
	var r Request
	requestFromProto(req.GetRequest(), &r)
	p, err := s.partition(inst, &r)
	if err != nil {
		return nil, status.Error(codes.Unknown, validUTF8(err.Error()))
	}
	if req.GetHasWorkers() {
		// Concurrent calls may carry versions out of order: keep the newest.
		for v := req.GetWorkersVersion(); ; {
			cur := p.version.Load()
			if v < cur {
				break
			}
			ws := workersFromProto(req.GetWorkers())
			if p.version.CompareAndSwap(cur, v) {
				p.workers.Store(&ws)
				break
			}
		}
	}
	cl, err := s.classify(ctx, inst, p.c, &r)
	if err != nil {
		return nil, status.Error(codes.Unknown, validUTF8(err.Error()))
	}
	return classificationToProto(cl), nil
}

// classify calls c.Classify for r, as the router's own guard does on its
// side: a returned error, a panic (recovered and logged with its stack) and
// a negative SchedulingCostTokens become an error naming the instance and
// the request, and fail only that request.
func (s *server) classify(ctx context.Context, inst *instance, c Classifier, r *Request) (cl Classification, err error) {
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("classifier panicked", "instance", inst.name, "request", r.ID, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			cl, err = Classification{}, fmt.Errorf("classifier %s: request %q: panic: %v", inst.name, r.ID, v)
		}
	}()
	cl, err = c.Classify(ctx, r)
	if err != nil {
		return Classification{}, fmt.Errorf("classifier %s: request %q: %w", inst.name, r.ID, err)
	}
	if cl.SchedulingCostTokens < 0 {
		return Classification{}, fmt.Errorf("classifier %s: request %q: scheduling cost %d tokens is negative", inst.name, r.ID, cl.SchedulingCostTokens)
	}
	return cl, nil
}

// partition returns the request's partition of inst, creating its
// Classifier on first use.
func (s *server) partition(inst *instance, r *Request) (*partition, error) {
	cs := inst.classifiers
	key := partKey{model: r.Model, role: r.Role}
	cs.mu.Lock()
	p := cs.parts[key]
	if p == nil {
		p = &partition{}
		if cs.parts == nil {
			cs.parts = make(map[partKey]*partition)
		}
		cs.parts[key] = p
	}
	cs.mu.Unlock()
	// The classifier is made outside the lock: NewClassifier is the
	// author's code and may take its time; only this partition's first
	// requests wait for it.
	p.once.Do(func() {
		bs := inst.blockSize
		if r.BlockSize > 0 {
			bs = r.BlockSize
		}
		pc := PartitionContext{
			Model:     r.Model,
			Role:      r.Role,
			BlockSize: bs,
			Workers: func() []WorkerInfo {
				if w := p.workers.Load(); w != nil {
					return *w
				}
				return nil
			},
			Progress: func(string) (int64, bool) { return 0, false },
			Now:      s.now,
		}
		p.c, p.err = s.newClassifier(inst, pc)
		if p.err == nil {
			p.ready.Store(true)
		}
	})
	if p.err != nil {
		cs.mu.Lock()
		if cs.parts[key] == p {
			delete(cs.parts, key)
		}
		cs.mu.Unlock()
		return nil, p.err
	}
	return p, nil
}

// newClassifier calls the factory's NewClassifier, turning a panic or a nil
// classifier into an error.
func (s *server) newClassifier(inst *instance, pc PartitionContext) (c Classifier, err error) {
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("NewClassifier panicked", "instance", inst.name, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			c, err = nil, fmt.Errorf("classifier %s: NewClassifier(model %q, role %q) panicked: %v", inst.name, pc.Model, pc.Role, v)
		}
	}()
	c, err = inst.comp.(ClassifierFactory).NewClassifier(pc)
	if err == nil && c == nil {
		err = fmt.Errorf("NewClassifier returned a nil classifier")
	}
	if err != nil {
		return nil, fmt.Errorf("classifier %s: creating the classifier of model %q, role %q: %w", inst.name, pc.Model, pc.Role, err)
	}
	return c, nil
}

// listeners returns inst's event listeners: the component, when it
// implements EventListener, and a classifier's partition Classifiers that
// do.
func (inst *instance) listeners(buf []EventListener) []EventListener {
	buf = buf[:0]
	if l, ok := inst.comp.(EventListener); ok {
		buf = append(buf, l)
	}
	if cs := inst.classifiers; cs != nil {
		cs.mu.Lock()
		for _, p := range cs.parts {
			if !p.ready.Load() {
				continue
			}
			if l, ok := p.c.(EventListener); ok && any(p.c) != any(inst.comp) {
				buf = append(buf, l)
			}
		}
		cs.mu.Unlock()
	}
	return buf
}

// Events delivers each batch to its instance's listeners, in order, and
// acknowledges it.
func (s *server) Events(stream pluginv1.Plugin_EventsServer) error {
	var (
		evs []Event
		ls  []EventListener
		ack pluginv1.EventAck
	)
	for {
		b, err := stream.Recv()
		if err != nil {
			if status.Code(err) == codes.Canceled {
				return nil
			}
			return ignoreEOF(err)
		}
		if inst := s.lookup(b.GetInstance()); inst != nil && len(b.GetEvents()) > 0 {
			evs = evs[:0]
			for _, e := range b.GetEvents() {
				evs = append(evs, eventFromProto(e))
			}
			ls = inst.listeners(ls)
			for _, l := range ls {
				s.onEvents(inst, l, evs)
			}
			clear(ls)
		}
		s.events.advance(b.GetThroughSeq())
		ack.BatchId = b.GetBatchId()
		if err := stream.Send(&ack); err != nil {
			return err
		}
	}
}

// onEvents calls one listener, recovering a panic.
func (s *server) onEvents(inst *instance, l EventListener, evs []Event) {
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("event listener panicked", "instance", inst.name, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		}
	}()
	l.OnEvents(evs)
}

// validUTF8 makes an error message safe for a proto3 string.
func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
