package builtin

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-router/switchyard/internal/ilist"
	"github.com/switchyard-router/switchyard/shared"
)

// TypeSessionAffinity is the type name of the SessionAffinity classifier.
const TypeSessionAffinity = "session-affinity"

// Parameter names of the session-affinity classifier.
const (
	ParamTTL         = "ttl"
	ParamMaxSessions = "max_sessions"
)

// Defaults of the session-affinity classifier.
const (
	// DefaultSessionTTL is how long a session's binding survives without a
	// request. Ten minutes covers the think time between the turns of an
	// interactive conversation or an agent loop (seconds to a few minutes)
	// with room to spare, while on a busy engine the session's prefix has
	// usually been evicted from the KV cache long before then: a binding
	// older than that would only constrain load balancing for no cache hit.
	DefaultSessionTTL = 10 * time.Minute
	// DefaultMaxSessions bounds the bindings one partition keeps (about
	// 125 bytes plus the session id each: some 13 MB at the default with
	// 20-byte ids).
	DefaultMaxSessions = 100_000
)

// SessionAffinity sends the turns of a session back to the worker that
// served the session last, whose KV cache most likely still holds the
// conversation's prefix. For a request with a SessionID it sets the
// advisory Target to that worker; a request without a session, or with a
// session not seen (or expired), gets no target. The router still decides:
// an explicit pin wins and a target that is not a candidate is ignored.
//
// It learns bindings from lifecycle events, so each per-partition
// classifier implements shared.EventListener: EventSent with a worker binds
// the request's session to that worker (the last send wins), and
// EventCompleted on the bound worker refreshes the binding, each at the
// event's time (Event.At, the router's clock). A binding expires after ttl
// without a request, send or completion of its session;
// at most max_sessions are kept, the least recently used evicted first; and
// a binding to a worker no longer in the partition (PartitionContext.Workers
// at classify time) is dropped.
//
// Router replicas of a cluster share the bindings
// (PartitionContext.Sessions, docs/replicas.md): each send is shared, and
// a session's binding shared later than its local binding was last used
// (or one this replica does not have, or whose own has expired) is
// adopted, so a conversation whose turns a load balancer spreads over the
// replicas keeps its worker. A shared binding older than ttl is ignored.
type SessionAffinity struct {
	ttl         time.Duration
	maxSessions int
	// now overrides the clock in tests; nil: the partition's clock
	// (PartitionContext.Now), else time.Now.
	now func() time.Time
}

// SessionAffinityType describes the session-affinity classifier.
func SessionAffinityType() shared.TypeInfo {
	return shared.TypeInfo{
		Name: TypeSessionAffinity,
		Kind: shared.KindClassifier,
		Params: []shared.ParamSpec{
			{Name: ParamTTL, Type: shared.Duration, Default: DefaultSessionTTL,
				Doc: "Idle time after which a session's binding expires: no request, send or completion of the " +
					"session for this long. > 0. Default \"10m\": longer than the think time between turns, while " +
					"an idle prefix is usually evicted from a busy engine's KV cache well before that."},
			{Name: ParamMaxSessions, Type: shared.Int, Default: int64(DefaultMaxSessions),
				Doc: "Most sessions bound at once per partition (model and role); the least recently used is " +
					"evicted to make room. In [1, 2^30]. Default 100000 (about 13 MB with 20-byte session ids)."},
		},
		// The per-partition classifiers listen, the factory does not: served
		// out of process, the host forwards events only with this flag.
		Events: true,
		Doc: "Sets a session's requests' advisory target to the worker that served the session last, learned " +
			"from lifecycle events; bindings expire after ttl idle, at most max_sessions are kept (LRU), and a " +
			"removed worker's bindings are dropped.",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewSessionAffinity(p) },
	}
}

// NewSessionAffinity returns a session-affinity classifier factory from p.
// It fails with a *shared.ParamError when ttl <= 0 or max_sessions < 1.
func NewSessionAffinity(p shared.Params) (*SessionAffinity, error) {
	s := &SessionAffinity{
		ttl: p.Duration(ParamTTL, DefaultSessionTTL),
	}
	if s.ttl <= 0 {
		return nil, &shared.ParamError{Param: ParamTTL, Err: fmt.Errorf("must be > 0, got %v", s.ttl)}
	}
	maxSessions := p.Int(ParamMaxSessions, DefaultMaxSessions)
	if maxSessions < 1 || maxSessions > 1<<30 {
		return nil, &shared.ParamError{Param: ParamMaxSessions,
			Err: fmt.Errorf("must be in [1, %d], got %d", 1<<30, maxSessions)}
	}
	s.maxSessions = int(maxSessions)
	return s, nil
}

