// Package admission is the flow-control layer above the selection core
// (package router): it classifies each request once, places it through
// the core, queues it when every candidate is at capacity, tracks it while
// it lives, and delivers its lifecycle events. Replay and serve both drive
// it; they differ only in where time comes from.
//
// A request's path:
//
//	h, err := c.Admit(ctx, req)    // classify once; place, or queue when every candidate is full
//	defer h.End(outcome)           // idempotent: releases the booking or leaves the queue
//	d, err := h.Wait(ctx)          // until dispatched or refused
//	... proxy or simulate on d.Worker ...
//	h.FirstToken(); h.Progress(n)  // as the answer streams
//	h.Retry(ctx, id, failed...)    // a worker failed before its first byte: place again, same classification
//
// No lock of this package is held across a classifier, a policy or a
// plugin call. Classification and selection run in the caller's
// goroutine, concurrently with every other request's; capacity is an
// atomic try-book on the chosen worker (router.Placement.Capacity). Locks
// are brief and narrow: a (model, role) partition's queue (only when
// something waits or is about to), one shard of the live-request table,
// and the event queue (only when some component listens). The llm-d
// router's flow-control layer above its scheduler is the model.
package admission

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/queue"
	"github.com/switchyard-router/switchyard/shared"
)

// Errors callers branch on.
var (
	// ErrDuplicateRequest: Admit or Retry with a request id that is still
	// live.
	ErrDuplicateRequest = errors.New("a request with this id is already live")
	// ErrQueueFull: every candidate is at capacity and the queue holds
	// max_waiting requests (429 in serve).
	ErrQueueFull = errors.New("every worker is at capacity and the queue is full")
	// ErrDue: the request's due time passed while it was queued.
	ErrDue = errors.New("the request's due time passed while it was queued")
	// ErrUnknownClass: a classifier named a policy class the queue does not
	// have. The request fails whether or not it would have waited.
	ErrUnknownClass = errors.New("unknown policy class")
	// ErrEnded: Retry of a request that has ended.
	ErrEnded = errors.New("the request has ended")
	// ErrClosed: Admit after Close.
	ErrClosed = errors.New("admission closed")
)

// Options configure a Controller.
type Options struct {
	// Queue is the queue block (config.DefaultQueue when it has no class):
	// max_active_requests per worker, classes, aging, max_waiting.
	Queue config.Queue
	// Classifier classifies every request when the core's current bundle
	// has no request_classifier of its own; nil: none.
	Classifier shared.ClassifierFactory
	// Listeners receive every request's lifecycle events besides the
	// classifiers and the bundle's components that listen.
	Listeners []shared.EventListener
	// Now is the clock for arrival, aging, due times and event times:
	// simulated time in replay; nil means time.Now.
	Now func() time.Time
	// InlineEvents delivers events in the goroutine that caused them, as
	// they happen: for replay, which is single-threaded, so delivery is
	// deterministic. false (serve): one delivery goroutine per Controller
	// takes the events in order, in batches, and calls each listener from
	// it (shared.EventListener's contract); Close stops it.
	InlineEvents bool
	// OnQueued, when set, is called after a request joined a queue
	// (outside every lock): serve wakes its dispatcher with it.
	OnQueued func()
	// Observer, when set, hears every booking the Controller makes and
	// ends (router replicas share them: router/cluster).
	Observer Observer
	// Sessions, when set, gives each classifier partition its
	// shared.PartitionContext.Sessions (router replicas share session
	// bindings: router/cluster); nil: none.
	Sessions func(model string, role shared.Role) shared.SessionStore
	// DefaultSLO is the latency targets of a request that sets none of
	// its own and whose queue class sets none (replay's --slo), field by
	// field; zero: none.
	DefaultSLO shared.SLO
}

// TTFTPredictor predicts a request's time to first token once it is
// dispatched, from the router's state now (the best candidate's
// prediction, say): the slack queue order (config.OrderSlack) reads it
// for each request that queues with a TTFT target. The Controller finds
// it on its core (*router.Router) by type assertion; without one, or when
// it answers 0 (untrained), it takes the request's uncached prompt tokens
// times DefaultPrefillPerToken.
// Called outside every lock of this package; it must be safe for
// concurrent use and must not block.
type TTFTPredictor interface {
	PredictTTFT(req *shared.Request) time.Duration
}

