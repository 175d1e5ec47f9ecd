package router

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/queue"
	"github.com/switchyard-router/switchyard/shared"
)

// Admission errors callers branch on.
var (
	// ErrDuplicateRequest: Admit of a request id that is still live.
	ErrDuplicateRequest = errors.New("a request with this id is already live")
	// ErrUnknownRequest: a lifecycle call for an id that is not live.
	ErrUnknownRequest = errors.New("no live request with this id")
	// ErrQueueFull: every candidate is at capacity and the queue holds
	// max_waiting requests (429 in serve).
	ErrQueueFull = errors.New("every worker is at capacity and the queue is full")
	// ErrDue: the request's due time passed while it waited in the queue.
	ErrDue = errors.New("the request's due time passed while it was queued")
	// ErrUnknownClass: a classifier named a policy class the queue does not
	// have. The request fails whether or not it would have waited.
	ErrUnknownClass = errors.New("unknown policy class")
	// ErrAllExcluded: every worker that serves the request's model and
	// role is excluded (Exclude). It wraps shared.ErrNoWorkers.
	ErrAllExcluded = fmt.Errorf("every candidate worker is excluded: %w", shared.ErrNoWorkers)
)

// AdmitOption adjusts one Admit.
type AdmitOption func(*admitOptions)

type admitOptions struct {
	exclude []shared.WorkerID
}

// Exclude keeps the workers ids out of the request's candidates, at Admit
// and at every later Dispatch of it, as if they were at capacity but
// without waiting for them: when every candidate is excluded the request
// fails with ErrAllExcluded. serve uses it to retry a request that failed
// before its first byte anywhere but on the workers that failed it (the
// prefix index recorded the prompt as sent there, so a KV-aware policy
// would otherwise choose them again). The slice is kept; do not modify it
// while the request is live.
func Exclude(ids ...shared.WorkerID) AdmitOption {
	return func(o *admitOptions) { o.exclude = append(o.exclude, ids...) }
}

// knownClass reports whether the queue has a class called name.
func (a *admission) knownClass(name string) bool {
	for _, c := range a.queueCfg.Classes {
		if c.Name == name {
			return true
		}
	}
	return false
}

// classNames lists the queue's classes for messages.
func (a *admission) classNames() string {
	names := make([]string, len(a.queueCfg.Classes))
	for i, c := range a.queueCfg.Classes {
		names[i] = c.Name
	}
	return strings.Join(names, ", ")
}

// Ticket is the outcome of admitting a request: dispatched now (Decision
// set), or queued until capacity frees (Queued).
type Ticket struct {
	ID             string
	Request        *shared.Request
	Classification shared.Classification
	Queued         bool
	Decision       Decision
	// Waited is how long the request waited in the queue (Dispatch).
	Waited time.Duration
	// Err is why a queued request left the queue without a worker (ErrDue).
	Err error
}

// admission is the Router's classify–queue–dispatch state. One mutex
// guards the queues and the live requests; selections run under it, which
// serialises admissions and dispatches (the queue's order is the point)
// but not plain Select calls.
type admission struct {
	mu          sync.Mutex
	capacity    int64
	queueCfg    config.Queue
	queues      map[shared.Role]*queue.Queue
	live        map[string]*liveRequest
	factory     shared.ClassifierFactory // AdmissionOptions.Classifier
	classifiers *classifierSet           // of the current factory; nil until first use
	overlap     []int32                  // scratch for uncachedTokens, guarded by mu
	listeners   []shared.EventListener
	now         func() time.Time
}

// liveRequest is one admitted request until it ends.
type liveRequest struct {
	req     *shared.Request
	class   shared.Classification
	exclude []shared.WorkerID // Exclude: never candidates for it
	arrival time.Time
	queued  bool
	booking *Decision
	tokens  int64 // prompt plus generated tokens so far (Progress)
}

