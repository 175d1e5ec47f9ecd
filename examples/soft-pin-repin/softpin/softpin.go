// Package softpin holds the component type of the soft-pin-repin example
// plugin: soft-pin, a picker that keeps each session on one worker while
// that worker is not overloaded and re-pins the session elsewhere when it
// is. It imports only the SDK (shared) and the standard library; main.go in
// the parent directory serves Types() with shared.Serve. README.md
// documents the rule, inputs and parameters.
package softpin

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/switchyard-router/switchyard/shared"
)

// TypeSoftPin is the type name of the SoftPin picker.
const TypeSoftPin = "soft-pin"

// Parameter names of the soft-pin picker.
const (
	ParamMaxActiveRequests = "max_active_requests"
	ParamMaxSessions       = "max_sessions"
)

// DefaultMaxSessions is the default bound on remembered session pins.
const DefaultMaxSessions = 100_000

// ErrMissingColumn: the ACTIVE_REQUESTS column (or DPRanks, when present)
// does not have one entry per candidate.
var ErrMissingColumn = errors.New("declared input column missing")

// Types returns the descriptors of every type this plugin serves.
func Types() []shared.TypeInfo { return []shared.TypeInfo{SoftPinType(), StickySessionType()} }

// worker is one candidate's identity: (WorkerID, DPRank).
type worker struct {
	id   shared.WorkerID
	rank uint32
}

// pin is one session's entry in the LRU list.
type pin struct {
	session string
	w       worker
}

// SoftPin picks for a request with a session (Request.SessionID):
//
//   - the session's pinned worker, when it is among the candidates and has
//     at most max_active_requests requests in flight (ACTIVE_REQUESTS,
//     inclusive);
//   - otherwise, when the pinned worker is a candidate but over the limit,
//     the least-loaded other candidate, and the session is re-pinned there
//     (a single candidate is kept even when over the limit: there is no
//     other);
//   - when the session has no pin or its pinned worker is not a candidate
//     (gone, or filtered out), the least-loaded candidate, and the session
//     is pinned there.
//
// A request without a session goes to the least-loaded candidate and pins
// nothing. Least loaded means the fewest ACTIVE_REQUESTS, ties to the lowest
// (WorkerID, DPRank), so the pick does not depend on row order and has no
// randomness.
//
// Pins live in the instance, behind a mutex, in a map bounded by
// max_sessions with least-recently-used eviction: every pick for a session
// refreshes its pin, and pinning a new session when the map is full forgets
// the session that has gone longest without a request. One scan of the
// candidates runs outside the lock; the lock covers a map lookup, at most
// one candidate scan for the pinned worker, and the pin update.
type SoftPin struct {
	maxActive   int64
	maxSessions int

	mu   sync.Mutex
	pins map[string]*list.Element // value *pin
	lru  list.List                // front: most recently used
}

// SoftPinType describes the soft-pin picker.
func SoftPinType() shared.TypeInfo {
	return shared.TypeInfo{
		Name:   TypeSoftPin,
		Kind:   shared.KindPicker,
		Inputs: shared.InputActiveRequests,
		Params: []shared.ParamSpec{
			{Name: ParamMaxActiveRequests, Type: shared.Int, Required: true,
				Doc: "A session stays on its pinned worker while that worker has at most this many " +
					"requests in flight (ACTIVE_REQUESTS, inclusive); above it the session moves to the " +
					"least-loaded other worker and is re-pinned there. Requests, >= 0; required, no " +
					"default. 0 keeps a session only on an idle worker."},
			{Name: ParamMaxSessions, Type: shared.Int, Default: int64(DefaultMaxSessions),
				Doc: "Most session pins the instance remembers; pinning one more forgets the least " +
					"recently used session, which is then placed like a new one. Sessions, >= 1; " +
					"default 100000 (a few tens of bytes plus the session id per pin)."},
		},
		Doc: "Session soft pin: a request with a session goes to the session's pinned worker while it has " +
			"at most max_active_requests in flight, else to the least-loaded other worker, which becomes " +
			"the pin. No session or a gone pinned worker: least loaded. Ties go to the lowest worker id.",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewSoftPin(p) },
	}
}