// DefaultPrefillPerToken is the prefill time per uncached prompt token of
// the fallback TTFT prediction: the simulated engine's default compute
// slope, 0.021 ms a batched token (router/sim DefaultTiming PerToken:
// Llama-3.1-8B bf16 on one H100).
const DefaultPrefillPerToken = 21 * time.Microsecond

// Observer hears the bookings a Controller makes: Booked when a request
// is placed on a worker (at Admit, at a dispatch from the queue, at a
// Retry or a Move), FirstToken when its prefill is done, Released when its
// booking is released (its End, or before the new placement of a Retry or
// a Move). For one request the calls come in that order, on the goroutine
// that caused them, some under the request's lock: an Observer must not
// block and must not keep req or d's fields beyond the call (copy what it
// needs). The request's id may change at a Retry: Released comes under the
// old id, Booked under the new one.
type Observer interface {
	Booked(req *shared.Request, d router.Decision)
	FirstToken(id string)
	Released(id string)
}

// Controller admits requests into a Router. Safe for concurrent use.
type Controller struct {
	core     *router.Router
	capacity int64
	queueCfg config.Queue
	queues   queueSet
	// waiting counts the requests in every queue (and the places pushes
	// have reserved): Dispatch with nothing queued costs one atomic load,
	// and max_waiting bounds it.
	waiting  atomic.Int64
	live     liveTable
	factory  shared.ClassifierFactory
	cls      atomic.Pointer[classifierSet]
	clsMu    sync.Mutex // serialises replacing cls
	bus      *bus
	now      func() time.Time
	onQueued func()
	obs      Observer // nil: none
	sessions func(model string, role shared.Role) shared.SessionStore
	// classSLO is each queue class's targets (config.QueueClass.SLO), by
	// name; defaultSLO Options.DefaultSLO; sloOn says either sets some,
	// so a request without targets of its own looks them up.
	classSLO   map[string]shared.SLO
	defaultSLO shared.SLO
	sloOn      bool
	// slack names the classes of the slack order; predictor is the
	// core's TTFTPredictor, nil for the fallback.
	slack     map[string]bool
	predictor TTFTPredictor

	// dispatchMu serialises Dispatch calls: the queue's order is the
	// point. Admissions never take it. blocked is Dispatch's scratch.
	dispatchMu sync.Mutex
	blocked    []bool
	closed     atomic.Bool
}