// Inputs returns 0: the classifier reads the request and its own bindings.
func (*SessionAffinity) Inputs() shared.Inputs { return 0 }

// NewClassifier returns the classifier of one partition, with its own
// bindings. The result implements shared.EventListener.
func (s *SessionAffinity) NewClassifier(pc shared.PartitionContext) (shared.Classifier, error) {
	now := s.now
	if now == nil {
		now = pc.Now
	}
	if now == nil {
		now = time.Now
	}
	return &affinityPartition{
		ttl:     s.ttl,
		max:     s.maxSessions,
		now:     now,
		workers: pc.Workers,
		shared:  pc.Sessions,
		index:   make(map[string]int32),
		pending: make(map[string]pendingSession),
		maxLive: max(s.maxSessions, minPendingCap),
	}, nil
}

// minPendingCap is the least number of live requests with a session a
// partition remembers, whatever max_sessions is.
const minPendingCap = 1 << 16

// affinityPartition is one partition's session-affinity classifier: the
// session bindings in a slice ordered by an index-linked LRU list (no allocation
// per hit or per rebinding), and the sessions of the live requests it
// classified, so that events, which carry only request ids, can be tied to
// sessions. One mutex guards both; events for a whole batch take it once.
type affinityPartition struct {
	ttl     time.Duration
	max     int
	now     func() time.Time
	workers func() []shared.WorkerInfo // nil: membership unknown, bindings kept
	shared  shared.SessionStore        // nil: bindings not shared

	mu    sync.Mutex
	index map[string]int32 // session id -> slot
	slots []binding
	free  []int32    // unused slots
	lru   ilist.List // the slots in use, most recently used first
	// pending maps a live request id to its session, from Classify to the
	// request's completed or aborted event. It holds at most maxLive
	// entries; when full, entries older than ttl (requests whose end was
	// never reported) are swept, at most once per ttl/4, and a request that
	// still finds no room teaches no binding.
	pending  map[string]pendingSession
	maxLive  int
	nextScan time.Time
}

// binding is one session's worker, in the LRU list.
type binding struct {
	session string
	worker  shared.WorkerID
	last    time.Time // last request, send or completion
}

// pendingSession is the session of one live request.
type pendingSession struct {
	session string
	at      time.Time
}

