package live

import (
	"container/list"
	"sync"
	"time"

	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/shared"
)

// Bounds of the response bindings (Runtime.BindResponse).
const (
	// DefaultMaxResponses bounds the response bindings a router keeps
	// (2^17, about 20 MB with vLLM's 41-byte "resp_" ids): past it the
	// least recently bound or used is forgotten, and a follow-up to it is
	// answered as one to an unknown id.
	DefaultMaxResponses = 1 << 17
	// DefaultResponseTTL is how long a response binding is kept after it
	// was made or last used (24 h): vLLM keeps a stored response in its
	// engine's memory until the engine restarts
	// (vllm/entrypoints/openai/serving_responses.py, response_store, "we
	// never remove responses from the store"), so the router's TTL, not
	// the engine's, is the bound; a day covers an agent's working session.
	DefaultResponseTTL = 24 * time.Hour
	// MaxResponseIDBytes bounds a response id the router binds or looks
	// up: vLLM's are "resp_" and 32 hex digits; a longer one is neither
	// bound nor found.
	MaxResponseIDBytes = 256
)

// responseNamespace prefixes a response id in the cluster's shared
// session store (Options.Sessions), so that response ids never mix with
// the X-Session-Id bindings of the same partition: a header value cannot
// carry a NUL byte.
const responseNamespace = "\x00response:"

// responseBindings maps a response id to the model and worker that
// answered it: bounded (DefaultMaxResponses, least recently used out
// first) and expiring (DefaultResponseTTL after its last use). Safe for
// concurrent use; no call blocks under its lock.
type responseBindings struct {
	mu    sync.Mutex
	byID  map[string]*list.Element // of *responseBinding
	order *list.List               // most recently used first
	max   int
	ttl   time.Duration
	now   func() time.Time
}

// responseBinding is one response id's binding.
type responseBinding struct {
	id, model string
	worker    shared.WorkerID
	name      string // the worker's name when bound
	at        time.Time
}

func newResponseBindings(max int, ttl time.Duration) *responseBindings {
	return &responseBindings{byID: map[string]*list.Element{}, order: list.New(), max: max, ttl: ttl, now: time.Now}
}

// put binds id to (model, w), replacing an older binding of id.
func (b *responseBindings) put(id, model string, w *fleet.Worker) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if e, ok := b.byID[id]; ok {
		rb := e.Value.(*responseBinding)
		rb.model, rb.worker, rb.name, rb.at = model, w.ID, w.Name, now
		b.order.MoveToFront(e)
		return
	}
	b.byID[id] = b.order.PushFront(&responseBinding{id: id, model: model, worker: w.ID, name: w.Name, at: now})
	for b.order.Len() > b.max {
		b.removeLocked(b.order.Back())
	}
}

// get returns id's binding, refreshed; false when none is kept or it
// expired (then it is forgotten).
func (b *responseBindings) get(id string) (responseBinding, bool) { return b.lookup(id, true) }

// peek returns id's binding when kept and not expired, without
// refreshing it.
func (b *responseBindings) peek(id string) (responseBinding, bool) { return b.lookup(id, false) }

// lookup returns id's binding when kept and not expired (an expired one
// is forgotten); with refresh, its time is now and it is the most
// recently used.
func (b *responseBindings) lookup(id string, refresh bool) (responseBinding, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.byID[id]
	if !ok {
		return responseBinding{}, false
	}
	rb := e.Value.(*responseBinding)
	now := b.now()
	if now.Sub(rb.at) > b.ttl {
		b.removeLocked(e)
		return responseBinding{}, false
	}
	if refresh {
		rb.at = now
		b.order.MoveToFront(e)
	}
	return *rb, true
}

func (b *responseBindings) removeLocked(e *list.Element) {
	delete(b.byID, e.Value.(*responseBinding).id)
	b.order.Remove(e)
}

// len returns the bindings kept (expired ones included until looked up
// or pushed out).
func (b *responseBindings) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.order.Len()
}

// BindResponse records that the response id, of a request for model, was
// answered and is stored by worker w's engine: a Responses follow-up
// naming it (previous_response_id) and GET /v1/responses/{id} go there
// (ResponseWorker). The binding is kept DefaultResponseTTL after its
// last use, at most DefaultMaxResponses of them; with a cluster
// (Options.Sessions) it is shared with the other replicas through the
// session store of the partition of model and w's role (aggregated, or a
// disaggregated model's decode), under a namespace of its own. An empty id, or one over MaxResponseIDBytes, is not bound. It
// never blocks (the shared store queues its writes).
func (rt *Runtime) BindResponse(model, id string, w *fleet.Worker) {
	if id == "" || len(id) > MaxResponseIDBytes || w == nil {
		return
	}
	rt.responses.put(id, model, w)
	if rt.sessions != nil {
		// In the partition of the worker's role: a disaggregated
		// model's answers come from its decode workers.
		if st := rt.sessions(model, w.Role); st != nil {
			st.Bind(responseNamespace+id, w.ID, time.Now())
		}
	}
}

// answeringRoles are the roles of the workers that answer a Responses
// request, and so store its response: aggregated workers, and a
// disaggregated model's decode workers (its prefill workers' one-token
// answers are not the client's).
var answeringRoles = [...]shared.Role{shared.RoleAggregated, shared.RoleDecode}

// ResponseWorker returns the worker whose engine holds response id and
// the model it was made for: this router's binding (BindResponse), else,
// with a cluster, another replica's (looked up under model, or, when
// model is "", under each model the fleet serves); this router's binding
// wins whatever model the follow-up names, as the engine finds a stored
// response by its id alone. The worker is the
// current member of the model's aggregated partition, or of its decode
// partition (a disaggregated model's answers come from its decode
// workers), with the bound worker's id and name (its lowest rank). false when the id is unknown,
// its binding expired, or its worker is no longer a member: the engine
// that held it is gone.
func (rt *Runtime) ResponseWorker(model, id string) (*fleet.Worker, string, bool) {
	if id == "" || len(id) > MaxResponseIDBytes {
		return nil, "", false
	}
	if rb, ok := rt.responses.get(id); ok {
		for _, role := range answeringRoles {
			for _, w := range rt.r.Workers(rb.model, role) {
				if w.ID == rb.worker && w.Name == rb.name {
					return w, rb.model, true
				}
			}
		}
		return nil, "", false
	}
	if rt.sessions == nil {
		return nil, "", false
	}
	models := []string{model}
	if model == "" {
		models = rt.r.Models()
	}
	for _, m := range models {
		for _, role := range answeringRoles {
			st := rt.sessions(m, role)
			if st == nil {
				continue
			}
			wid, _, ok := st.Binding(responseNamespace + id)
			if !ok {
				continue
			}
			for _, w := range rt.r.Workers(m, role) {
				if w.ID == wid {
					return w, m, true
				}
			}
		}
	}
	return nil, "", false
}
