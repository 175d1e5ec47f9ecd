package admission

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/queue"
	"github.com/switchyard-router/switchyard/shared"
)

// Handle is one admitted request from Admit to End. Its methods are safe
// for concurrent use; the request's own goroutine calls Wait, FirstToken,
// Progress, Retry and End, and the dispatcher may dispatch or refuse it
// meanwhile.
type Handle struct {
	c          *Controller
	req        *shared.Request
	class      shared.Classification
	exclude    []shared.WorkerID
	failed     []router.WorkerJoin // workers that failed under the request, in the join they failed in (Retry)
	alternates int                 // runners-up asked for (Alternates)
	arrival    time.Time           // when it last joined a queue (Controller clock)
	// start is the request's arrival at the router (Arrival, else Admit's
	// clock when it has a latency target; zero otherwise).
	start  time.Time
	tokens atomic.Int64 // prompt plus generated tokens so far

	mu       sync.Mutex
	state    state
	ready    chan struct{} // closed when a queued request is dispatched or refused
	decision router.Decision
	err      error // why the request was refused (state ended before a dispatch)
	waited   time.Duration
	first    bool // FirstToken was recorded
	// sentAt and firstAt are when the request was dispatched and when its
	// first token came (Controller clock), kept for the latency predictor
	// when the decision learns (router.Decision.Learn).
	sentAt, firstAt time.Time
	untimed         bool // Untimed: a whole answer, no timing to learn from
	// booking is the storage of the request's booking (no allocation per
	// request); decision.Booking points here while it is dispatched.
	booking fleet.Booking
	// item is the request's entry in its queue (pq) while it holds one
	// (waiting, or expired and not yet refused), else nil. Guarded by
	// that queue's lock, not mu.
	item *queue.Item
	pq   *partQueue
}

type state uint8

const (
	stateNew        state = iota // classified, being placed
	stateQueued                  // waiting in its partition's queue
	stateDispatched              // booked on decision.Worker
	stateEnded                   // over: End, a refusal, or a failed placement
)

// Outcome is how a request ended (End).
type Outcome struct {
	// Completed is true when the worker finished the request normally.
	Completed bool
	// ContextTokens is, when Completed, the prompt plus generated tokens.
	ContextTokens int64
	// Reason says why a request that did not complete ended ("client
	// disconnected", "worker error: ...").
	Reason string
}

// Completed is the outcome of a request its worker finished, with
// contextTokens of prompt plus generated tokens.
func Completed(contextTokens int64) Outcome {
	return Outcome{Completed: true, ContextTokens: contextTokens}
}

// Aborted is the outcome of a request that ended without completing.
func Aborted(reason string) Outcome { return Outcome{Reason: reason} }

// Request is the admitted request (its ID changes with Retry).
func (h *Handle) Request() *shared.Request { return h.req }

// Classification is the request's classification, made once at Admit.
// Its SchedulingCostTokens defaults to the uncached prompt tokens when a
// classifier ran or the request queued; 0 otherwise (never needed).
func (h *Handle) Classification() shared.Classification { return h.class }

// Queued reports whether the request waits in a queue for capacity.
func (h *Handle) Queued() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state == stateQueued
}

// Decision is the request's placement while it is dispatched (the zero
// Decision before, or after a refusal).
func (h *Handle) Decision() router.Decision {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.decision
}

// Err is why the request is not (or no longer) placed: the refusal's
// error (ErrDue, the core's error at a dispatch, a failed placement),
// ErrEnded once it ended by End; nil while it is new, queued or
// dispatched.
func (h *Handle) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Waited is how long the request waited in the queue before it was
// dispatched or refused, on the Controller's clock.
func (h *Handle) Waited() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.waited
}

// Wait returns the request's placement once it is dispatched, at once
// when it was placed at Admit. Errors: the refusal's (ErrDue, the core's
// error at a dispatch), ErrEnded after End, or ctx's error when ctx ends
// first; the request then still waits, and End takes it out of the queue.
func (h *Handle) Wait(ctx context.Context) (router.Decision, error) {
	h.mu.Lock()
	ready := h.ready
	if h.state == stateQueued {
		h.mu.Unlock()
		select {
		case <-ready:
		case <-ctx.Done():
			return router.Decision{}, ctx.Err()
		}
		h.mu.Lock()
	}
	defer h.mu.Unlock()
	switch {
	case h.state == stateDispatched:
		return h.decision, nil
	case h.err != nil:
		return router.Decision{}, h.err
	default:
		return router.Decision{}, ErrEnded
	}
}

