package builtin

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/switchyard-router/switchyard/hosted"
	"github.com/switchyard-router/switchyard/shared"
)

// TypeRoundRobin is the type name of the RoundRobin picker.
const TypeRoundRobin = "round-robin"

// maxRoundRobinSets bounds the cursors one RoundRobin keeps. Each membership
// change makes a new candidate set; when the table is full it is cleared, so
// memory stays bounded and the sets in use start again from row 0.
const maxRoundRobinSets = 1024

// RoundRobin picks candidates in turn: row cursor % n, then cursor++, with
// one atomic cursor per instance and candidate set, so two models or roles
// (or one set before and after a worker leaves) never share a cursor and
// each set is served exactly evenly. The first pick of a set is row 0.
//
// The cursor of the most recently used set is cached in an atomic pointer:
// the common case is one atomic load and one atomic add. Other sets are
// found in a lock-guarded map.
type RoundRobin struct {
	last atomic.Pointer[rrCursor]

	mu   sync.RWMutex
	sets map[uint64]*rrCursor
}

// rrCursor is the cursor of one candidate set.
type rrCursor struct {
	key  uint64
	next atomic.Uint64
}

// RoundRobinType describes the round-robin picker.
func RoundRobinType() shared.TypeInfo {
	return shared.TypeInfo{
		Name:   TypeRoundRobin,
		Kind:   shared.KindPicker,
		Inputs: 0,
		Doc: "Picks the candidates of each candidate set in turn (row cursor % n, cursor++), with " +
			"one cursor per instance and set. Reads no input, so a picker-only policy runs on the hosted path.",
		New: func(shared.InstanceInfo, shared.Params) (shared.Component, error) { return NewRoundRobin(), nil },
	}
}

// NewRoundRobin returns a round-robin picker with no cursor yet.
func NewRoundRobin() *RoundRobin { return &RoundRobin{sets: make(map[uint64]*rrCursor)} }

// Inputs returns 0: round-robin reads nothing but the ids.
func (*RoundRobin) Inputs() shared.Inputs { return 0 }

// Pick returns the next row of c's candidate set, keyed by the request's
// model and role and c's ids (and data-parallel ranks). It fails with
// shared.ErrNoWorkers when c is empty.
func (r *RoundRobin) Pick(_ context.Context, req *shared.Request, c *shared.Candidates) (int, error) {
	n := c.Len()
	if n == 0 {
		return -1, shared.ErrNoWorkers
	}
	var model string
	var role shared.Role
	if req != nil {
		model, role = req.Model, req.Role
	}
	key := hosted.CandidateSetKey(model, role, c.IDs)
	for _, rank := range c.DPRanks {
		key = key*golden + uint64(rank) + 1
	}
	if key == 0 {
		key = 1
	}
	return r.pick(key, n), nil
}

// PickHosted returns the next row of the view's candidate set, keyed by
// v.SetKey(). It fails with shared.ErrNoWorkers when v is empty.
func (r *RoundRobin) PickHosted(v *hosted.WorkerInputView) (int, error) {
	n := v.Len()
	if n == 0 {
		return -1, shared.ErrNoWorkers
	}
	return r.pick(v.SetKey(), n), nil
}

// pick advances the cursor of set key and returns its old value mod n.
func (r *RoundRobin) pick(key uint64, n int) int {
	c := r.last.Load()
	if c == nil || c.key != key {
		c = r.cursor(key)
	}
	return int((c.next.Add(1) - 1) % uint64(n))
}

// cursor finds or makes the cursor of set key and caches it as the last one.
func (r *RoundRobin) cursor(key uint64) *rrCursor {
	r.mu.RLock()
	c, ok := r.sets[key]
	r.mu.RUnlock()
	if !ok {
		r.mu.Lock()
		if c, ok = r.sets[key]; !ok {
			if len(r.sets) >= maxRoundRobinSets {
				clear(r.sets)
			}
			c = &rrCursor{key: key}
			r.sets[key] = c
		}
		r.mu.Unlock()
	}
	r.last.Store(c)
	return c
}

// Interface guards.
var (
	_ shared.Picker             = (*RoundRobin)(nil)
	_ hosted.HostedWorkerPicker = (*RoundRobin)(nil)
)