// AdmissionOptions configure Admit's classifier, queue and events.
type AdmissionOptions struct {
	// Queue is the queue block (config.DefaultQueue when zero).
	Queue config.Queue
	// Classifier, when set, classifies every admitted request; it is
	// asked for one Classifier per role on first use.
	Classifier shared.ClassifierFactory
	// Listeners receive every request's lifecycle events, in order, in
	// the goroutine that caused them (replay is single-threaded, so this
	// keeps it deterministic). A classifier that implements
	// shared.EventListener is added.
	Listeners []shared.EventListener
	// Now is the clock for queue arrival, aging and due times: simulated
	// time in replay; nil means time.Now.
	Now func() time.Time
}

// EnableAdmission configures Admit. Call it before the first Admit.
func (r *Router) EnableAdmission(o AdmissionOptions) error {
	if len(o.Queue.Classes) == 0 {
		o.Queue = config.DefaultQueue()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	a := &admission{
		capacity:  int64(o.Queue.MaxActiveRequests),
		queueCfg:  o.Queue,
		queues:    map[shared.Role]*queue.Queue{},
		live:      map[string]*liveRequest{},
		factory:   o.Classifier,
		listeners: o.Listeners,
		now:       o.Now,
	}
	for _, role := range config.Roles {
		q, err := queue.New(queueConfig(o.Queue))
		if err != nil {
			return fmt.Errorf("router: queue: %w", err)
		}
		a.queues[role] = q
	}
	r.adm = a
	return nil
}

func queueConfig(q config.Queue) queue.Config {
	c := queue.Config{DefaultClass: q.DefaultClass, Aging: q.Aging, MaxLen: q.MaxWaiting}
	for _, cl := range q.Classes {
		c.Classes = append(c.Classes, queue.ClassConfig{Name: cl.Name, Weight: cl.Weight, Order: queue.Order(cl.Order)})
	}
	return c
}

// classifierSet is one classifier factory with the per-role classifiers
// it made and the event listeners among them.
type classifierSet struct {
	factory   shared.ClassifierFactory
	byRole    map[shared.Role]shared.Classifier
	errs      map[shared.Role]error
	listeners []shared.EventListener
}

// currentFactory is the classifier factory of the bundle deciding now (its
// policy file's request_classifier), or AdmissionOptions.Classifier when
// the bundle has none; nil without either.
func (r *Router) currentFactory() shared.ClassifierFactory {
	if b := r.cur.Load(); b != nil && b.Config != nil && b.Config.Classifier != nil {
		if f, ok := b.Config.Classifier.Instance.(shared.ClassifierFactory); ok {
			return f
		}
	}
	return r.adm.factory
}

// classifierFor returns role's classifier from the current factory,
// created on first use; nil without a factory. A reload that brings a new
// request_classifier starts a new set: the old factory is closed with its
// bundle, so its classifiers must not be called again.
func (r *Router) classifierFor(role shared.Role) (shared.Classifier, error) {
	a := r.adm
	f := r.currentFactory()
	if f == nil {
		a.classifiers = nil
		return nil, nil
	}
	if cs := a.classifiers; cs == nil || !sameFactory(cs.factory, f) {
		cs = &classifierSet{factory: f, byRole: map[shared.Role]shared.Classifier{}, errs: map[shared.Role]error{}}
		if l, ok := f.(shared.EventListener); ok {
			cs.listeners = append(cs.listeners, l)
		}
		a.classifiers = cs
	}
	cs := a.classifiers
	if c, ok := cs.byRole[role]; ok {
		return c, cs.errs[role]
	}
	c, err := f.NewClassifier(shared.PartitionContext{
		Role:      role,
		BlockSize: r.blockSize,
		Workers: func() []shared.WorkerInfo {
			if p := r.fleet.Snapshot().Partition(role); p != nil {
				return p.Infos
			}
			return nil
		},
		Progress: r.progress,
		Now:      a.now,
	})
	if err == nil {
		if l, ok := c.(shared.EventListener); ok && !sameFactory(c, f) {
			cs.listeners = append(cs.listeners, l)
		}
	}
	cs.byRole[role], cs.errs[role] = c, err
	return c, err
}

// sameFactory compares two components by identity, false for types that
// cannot be compared.
func sameFactory(a, b any) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta != nil && ta.Comparable() && a == b
}