// FirstToken records the request's first token: its booked prefill ends
// (LOAD) and listeners hear first_token. Later calls, and calls when the
// request is not dispatched, do nothing.
func (h *Handle) FirstToken() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != stateDispatched || h.first {
		return
	}
	h.first = true
	h.decision.Booking.PrefillDone()
	if h.decision.Learn && !h.untimed {
		h.firstAt = h.c.now()
		h.c.core.ObserveFirstToken(&h.decision, h.firstAt.Sub(h.sentAt))
	}
	if h.c.obs != nil {
		h.c.obs.FirstToken(h.req.ID)
	}
	h.c.bus.emit(shared.Event{Kind: shared.EventFirstToken, RequestID: h.req.ID, Worker: h.decision.Worker.ID, HasWorker: true})
}

// Progress records that the request has contextTokens (prompt plus
// generated) tokens so far; classifiers read it through
// shared.PartitionContext.Progress. Lock-free; smaller values than the
// last are ignored.
func (h *Handle) Progress(contextTokens int64) {
	for {
		cur := h.tokens.Load()
		if contextTokens <= cur || h.tokens.CompareAndSwap(cur, contextTokens) {
			return
		}
	}
}

// End ends the request with outcome o: a dispatched request's booking is
// released and listeners hear completed or aborted; a queued one leaves
// the queue and listeners hear aborted. Idempotent: only the first call
// (or a refusal before it) ends the request.
func (h *Handle) End(o Outcome) {
	c := h.c
	h.mu.Lock()
	defer h.mu.Unlock()
	ev := shared.Event{Kind: shared.EventAborted, RequestID: h.req.ID, Reason: o.Reason}
	switch h.state {
	case stateEnded:
		return
	case stateQueued:
		// Not in the queue any more means a Dispatch took it and is
		// placing it: seeing the state ended, it releases the booking.
		c.unqueue(h)
		close(h.ready)
	case stateDispatched:
		h.decision.Booking.Release()
		if c.obs != nil {
			c.obs.Released(h.req.ID)
		}
		ev.Worker, ev.HasWorker = h.decision.Worker.ID, true
		if o.Completed {
			ev.Kind, ev.ContextTokens, ev.Reason = shared.EventCompleted, o.ContextTokens, ""
			if h.decision.Learn {
				h.learnEnd(o.ContextTokens)
			}
		}
	}
	h.state = stateEnded
	if h.err == nil {
		h.err = ErrEnded
	}
	c.live.remove(h.req.ID, h)
	c.bus.emit(ev)
}

// Retry places a dispatched request again, keeping its classification,
// after its worker failed before answering: the attempt ends (its booking
// released, listeners hear aborted for reason under the old id) and the
// request continues as id, with the failed workers excluded, placed now
// or queued. A failed worker that is the request's own stays excluded
// only while the join it failed in lasts: once it left the fleet and
// joined again (a restarted engine, a new fleet.Worker.Generation) it is
// a candidate again; another failed id is excluded in every join. Wait then returns the new placement. Errors:
// ErrDuplicateRequest when id is live (nothing changed: retry with
// another id), ErrEnded when the request is not dispatched, and the
// errors of a placement (the request has then ended).
func (h *Handle) Retry(ctx context.Context, id, reason string, failed ...shared.WorkerID) error {
	c := h.c
	h.mu.Lock()
	if h.state != stateDispatched {
		h.mu.Unlock()
		return ErrEnded
	}
	if id != h.req.ID && !c.live.add(id, h) {
		h.mu.Unlock()
		return fmt.Errorf("request %q: %w", id, ErrDuplicateRequest)
	}
	h.decision.Booking.Release()
	if c.obs != nil {
		c.obs.Released(h.req.ID)
	}
	c.bus.emit(shared.Event{Kind: shared.EventAborted, RequestID: h.req.ID, Worker: h.decision.Worker.ID, HasWorker: true, Reason: reason})
	if id != h.req.ID {
		c.live.remove(h.req.ID, h)
		h.req.ID = id
	}
	for _, id := range failed {
		if w := h.decision.Worker; w != nil && w.ID == id {
			h.failed = append(h.failed, router.WorkerJoin{ID: id, Generation: w.Generation})
		} else {
			h.exclude = append(h.exclude, id)
		}
	}
	h.state, h.decision, h.first, h.ready = stateNew, router.Decision{}, false, nil
	h.mu.Unlock()
	return h.enter(ctx)
}