// Classify sets req's target to its session's worker when the session is
// bound, the binding has not expired and the worker is still in the
// partition; it drops an expired or stale binding. With shared bindings,
// a shared binding made after the local one was last used (or when there
// is no live local one) is adopted first. Requests with a session are
// remembered until their completed or aborted event. It never fails and
// does not allocate on a hit.
func (p *affinityPartition) Classify(_ context.Context, req *shared.Request) (shared.Classification, error) {
	if req == nil || req.SessionID == "" {
		return shared.Classification{}, nil
	}
	now := p.now()
	var ws []shared.WorkerInfo
	if p.workers != nil {
		ws = p.workers()
	}
	var sw shared.WorkerID
	var sat time.Time
	var sok bool
	if p.shared != nil {
		sw, sat, sok = p.shared.Binding(req.SessionID)
		sok = sok && now.Sub(sat) <= p.ttl && (p.workers == nil || hasWorker(ws, sw))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.remember(req.ID, req.SessionID, now)
	i, ok := p.index[req.SessionID]
	if ok {
		if b := &p.slots[i]; now.Sub(b.last) > p.ttl || (p.workers != nil && !hasWorker(ws, b.worker)) {
			p.remove(i)
			ok = false
		}
	}
	if sok && (!ok || sat.After(p.slots[i].last)) {
		// Another replica sent the session later (the last send wins).
		p.bind(req.SessionID, sw, sat)
		i, ok = p.index[req.SessionID], true
	}
	if !ok {
		return shared.Classification{}, nil
	}
	p.touch(i, now)
	return shared.Classification{Target: p.slots[i].worker, HasTarget: true}, nil
}

// OnEvents binds sessions on EventSent, refreshes them on EventCompleted at
// the bound worker, and forgets a request when it ends. It dates bindings
// by the events' time (Event.At; the partition's clock for an event
// without one), not by their delivery, which lags: serve delivers from a
// goroutine of its own, and a plugin may hear an event only after it has
// seen a later request's clock. So a binding expires at the same moment in
// process and out of process, and in replay at the same simulated time on
// every run. Events of requests it did not classify (or without a session)
// are ignored.
func (p *affinityPartition) OnEvents(events []shared.Event) {
	if len(events) == 0 {
		return
	}
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range events {
		ev := &events[i]
		ps, ok := p.pending[ev.RequestID]
		if !ok {
			continue
		}
		at := ev.At
		if at.IsZero() {
			at = now
		}
		switch ev.Kind {
		case shared.EventSent:
			if ev.HasWorker {
				p.bind(ps.session, ev.Worker, at)
				if p.shared != nil {
					p.shared.Bind(ps.session, ev.Worker, at) // never blocks
				}
			}
		case shared.EventCompleted:
			if j, ok := p.index[ps.session]; ok && ev.HasWorker && p.slots[j].worker == ev.Worker {
				p.touch(j, at)
			}
			delete(p.pending, ev.RequestID)
		case shared.EventAborted:
			delete(p.pending, ev.RequestID)
		}
	}
}

// remember records the session of live request id. Called with mu held.
func (p *affinityPartition) remember(id, session string, now time.Time) {
	if _, ok := p.pending[id]; !ok && len(p.pending) >= p.maxLive {
		if now.Before(p.nextScan) {
			return // full of live requests: this one teaches nothing
		}
		p.nextScan = now.Add(p.ttl / 4)
		for k, v := range p.pending {
			if now.Sub(v.at) > p.ttl {
				delete(p.pending, k)
			}
		}
		if len(p.pending) >= p.maxLive {
			return
		}
	}
	p.pending[id] = pendingSession{session: session, at: now}
}

// bind points session at worker, as most recently used as of at. Called
// with mu held.
func (p *affinityPartition) bind(session string, worker shared.WorkerID, at time.Time) {
	if i, ok := p.index[session]; ok {
		p.slots[i].worker = worker
		p.touch(i, at)
		return
	}
	// Reclaim a few expired bindings from the cold end, then make room.
	for k := 0; k < 2 && !p.lru.Empty() && at.Sub(p.slots[p.lru.Back()].last) > p.ttl; k++ {
		p.remove(p.lru.Back())
	}
	if len(p.index) >= p.max {
		p.remove(p.lru.Back())
	}
	var i int32
	if n := len(p.free); n > 0 {
		i, p.free = p.free[n-1], p.free[:n-1]
	} else {
		p.slots = append(p.slots, binding{})
		i = int32(len(p.slots) - 1)
	}
	session = strings.Clone(session) // do not retain the request's buffers
	p.slots[i] = binding{session: session, worker: worker, last: at}
	p.index[session] = i
	p.lru.PushFront(i)
}

// touch makes binding i the most recently used, as of at unless it was
// used later (events may arrive after a later request of the session was
// classified). Called with mu held.
func (p *affinityPartition) touch(i int32, at time.Time) {
	if at.After(p.slots[i].last) {
		p.slots[i].last = at
	}
	p.lru.MoveToFront(i)
}

// remove drops binding i. Called with mu held.
func (p *affinityPartition) remove(i int32) {
	p.lru.Remove(i)
	delete(p.index, p.slots[i].session)
	p.slots[i] = binding{}
	p.free = append(p.free, i)
}

// hasWorker reports whether id is in ws: a binary search, as the router
// gives workers in ascending order, then a linear scan in case it did not.
func hasWorker(ws []shared.WorkerInfo, id shared.WorkerID) bool {
	j, _ := slices.BinarySearchFunc(ws, id, func(w shared.WorkerInfo, id shared.WorkerID) int {
		switch {
		case w.ID < id:
			return -1
		case w.ID > id:
			return 1
		}
		return 0
	})
	if j < len(ws) && ws[j].ID == id {
		return true
	}
	for k := range ws {
		if ws[k].ID == id {
			return true
		}
	}
	return false
}

// sessions returns the number of bindings (for tests).
func (p *affinityPartition) sessions() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.index)
}

// Interface guards.
var (
	_ shared.ClassifierFactory = (*SessionAffinity)(nil)
	_ shared.Classifier        = (*affinityPartition)(nil)
	_ shared.EventListener     = (*affinityPartition)(nil)
)