// New returns a Controller that places requests through core.
func New(core *router.Router, o Options) (*Controller, error) {
	if core == nil {
		return nil, errors.New("admission: nil router")
	}
	if len(o.Queue.Classes) == 0 {
		o.Queue = config.DefaultQueue()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	c := &Controller{
		core:     core,
		capacity: int64(o.Queue.MaxActiveRequests),
		queueCfg: o.Queue,
		factory:  o.Classifier,
		sessions: o.Sessions,
		now:      o.Now,
		onQueued: o.OnQueued,
		obs:      o.Observer,
	}
	c.live.init()
	c.defaultSLO, c.sloOn = o.DefaultSLO, o.DefaultSLO.Has() || o.DefaultSLO.OnMiss != shared.SLOMissDefault
	for _, cl := range o.Queue.Classes {
		if cl.SLO.Has() || cl.SLO.OnMiss != shared.SLOMissDefault {
			if c.classSLO == nil {
				c.classSLO = make(map[string]shared.SLO)
			}
			c.classSLO[cl.Name], c.sloOn = cl.SLO, true
		}
		if cl.Order == config.OrderSlack {
			if c.slack == nil {
				c.slack = make(map[string]bool)
			}
			c.slack[cl.Name] = true
		}
	}
	c.predictor, _ = any(core).(TTFTPredictor)
	if err := c.queues.init(queueConfig(o.Queue)); err != nil {
		return nil, fmt.Errorf("admission: queue: %w", err)
	}
	c.bus = newBus(c, o.Listeners, o.InlineEvents)
	return c, nil
}

// queueConfig is the configuration of each partition's queue: the
// classes and aging of the queue block. max_waiting bounds all of them
// together (push), not each.
func queueConfig(q config.Queue) queue.Config {
	c := queue.Config{DefaultClass: q.DefaultClass, Aging: q.Aging}
	for _, cl := range q.Classes {
		c.Classes = append(c.Classes, queue.ClassConfig{Name: cl.Name, Weight: cl.Weight, Order: queue.Order(cl.Order)})
	}
	return c
}

// Close stops the event delivery goroutine after it delivered every event
// emitted before. Requests still live keep working; their later events
// are dropped. Admit fails with ErrClosed afterwards. A second Close does
// nothing.
func (c *Controller) Close() {
	if c.closed.CompareAndSwap(false, true) {
		c.bus.close()
	}
}

// Router is the selection core the Controller places through.
func (c *Controller) Router() *router.Router { return c.core }

// Option adjusts one Admit.
type Option func(*Handle)

// Exclude keeps the workers ids out of the request's candidates, at Admit
// and at every later dispatch of it, as if they were at capacity but
// without waiting for them: when every candidate is excluded the request
// fails with router.ErrAllExcluded. The slice is kept; do not modify it
// while the request is live.
func Exclude(ids ...shared.WorkerID) Option {
	return func(h *Handle) { h.exclude = append(h.exclude, ids...) }
}

// Arrival says when the request arrived at the router, on the
// Controller's clock (serve: its first byte, before its body was read):
// its time in the router counts against its TTFT target from then
// (shared.SLO.Waited). Without it, the request arrives at Admit.
func Arrival(t time.Time) Option {
	return func(h *Handle) { h.start = t }
}

// Untimed says the request's answer is not streamed: its first byte
// comes with the whole answer, so the time to it is no time to first
// token, and the latency predictor learns neither TTFT nor TPOT from the
// request (only its output length). FirstToken still ends its booked
// prefill and listeners still hear first_token.
func Untimed() Option {
	return func(h *Handle) { h.untimed = true }
}

// Alternates asks for up to k runners-up with the request's placement
// (router.Placement.Alternates, at most router.MaxAlternates): they are
// in Handle.Decision().Alternates, at Admit or at the dispatch of a
// queued request.
func Alternates(k int) Option {
	return func(h *Handle) { h.alternates = k }
}

// Admit classifies req and places it on a worker of its role with
// capacity, or queues it when every candidate is at capacity. It returns
// the request's handle; call End on it exactly when the request is over
// (End is idempotent and safe on every path, so `defer h.End(...)` right
// after Admit is the idiom).
//
// Errors, with a nil handle: ErrClosed, ErrDuplicateRequest, a
// *ClassifyError (the classifier failed or panicked; only this
// request fails), the classifier factory's error, ErrUnknownClass, and
// shared.ErrNoWorkers when a classifier would be made for the request's
// model and role while no worker serves them (model names come from
// clients: one nobody serves is refused unclassified). Errors
// after classification come with the handle (ended, its classification
// readable, so callers can account the refusal to its class):
// ErrQueueFull, or the core's (router.Place). Only ErrDuplicateRequest's
// text names the request's id (the id is the fault): the others read the
// same for every request they refuse, so that replay groups rejections
// by reason and serve and the EPP answer them without an internal id.
func (c *Controller) Admit(ctx context.Context, req *shared.Request, opts ...Option) (*Handle, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if req.BlockSize == 0 {
		req.BlockSize = c.core.BlockSize()
	}
	h := &Handle{c: c, req: req}
	for _, opt := range opts {
		opt(h)
	}
	h.tokens.Store(int64(req.PromptTokens))
	if !c.live.add(req.ID, h) {
		return nil, fmt.Errorf("request %q: %w", req.ID, ErrDuplicateRequest)
	}
	// Live from here, so that Progress answers during Classify.
	if err := c.classify(ctx, h); err != nil {
		c.live.remove(req.ID, h)
		return nil, err
	}
	c.applySLO(h)
	if err := h.enter(ctx); err != nil {
		return h, err
	}
	return h, nil
}

// classify sets h's classification: the classifier's answer when there is
// one, with the scheduling cost defaulted to the uncached prompt tokens.
// Without a classifier the cost is computed only if the request queues
// (chargeOf): a request placed at once never needs it.
func (c *Controller) classify(ctx context.Context, h *Handle) error {
	req := h.req
	cl, err := c.classifierFor(req.Model, req.Role)
	if errors.Is(err, shared.ErrNoWorkers) {
		return err
	}
	if err != nil || cl == nil {
		if err != nil {
			return fmt.Errorf("creating the classifier: %w", err)
		}
		return nil
	}
	// The uncached prompt is the classifier's input.
	uncached := c.uncached(req)
	class, err := SafeClassify(ctx, "request_classifier", cl, req)
	if err != nil {
		return err
	}
	if class.PolicyClass != "" && !c.knownClass(class.PolicyClass) {
		return fmt.Errorf("%w %q (queue classes: %s)", ErrUnknownClass, class.PolicyClass, c.classNames())
	}
	h.class = class
	req.Priority = class.Priority
	if h.class.SchedulingCostTokens <= 0 {
		h.class.SchedulingCostTokens = uncached
	}
	return nil
}

// applySLO completes h's latency targets, field by field, from its queue
// class's (the classification's, else the default class) and then
// Options.DefaultSLO; a request with a target reads the clock for its
// arrival unless Arrival gave it.
func (c *Controller) applySLO(h *Handle) {
	s := &h.req.SLO
	if c.sloOn {
		name := h.class.PolicyClass
		if name == "" {
			name = c.queueCfg.DefaultClass
		}
		for _, d := range [...]shared.SLO{c.classSLO[name], c.defaultSLO} {
			if s.TTFT == 0 {
				s.TTFT = d.TTFT
			}
			if s.TPOT == 0 {
				s.TPOT = d.TPOT
			}
			if s.OnMiss == shared.SLOMissDefault {
				s.OnMiss = d.OnMiss
			}
		}
	}
	if s.Has() && h.start.IsZero() {
		h.start = c.now()
	}
}

// setWaited sets h's SLO.Waited, its time in the router at now, before a
// placement: only for a request with a target.
func (h *Handle) setWaited(now time.Time) {
	if h.req.SLO.Has() {
		h.req.SLO.Waited = max(now.Sub(h.start), 0)
	}
}

// predictTTFT is the predicted time to first token of h's request once
// dispatched (TTFTPredictor), for the slack order.
func (c *Controller) predictTTFT(h *Handle) time.Duration {
	if c.predictor != nil {
		if d := c.predictor.PredictTTFT(h.req); d > 0 {
			return d
		}
	}
	return time.Duration(h.class.SchedulingCostTokens) * DefaultPrefillPerToken
}

// uncached sets req.CachedPromptTokens from the prefix index and returns
// the uncached prompt tokens (at least 1).
func (c *Controller) uncached(req *shared.Request) int64 {
	n := c.core.UncachedTokens(req)
	req.CachedPromptTokens = max(req.PromptTokens-int(n), 0)
	return n
}

// knownClass reports whether the queue has a class called name.
func (c *Controller) knownClass(name string) bool {
	for _, cl := range c.queueCfg.Classes {
		if cl.Name == name {
			return true
		}
	}
	return false
}

// classNames lists the queue's classes for messages.
func (c *Controller) classNames() string {
	names := make([]string, len(c.queueCfg.Classes))
	for i, cl := range c.queueCfg.Classes {
		names[i] = cl.Name
	}
	return strings.Join(names, ", ")
}

// placement narrows h's selection: the worker capacity, its excluded
// workers, and its explicit pin or else the classification's advisory
// target; the booking is made in the handle.
func (c *Controller) placement(h *Handle) router.Placement {
	pl := router.Placement{Capacity: c.capacity, Exclude: h.exclude, Failed: h.failed, Target: h.class.Target, HasTarget: h.class.HasTarget, Booking: &h.booking,
		Alternates: h.alternates}
	if h.req.HasPin {
		pl.Target, pl.HasTarget = h.req.Pin, true
	}
	return pl
}

// push queues h in the queue of its (model, role) partition. Errors:
// ErrQueueFull (max_waiting requests wait already, in every queue
// together), or the queue's (an unknown class).
func (c *Controller) push(h *Handle) error {
	if h.class.SchedulingCostTokens <= 0 {
		h.class.SchedulingCostTokens = c.uncached(h.req)
	}
	if !c.reserve() {
		return ErrQueueFull
	}
	// The clock is read only for a request that queues: its arrival in
	// the queue (aging, Waited) is now.
	h.arrival = c.now()
	pq := c.queues.get(partKey{h.req.Model, h.req.Role})
	it := &queue.Item{ID: h.req.ID, Class: h.class.PolicyClass, Priority: h.class.Priority,
		Cost: h.class.SchedulingCostTokens, Arrival: h.arrival, DueAt: h.class.DueAt, Value: h}
	if ttft := h.req.SLO.TTFT; ttft > 0 && c.slackClass(h.class.PolicyClass) {
		// The target's part left (at least 1ns: a spent target still
		// ranks above none), and the prediction, made before the lock.
		it.TTFT = max(ttft-max(h.arrival.Sub(h.start), 0), 1)
		it.PredictedTTFT = c.predictTTFT(h)
	}
	pq.mu.Lock()
	err := pq.q.Push(it)
	if err == nil {
		h.item, h.pq = it, pq
	}
	pq.mu.Unlock()
	if err != nil {
		c.waiting.Add(-1)
	}
	return err
}

// slackClass reports whether the class name ("" for the default) orders
// by slack.
func (c *Controller) slackClass(name string) bool {
	if c.slack == nil {
		return false
	}
	if name == "" {
		name = c.queueCfg.DefaultClass
	}
	return c.slack[name]
}

// reserve counts one more waiting request; false when max_waiting
// already wait.
func (c *Controller) reserve() bool {
	limit := int64(c.queueCfg.MaxWaiting)
	for {
		n := c.waiting.Load()
		if limit > 0 && n >= limit {
			return false
		}
		if c.waiting.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// unqueue takes h out of its queue; false when it is not there
// (dispatched or expired meanwhile).
func (c *Controller) unqueue(h *Handle) bool {
	pq := h.pq
	if pq == nil {
		return false
	}
	pq.mu.Lock()
	defer pq.mu.Unlock()
	if h.item == nil {
		return false
	}
	pq.q.Remove(h.item.ID)
	h.item = nil
	c.waiting.Add(-1)
	return true
}

// Dispatch places queued requests while capacity allows and appends them
// to out; requests whose due time passed are refused (their Wait returns
// ErrDue) and appended too. Call it whenever capacity may have freed (a
// request ended, a worker joined) and as time passes; serve's Run does.
// With nothing queued it costs one atomic load. ctx bounds the
// placements: once it ends Dispatch returns, and the requests not placed
// keep waiting (ctx is the dispatcher's, not theirs).
//
// Requests wait in one queue per (model, role) partition, so a model
// whose workers are full never holds up another's (a request is placed
// only on its own model's workers). Role by role, Dispatch takes the
// heads of the partitions' queues in turn, the highest priority first,
// then the earliest to queue (then the model name), until each head
// either cannot be placed (every candidate busy: that partition waits
// for the next Dispatch) or its queue is empty. Within a partition the
// queue's own order holds (classes by weight, aged priority, the class's
// order).
//
// The queue's lock is not held while a request is placed: Dispatch peeks
// at the head, places it, and takes it out of the queue only if it is
// still there (a request cancelled meanwhile gets its booking released).
// Dispatch calls are serialised among themselves.
func (c *Controller) Dispatch(ctx context.Context, out []*Handle) []*Handle {
	if c.waiting.Load() == 0 {
		return out
	}
	c.dispatchMu.Lock()
	defer c.dispatchMu.Unlock()
	now := c.now()
	all := c.queues.all()
	for _, role := range config.Roles {
		qs := byRole(all, role)
		if len(qs) == 0 {
			continue
		}
		for _, pq := range qs {
			out = c.expire(pq, now, out)
		}
		c.blocked = slices.Grow(c.blocked[:0], len(qs))[:len(qs)]
		clear(c.blocked)
		for {
			best, it := c.head(qs, now)
			if best < 0 {
				break
			}
			pq := qs[best]
			h := it.Value.(*Handle)
			h.setWaited(now)
			d, err := c.core.Place(ctx, h.req, c.placement(h))
			if ctx.Err() != nil {
				if err == nil {
					d.Booking.Release()
				}
				return out // the dispatcher is stopping
			}
			if errors.Is(err, shared.ErrAllBusy) {
				c.blocked[best] = true // nothing of this partition fits now
				continue
			}
			if !c.take(pq, h, it, now) {
				// Cancelled while it was being placed.
				if err == nil {
					d.Booking.Release()
				}
				continue
			}
			if err != nil {
				if h.refuse(err, now) {
					out = append(out, h)
				}
				continue
			}
			if h.dispatched(d, now) {
				out = append(out, h)
			}
		}
	}
	return out
}

// expire refuses pq's requests whose due time passed, appending them to
// out.
func (c *Controller) expire(pq *partQueue, now time.Time, out []*Handle) []*Handle {
	pq.mu.Lock()
	expired := pq.q.Expire(now, nil)
	for _, it := range expired {
		it.Value.(*Handle).item = nil
	}
	c.waiting.Add(-int64(len(expired)))
	pq.mu.Unlock()
	for _, it := range expired {
		h := it.Value.(*Handle)
		if h.refuse(ErrDue, now) {
			out = append(out, h)
		}
	}
	return out
}

// head returns the index in qs of the queue whose head goes next, and
// that head: among the queues not blocked (c.blocked) and not empty, the
// head of the highest priority, then the earliest arrival, then the first
// queue (model order). -1 when there is none; empty queues are marked
// blocked.
func (c *Controller) head(qs []*partQueue, now time.Time) (int, *queue.Item) {
	best := -1
	var bestIt *queue.Item
	for i, pq := range qs {
		if c.blocked[i] {
			continue
		}
		pq.mu.Lock()
		it, ok := pq.q.Peek(now)
		pq.mu.Unlock()
		if !ok {
			c.blocked[i] = true
			continue
		}
		if best < 0 || it.Priority > bestIt.Priority || (it.Priority == bestIt.Priority && it.Arrival.Before(bestIt.Arrival)) {
			best, bestIt = i, it
		}
	}
	return best, bestIt
}

// take removes h's item it from pq after it was placed; false when it
// left the queue meanwhile (End). h.item tells, not the id: once h ended,
// a new request may have queued under the same id. When it is still the
// head, Pop removes it, which charges its class's deficit and moves the
// round robin on (what shares dispatches between classes by weight); when
// an admission pushed a new head meanwhile, Remove takes it without the
// charge (a rare race; the next dispatch of its class pays the deficit as
// usual).
func (c *Controller) take(pq *partQueue, h *Handle, it *queue.Item, now time.Time) bool {
	pq.mu.Lock()
	defer pq.mu.Unlock()
	if h.item != it {
		return false
	}
	if head, _ := pq.q.Peek(now); head == it {
		pq.q.Pop(now)
	} else {
		pq.q.Remove(it.ID)
	}
	h.item = nil
	c.waiting.Add(-1)
	return true
}

// Run dispatches queued requests until ctx ends: at every Wake and every
// interval (due times, aging, workers joining). serve runs it; replay
// calls Dispatch itself at simulated times.
func (c *Controller) Run(ctx context.Context, interval time.Duration, wake <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-t.C:
		}
		c.Dispatch(ctx, nil)
	}
}

// Queued is how many requests wait in every queue.
func (c *Controller) Queued() int { return int(c.waiting.Load()) }

// Waiting is how many requests wait in role's queues (every model's).
func (c *Controller) Waiting(role shared.Role) int {
	n := 0
	for _, pq := range byRole(c.queues.all(), role) {
		pq.mu.Lock()
		n += pq.q.Len()
		pq.mu.Unlock()
	}
	return n
}

// ClassDepth is one queue class's waiting count (WaitingByClass).
type ClassDepth struct {
	Class   string
	Waiting int
}

// WaitingByClass appends to dst, for each class of the queue in file
// order, how many requests wait in it summed over every queue (serve's
// switchyard_queue_depth{class}), and returns the extended slice.
func (c *Controller) WaitingByClass(dst []ClassDepth) []ClassDepth {
	start := len(dst)
	for _, cl := range c.queueCfg.Classes {
		dst = append(dst, ClassDepth{Class: cl.Name})
	}
	for _, pq := range c.queues.all() {
		pq.mu.Lock()
		for i, cl := range c.queueCfg.Classes {
			dst[start+i].Waiting += pq.q.ClassLen(cl.Name)
		}
		pq.mu.Unlock()
	}
	return dst
}

// Progress reports a live request's prompt plus generated tokens so far
// (shared.PartitionContext.Progress); false for an id that is not live.
func (c *Controller) Progress(id string) (int64, bool) {
	h := c.live.get(id)
	if h == nil {
		return 0, false
	}
	return h.tokens.Load(), true
}