// Move books a dispatched request on worker id instead of the one it was
// placed on, which is what happened: an endpoint picker's proxy reports
// that another endpoint served it (a fallback). The old booking is
// released (listeners hear aborted, for reason) and the request is booked
// on id without running the policy and without a capacity check (it is
// on that worker already); listeners hear sent. A first token already
// recorded is recorded again on the new booking. Nothing changes when id
// is the request's worker. Errors: ErrEnded when the request is not
// dispatched; router.ErrAllExcluded (wrapped) when id is not a worker of
// the request's model and role; the core's placement errors. On an error
// after the release the request has ended.
func (h *Handle) Move(ctx context.Context, id shared.WorkerID, reason string) error {
	c := h.c
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != stateDispatched {
		return ErrEnded
	}
	if h.decision.Worker.ID == id {
		return nil
	}
	h.decision.Booking.Release()
	if c.obs != nil {
		c.obs.Released(h.req.ID)
	}
	c.bus.emit(shared.Event{Kind: shared.EventAborted, RequestID: h.req.ID, Worker: h.decision.Worker.ID, HasWorker: true, Reason: reason})
	// Bind runs no policy (no plugin, nothing that blocks): only the
	// booking, so it is made under h.mu like End's release.
	d, err := c.core.Bind(ctx, h.req, router.Binding{Worker: id, Capacity: c.capacity, Booking: &h.booking})
	if err != nil {
		// Listeners heard aborted with the release: the request ends here.
		h.state, h.err = stateEnded, err
		c.live.remove(h.req.ID, h)
		return err
	}
	h.decision = d
	if c.obs != nil {
		c.obs.Booked(h.req, d)
	}
	c.bus.emit(shared.Event{Kind: shared.EventSent, RequestID: h.req.ID, Worker: id, HasWorker: true})
	if h.first {
		d.Booking.PrefillDone()
		if c.obs != nil {
			c.obs.FirstToken(h.req.ID)
		}
		c.bus.emit(shared.Event{Kind: shared.EventFirstToken, RequestID: h.req.ID, Worker: id, HasWorker: true})
	}
	return nil
}

// enter places a classified request, or queues it when every candidate
// is at capacity; on any other failure the request ends.
func (h *Handle) enter(ctx context.Context) error {
	c := h.c
	if h.req.SLO.Has() {
		h.setWaited(c.now())
	}
	d, err := c.core.Place(ctx, h.req, c.placement(h))
	switch {
	case err == nil:
		h.mu.Lock()
		h.state, h.decision = stateDispatched, d
		if d.Learn {
			h.sentAt = c.now()
		}
		if c.obs != nil {
			c.obs.Booked(h.req, d)
		}
		c.bus.emit(shared.Event{Kind: shared.EventSent, RequestID: h.req.ID, Worker: d.Worker.ID, HasWorker: true})
		h.mu.Unlock()
		return nil
	case errors.Is(err, shared.ErrAllBusy):
		h.mu.Lock()
		h.state, h.ready = stateQueued, make(chan struct{})
		h.mu.Unlock()
		if err := c.push(h); err != nil {
			h.fail(err)
			return err // the same for every request: the caller knows which it admitted
		}
		if c.onQueued != nil {
			c.onQueued()
		}
		return nil
	default:
		h.fail(err)
		return err
	}
}

// fail ends a request that could not be placed or queued.
func (h *Handle) fail(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state == stateEnded {
		return
	}
	if h.ready != nil {
		close(h.ready)
	}
	h.state, h.err = stateEnded, err
	h.c.live.remove(h.req.ID, h)
	h.c.bus.emit(shared.Event{Kind: shared.EventAborted, RequestID: h.req.ID, Reason: err.Error()})
}

// dispatched hands a queued request the placement a Dispatch made at now;
// false when it ended meanwhile (its booking is released then).
func (h *Handle) dispatched(d router.Decision, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != stateQueued {
		d.Booking.Release()
		return false
	}
	h.state, h.decision, h.waited = stateDispatched, d, now.Sub(h.arrival)
	h.sentAt = now
	if h.c.obs != nil {
		h.c.obs.Booked(h.req, d)
	}
	h.c.bus.emit(shared.Event{Kind: shared.EventSent, RequestID: h.req.ID, Worker: d.Worker.ID, HasWorker: true, At: now})
	close(h.ready)
	return true
}

// refuse ends a queued request without a worker at now, for err; false
// when it ended meanwhile.
func (h *Handle) refuse(err error, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != stateQueued {
		return false
	}
	h.state, h.err, h.waited = stateEnded, err, now.Sub(h.arrival)
	h.c.live.remove(h.req.ID, h)
	h.c.bus.emit(shared.Event{Kind: shared.EventAborted, RequestID: h.req.ID, Reason: err.Error(), At: now})
	close(h.ready)
	return true
}

// learnEnd teaches the predictor the request's completed answer of
// contextTokens (prompt plus generated): its output length and, with a
// timed first token (not Untimed) and at least two generated tokens, its
// mean gap between tokens after the first. h.mu is held.
func (h *Handle) learnEnd(contextTokens int64) {
	out := contextTokens - int64(h.req.PromptTokens)
	var gap time.Duration
	if h.first && out >= 2 && !h.untimed {
		gap = h.c.now().Sub(h.firstAt) / time.Duration(out-1)
	}
	h.c.core.ObserveEnd(&h.decision, out, gap)
}
