package softpin

import (
	"container/list"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-router/switchyard/shared"
)

// TypeStickySession is the type name of the StickySession classifier.
const TypeStickySession = "sticky-session"

// Parameter names of the sticky-session classifier (max_sessions is
// ParamMaxSessions, shared with soft-pin).
const ParamTTL = "ttl"

// DefaultStickyTTL is the default idle time after which a session's
// binding expires.
const DefaultStickyTTL = 10 * time.Minute

// maxPending bounds the live requests a partition remembers (request id ->
// session) between their classification and their end.
const maxPending = 1 << 16

// StickySessionType returns the descriptor of the sticky-session
// classifier.
func StickySessionType() shared.TypeInfo {
	return shared.TypeInfo{
		Name: TypeStickySession,
		Kind: shared.KindClassifier,
		Params: []shared.ParamSpec{
			{Name: ParamTTL, Type: shared.Duration, Default: DefaultStickyTTL,
				Doc: "idle time after which a session's binding expires (no request, send or completion of the session); > 0"},
			{Name: ParamMaxSessions, Type: shared.Int, Default: int64(DefaultMaxSessions),
				Doc: "most sessions bound per partition; binding one more forgets the least recently used; >= 1"},
		},
		// The per-partition classifiers listen; the factory does not.
		Events: true,
		Doc: "Request classifier: sets a session's requests' advisory target to the worker its last " +
			"request was sent to, learned from lifecycle events; bindings expire after ttl idle, at most " +
			"max_sessions are kept (LRU), and a worker no longer in the partition drops its binding.",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewStickySession(p) },
	}
}

// StickySession is the sticky-session classifier factory: one
// StickyPartition per router partition.
type StickySession struct {
	ttl         time.Duration
	maxSessions int
}

// NewStickySession validates the parameters.
func NewStickySession(p shared.Params) (*StickySession, error) {
	s := &StickySession{ttl: p.Duration(ParamTTL, DefaultStickyTTL)}
	if s.ttl <= 0 {
		return nil, &shared.ParamError{Param: ParamTTL, Err: fmt.Errorf("must be > 0, got %v", s.ttl)}
	}
	n := p.Int(ParamMaxSessions, DefaultMaxSessions)
	if n < 1 || n > 1<<30 {
		return nil, &shared.ParamError{Param: ParamMaxSessions, Err: fmt.Errorf("must be in [1, %d], got %d", 1<<30, n)}
	}
	s.maxSessions = int(n)
	return s, nil
}

// Inputs: a classifier reads no candidate column.
func (*StickySession) Inputs() shared.Inputs { return 0 }

// NewClassifier returns the partition's classifier.
func (s *StickySession) NewClassifier(pc shared.PartitionContext) (shared.Classifier, error) {
	now := pc.Now
	if now == nil {
		now = time.Now
	}
	return &StickyPartition{ttl: s.ttl, max: s.maxSessions, now: now, workers: pc.Workers,
		bindings: map[string]*list.Element{}, pending: map[string]string{}}, nil
}

// binding is one session's entry in the LRU list.
type binding struct {
	session string
	worker  shared.WorkerID
	last    time.Time
}

// StickyPartition is the sticky-session classifier of one partition.
//
// Classify remembers a request's session (bounded: at most maxPending live
// requests) and, when the session is bound to a worker that is still in
// the partition and was used within ttl, sets that worker as the advisory
// Target. OnEvents binds the session to the worker of a sent event and
// refreshes it on completed; completed and aborted forget the request.
// Times are the router's clock (PartitionContext.Now, events' At), so a
// replay repeats exactly.
type StickyPartition struct {
	ttl     time.Duration
	max     int
	now     func() time.Time
	workers func() []shared.WorkerInfo

	mu       sync.Mutex
	bindings map[string]*list.Element // value *binding
	lru      list.List                // front: most recently used
	pending  map[string]string        // live request id -> session
}

// Classify sets the advisory target of a request of a bound session.
func (p *StickyPartition) Classify(_ context.Context, req *shared.Request) (shared.Classification, error) {
	if req == nil || req.SessionID == "" {
		return shared.Classification{}, nil
	}
	now := p.now()
	var ws []shared.WorkerInfo
	if p.workers != nil {
		ws = p.workers()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.pending[req.ID]; ok || len(p.pending) < maxPending {
		p.pending[strings.Clone(req.ID)] = strings.Clone(req.SessionID)
	}
	e, ok := p.bindings[req.SessionID]
	if !ok {
		return shared.Classification{}, nil
	}
	b := e.Value.(*binding)
	if now.Sub(b.last) > p.ttl || (len(ws) > 0 && !hasWorker(ws, b.worker)) {
		p.lru.Remove(e)
		delete(p.bindings, b.session)
		return shared.Classification{}, nil
	}
	b.last = now
	p.lru.MoveToFront(e)
	return shared.Classification{Target: b.worker, HasTarget: true}, nil
}

// OnEvents learns bindings from the lifecycle of the requests it
// classified; it ignores the others.
func (p *StickyPartition) OnEvents(events []shared.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range events {
		ev := &events[i]
		session, ok := p.pending[ev.RequestID]
		if !ok {
			continue
		}
		at := ev.At
		if at.IsZero() {
			at = p.now()
		}
		switch ev.Kind {
		case shared.EventSent:
			if ev.HasWorker {
				p.bind(session, ev.Worker, at)
			}
		case shared.EventCompleted:
			if e, ok := p.bindings[session]; ok && ev.HasWorker && e.Value.(*binding).worker == ev.Worker {
				e.Value.(*binding).last = at
				p.lru.MoveToFront(e)
			}
			delete(p.pending, ev.RequestID)
		case shared.EventAborted:
			delete(p.pending, ev.RequestID)
		}
	}
}

// Sessions returns the number of bound sessions.
func (p *StickyPartition) Sessions() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.bindings)
}

// bind binds session to worker, evicting the least recently used binding
// when max are bound.
func (p *StickyPartition) bind(session string, worker shared.WorkerID, at time.Time) {
	if e, ok := p.bindings[session]; ok {
		b := e.Value.(*binding)
		b.worker, b.last = worker, at
		p.lru.MoveToFront(e)
		return
	}
	if len(p.bindings) >= p.max {
		old := p.lru.Back()
		p.lru.Remove(old)
		delete(p.bindings, old.Value.(*binding).session)
	}
	p.bindings[session] = p.lru.PushFront(&binding{session: session, worker: worker, last: at})
}

// hasWorker reports whether ws (ascending by ID) holds id.
func hasWorker(ws []shared.WorkerInfo, id shared.WorkerID) bool {
	for _, w := range ws {
		if w.ID == id {
			return true
		}
	}
	return false
}

// Interface guards.
var (
	_ shared.ClassifierFactory = (*StickySession)(nil)
	_ shared.EventListener     = (*StickyPartition)(nil)
)