// progress reports a live request's tokens so far (PartitionContext).
// Classifiers call it from Classify, under the admission lock, so it must
// not take the lock: it reads the live map the lock's holder guards.
func (r *Router) progress(id string) (int64, bool) {
	lr := r.adm.live[id]
	if lr == nil {
		return 0, false
	}
	return lr.tokens, true
}

// Admit classifies req, then dispatches it to a worker if one of its
// role's candidates has capacity, or queues it. A classifier error or
// panic fails only this request (*shared.ClassifyError). Errors:
// ErrDuplicateRequest, ErrQueueFull, a *shared.ClassifyError, or Select's.
// When the request was classified before it failed (queue full, no worker,
// the policy's error), the returned Ticket still carries its ID, Request
// and Classification, so callers can account the refusal to its class.
// Options: Exclude.
func (r *Router) Admit(ctx context.Context, req *shared.Request, opts ...AdmitOption) (Ticket, error) {
	var o admitOptions
	for _, opt := range opts {
		opt(&o)
	}
	a := r.adm
	if a == nil {
		return Ticket{}, errors.New("router: Admit before EnableAdmission")
	}
	if req.BlockSize == 0 {
		req.BlockSize = r.blockSize
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, dup := a.live[req.ID]; dup {
		return Ticket{}, fmt.Errorf("request %q: %w", req.ID, ErrDuplicateRequest)
	}
	now := a.now()
	t := Ticket{ID: req.ID, Request: req}
	c, err := r.classifierFor(req.Role)
	if err != nil {
		return Ticket{}, fmt.Errorf("request %q: creating the classifier: %w", req.ID, err)
	}
	lr := &liveRequest{req: req, exclude: o.exclude, arrival: now, tokens: int64(req.PromptTokens)}
	a.live[req.ID] = lr // visible to Progress during Classify
	// The uncached prompt is the classifier's input and the queue's default
	// charge; a router with neither never needs it.
	uncached := int64(1)
	if c != nil || a.capacity > 0 {
		uncached = r.uncachedTokens(req)
		req.CachedPromptTokens = max(req.PromptTokens-int(uncached), 0)
	}
	if c != nil {
		cl, err := shared.SafeClassify(ctx, "request_classifier", c, req)
		if err != nil {
			delete(a.live, req.ID)
			return Ticket{}, err
		}
		if cl.PolicyClass != "" && !a.knownClass(cl.PolicyClass) {
			delete(a.live, req.ID)
			return Ticket{}, fmt.Errorf("request %q: %w %q (queue classes: %s)", req.ID, ErrUnknownClass, cl.PolicyClass, a.classNames())
		}
		t.Classification = cl
		req.Priority = cl.Priority
	}
	if t.Classification.SchedulingCostTokens <= 0 {
		t.Classification.SchedulingCostTokens = uncached
	}
	lr.class = t.Classification

	d, err := r.place(ctx, req, r.placementFor(lr, t.Classification))
	switch {
	case err == nil:
		t.Decision = d
		lr.booking = &t.Decision
		r.emit(shared.Event{Kind: shared.EventSent, RequestID: req.ID, Worker: d.Worker.ID, HasWorker: true, At: now})
		return t, nil
	case errors.Is(err, shared.ErrAllBusy):
		item := &queue.Item{ID: req.ID, Class: t.Classification.PolicyClass, Priority: t.Classification.Priority,
			Cost: t.Classification.SchedulingCostTokens, Arrival: now, DueAt: t.Classification.DueAt, Value: &t}
		if err := a.queues[req.Role].Push(item); err != nil {
			delete(a.live, req.ID)
			if errors.Is(err, queue.ErrFull) {
				err = ErrQueueFull
			}
			r.emit(shared.Event{Kind: shared.EventAborted, RequestID: req.ID, Reason: err.Error(), At: now})
			return t, fmt.Errorf("request %q: %w", req.ID, err)
		}
		lr.queued = true
		t.Queued = true
		return t, nil
	default:
		delete(a.live, req.ID)
		r.emit(shared.Event{Kind: shared.EventAborted, RequestID: req.ID, Reason: err.Error(), At: now})
		return t, err
	}
}

// placementFor narrows a live request's selection: the worker capacity,
// its excluded workers, and its explicit pin or else the classification's
// advisory target.
func (r *Router) placementFor(lr *liveRequest, cl shared.Classification) placement {
	req := lr.req
	pl := placement{capacity: r.adm.capacity, exclude: lr.exclude, target: cl.Target, hasTarget: cl.HasTarget}
	if req.HasPin {
		pl.target, pl.hasTarget = req.Pin, true
	}
	return pl
}

// uncachedTokens is the default scheduling cost: the prompt tokens the
// best-placed candidate does not hold, at least 1.
func (r *Router) uncachedTokens(req *shared.Request) int64 {
	var best int32
	if p := r.fleet.Snapshot().ModelPartition(req.Model, req.Role); p != nil && len(req.BlockHashes) > 0 {
		a := r.adm
		a.overlap = slices.Grow(a.overlap[:0], len(p.IDs))[:len(p.IDs)]
		r.index.Fill(p.IDs, req.BlockHashes, a.overlap)
		for _, o := range a.overlap {
			best = max(best, o)
		}
	}
	return max(int64(req.PromptTokens-int(best)*r.blockSize), 1)
}

// Dispatch places queued requests while capacity allows and returns them
// (appended to out), in the queue's order; requests whose due time passed
// are returned with Err = ErrDue and an aborted event. Call it whenever
// capacity may have freed (a request ended, a worker joined) and as time
// passes.
func (r *Router) Dispatch(ctx context.Context, out []Ticket) []Ticket {
	a := r.adm
	if a == nil {
		return out
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	for _, role := range config.Roles {
		q := a.queues[role]
		for _, it := range q.Expire(now, nil) {
			t := *it.Value.(*Ticket)
			t.Err, t.Waited = ErrDue, now.Sub(it.Arrival)
			delete(a.live, it.ID)
			r.emit(shared.Event{Kind: shared.EventAborted, RequestID: it.ID, Reason: ErrDue.Error(), At: now})
			out = append(out, t)
		}
		for {
			it, ok := q.Peek(now)
			if !ok {
				break
			}
			t := *it.Value.(*Ticket)
			lr := a.live[it.ID]
			d, err := r.place(ctx, t.Request, r.placementFor(lr, t.Classification))
			if errors.Is(err, shared.ErrAllBusy) {
				break
			}
			// Pop, not Remove: Pop charges the class's deficit and moves
			// the round robin on, which is what shares dispatches between
			// classes by weight (Remove leaves the DRR state as it was, so
			// the class at the cursor would be served until it empties).
			// Nothing changed the queue since Peek at the same now, so Pop
			// returns the item Peek did.
			if err != nil {
				q.Remove(it.ID)
			} else if popped, _ := q.Pop(now); popped != it {
				panic(fmt.Sprintf("router: queue Pop returned %v after Peek returned %q", popped, it.ID))
			}
			t.Queued, t.Waited = false, now.Sub(it.Arrival)
			if err != nil {
				t.Err = err
				delete(a.live, it.ID)
				r.emit(shared.Event{Kind: shared.EventAborted, RequestID: it.ID, Reason: err.Error(), At: now})
				out = append(out, t)
				continue
			}
			t.Decision = d
			lr.queued, lr.booking = false, &t.Decision
			r.emit(shared.Event{Kind: shared.EventSent, RequestID: it.ID, Worker: d.Worker.ID, HasWorker: true, At: now})
			out = append(out, t)
		}
	}
	return out
}

// FirstToken records a live request's first token.
func (r *Router) FirstToken(id string) error {
	return r.lifecycle(id, func(lr *liveRequest, now time.Time) (bool, shared.Event) {
		if lr.booking != nil {
			lr.booking.Booking.PrefillDone()
		}
		return false, shared.Event{Kind: shared.EventFirstToken, RequestID: id, At: now}
	})
}

// Progress records that a live request has contextTokens (prompt plus
// generated) tokens so far; classifiers read it through Progress.
func (r *Router) Progress(id string, contextTokens int64) {
	a := r.adm
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if lr := a.live[id]; lr != nil && contextTokens > lr.tokens {
		lr.tokens = contextTokens
	}
}

// Complete ends a live request that finished on its worker, releasing its
// booking.
func (r *Router) Complete(id string, contextTokens int64) error {
	return r.lifecycle(id, func(lr *liveRequest, now time.Time) (bool, shared.Event) {
		ev := shared.Event{Kind: shared.EventCompleted, RequestID: id, ContextTokens: contextTokens, At: now}
		if lr.booking != nil {
			lr.booking.Booking.Release()
			ev.Worker, ev.HasWorker = lr.booking.Worker.ID, true
		}
		return true, ev
	})
}

// Abort ends a live request without completion (worker error, client
// cancel, timeout): its booking is released, or it leaves the queue.
func (r *Router) Abort(id, reason string) error {
	return r.lifecycle(id, func(lr *liveRequest, now time.Time) (bool, shared.Event) {
		ev := shared.Event{Kind: shared.EventAborted, RequestID: id, Reason: reason, At: now}
		if lr.queued {
			r.adm.queues[lr.req.Role].Remove(id)
		}
		if lr.booking != nil {
			lr.booking.Booking.Release()
			ev.Worker, ev.HasWorker = lr.booking.Worker.ID, true
		}
		return true, ev
	})
}

func (r *Router) lifecycle(id string, f func(*liveRequest, time.Time) (end bool, ev shared.Event)) error {
	a := r.adm
	if a == nil {
		return errors.New("router: lifecycle call before EnableAdmission")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	lr := a.live[id]
	if lr == nil {
		return fmt.Errorf("request %q: %w", id, ErrUnknownRequest)
	}
	end, ev := f(lr, a.now())
	if end {
		delete(a.live, id)
	}
	r.emit(ev)
	return nil
}

// Waiting is how many requests wait in role's queue.
func (r *Router) Waiting(role shared.Role) int {
	a := r.adm
	if a == nil {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.queues[role].Len()
}

// WaitingByClass appends to dst, for each class of the queue in file
// order, how many requests wait in it summed over the roles' queues
// (serve's switchyard_queue_depth{class}), and returns the extended slice;
// dst unchanged before EnableAdmission.
func (r *Router) WaitingByClass(dst []ClassDepth) []ClassDepth {
	a := r.adm
	if a == nil {
		return dst
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.queueCfg.Classes {
		n := 0
		for _, q := range a.queues {
			n += q.ClassLen(c.Name)
		}
		dst = append(dst, ClassDepth{Class: c.Name, Waiting: n})
	}
	return dst
}

// ClassDepth is one queue class's waiting count (WaitingByClass).
type ClassDepth struct {
	Class   string
	Waiting int
}

// emit delivers one event to every listener, in order. Called with the
// admission lock held, so per-request order is the order of the calls.
//
// Listeners are the admission's (the classifier and AdmissionOptions) and
// the components of the current bundle that implement
// shared.EventListener. A request admitted before a reload may end after
// it; its later events go to the new bundle's components.
func (r *Router) emit(ev shared.Event) {
	batch := [1]shared.Event{ev}
	for _, l := range r.adm.listeners {
		l.OnEvents(batch[:])
	}
	if cs := r.adm.classifiers; cs != nil {
		for _, l := range cs.listeners {
			l.OnEvents(batch[:])
		}
	}
	if b := r.cur.Load(); b != nil {
		for _, l := range b.eventListeners() {
			l.OnEvents(batch[:])
		}
	}
}