// NewSoftPin returns a soft-pin picker from p. It fails with a
// *shared.ParamError when max_active_requests is absent or negative, or
// when max_sessions is below 1.
func NewSoftPin(p shared.Params) (*SoftPin, error) {
	if !p.Has(ParamMaxActiveRequests) {
		return nil, &shared.ParamError{Param: ParamMaxActiveRequests,
			Err: errors.New("required: the in-flight requests a pinned worker may have, an integer >= 0")}
	}
	s := &SoftPin{
		maxActive: p.Int(ParamMaxActiveRequests, 0),
		pins:      make(map[string]*list.Element),
	}
	if s.maxActive < 0 {
		return nil, &shared.ParamError{Param: ParamMaxActiveRequests,
			Err: fmt.Errorf("must be >= 0, got %d", s.maxActive)}
	}
	ms := p.Int(ParamMaxSessions, DefaultMaxSessions)
	if ms < 1 || ms > 1<<40 {
		return nil, &shared.ParamError{Param: ParamMaxSessions,
			Err: fmt.Errorf("must be between 1 and %d, got %d", int64(1)<<40, ms)}
	}
	s.maxSessions = int(ms)
	return s, nil
}

// Inputs returns ACTIVE_REQUESTS.
func (*SoftPin) Inputs() shared.Inputs { return shared.InputActiveRequests }

// Pick returns the row chosen by the rule on SoftPin and updates the
// session's pin. It fails with shared.ErrNoWorkers when c is empty and with
// ErrMissingColumn when the ACTIVE_REQUESTS column is missing.
func (s *SoftPin) Pick(_ context.Context, req *shared.Request, c *shared.Candidates) (int, error) {
	n := c.Len()
	if n == 0 {
		return -1, shared.ErrNoWorkers
	}
	if len(c.ActiveRequests) != n || (c.DPRanks != nil && len(c.DPRanks) != n) {
		return -1, fmt.Errorf("%s: %w: need ACTIVE_REQUESTS (and DPRanks, when set) of %d rows", TypeSoftPin, ErrMissingColumn, n)
	}
	best, second := leastLoaded(c)
	if req == nil || req.SessionID == "" {
		return best, nil
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	choice := best
	if e, ok := s.pins[req.SessionID]; ok {
		if row := find(c, e.Value.(*pin).w); row >= 0 {
			switch {
			case c.ActiveRequests[row] <= s.maxActive:
				choice = row // stay
			case row != best:
				choice = best // move to the least-loaded other worker
			case second >= 0:
				choice = second
			default:
				choice = row // the only candidate: nowhere else to go
			}
		}
	}
	s.pinLocked(req.SessionID, at(c, choice))
	return choice, nil
}

// Sessions returns the number of sessions currently pinned.
func (s *SoftPin) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pins)
}

// pinLocked pins session to w as the most recently used, evicting the
// least recently used pin when the map is full. s.mu is held.
func (s *SoftPin) pinLocked(session string, w worker) {
	if e, ok := s.pins[session]; ok {
		e.Value.(*pin).w = w
		s.lru.MoveToFront(e)
		return
	}
	if len(s.pins) >= s.maxSessions {
		oldest := s.lru.Back()
		delete(s.pins, oldest.Value.(*pin).session)
		s.lru.Remove(oldest)
	}
	s.pins[session] = s.lru.PushFront(&pin{session: session, w: w})
}

// leastLoaded returns the rows of the lowest and second-lowest
// (ACTIVE_REQUESTS, WorkerID, DPRank); second is -1 when c has one row.
func leastLoaded(c *shared.Candidates) (best, second int) {
	best, second = 0, -1
	for i := 1; i < c.Len(); i++ {
		switch {
		case less(c, i, best):
			best, second = i, best
		case second < 0 || less(c, i, second):
			second = i
		}
	}
	return best, second
}

// less orders rows by (ACTIVE_REQUESTS, WorkerID, DPRank).
func less(c *shared.Candidates, a, b int) bool {
	if c.ActiveRequests[a] != c.ActiveRequests[b] {
		return c.ActiveRequests[a] < c.ActiveRequests[b]
	}
	if c.IDs[a] != c.IDs[b] {
		return c.IDs[a] < c.IDs[b]
	}
	return c.DPRanks != nil && c.DPRanks[a] < c.DPRanks[b]
}

// at returns row's worker identity.
func at(c *shared.Candidates, row int) worker {
	w := worker{id: c.IDs[row]}
	if c.DPRanks != nil {
		w.rank = c.DPRanks[row]
	}
	return w
}

// find returns the row of w in c, or -1.
func find(c *shared.Candidates, w worker) int {
	for i, id := range c.IDs {
		if id == w.id && (c.DPRanks == nil && w.rank == 0 || c.DPRanks != nil && c.DPRanks[i] == w.rank) {
			return i
		}
	}
	return -1
}

// Interface guard.
var _ shared.Picker = (*SoftPin)(nil)
