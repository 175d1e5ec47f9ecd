package builtin

import (
	"context"

	"github.com/switchyard-router/switchyard/hosted"
	"github.com/switchyard-router/switchyard/shared"
)

// TypeLeastLoaded is the type name of the LeastLoaded picker.
const TypeLeastLoaded = "least-loaded"

// LeastLoaded picks the candidate with the fewest in-flight requests
// (ACTIVE_REQUESTS), uniformly among ties by reservoir sampling in one pass
// with no allocation (Caddy's LeastConnSelection). O(n) in the candidates.
type LeastLoaded struct {
	rng *rng
}

// LeastLoadedType describes the least-loaded picker.
func LeastLoadedType() shared.TypeInfo {
	return shared.TypeInfo{
		Name:   TypeLeastLoaded,
		Kind:   shared.KindPicker,
		Inputs: shared.InputActiveRequests,
		Params: []shared.ParamSpec{seedSpec()},
		Doc: "Picks the candidate with the fewest in-flight requests (ACTIVE_REQUESTS), uniformly " +
			"among ties. A picker-only policy runs on the hosted path.",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewLeastLoaded(p), nil },
	}
}

// NewLeastLoaded returns a least-loaded picker; p may hold the seed
// parameter.
func NewLeastLoaded(p shared.Params) *LeastLoaded { return &LeastLoaded{rng: newRNG(p)} }

// Inputs returns ACTIVE_REQUESTS.
func (*LeastLoaded) Inputs() shared.Inputs { return shared.InputActiveRequests }

// Pick returns a row of c with the minimum ActiveRequests. It fails with
// shared.ErrNoWorkers when c is empty and with hosted.ErrNoActiveRequests
// when the column is missing.
func (l *LeastLoaded) Pick(_ context.Context, _ *shared.Request, c *shared.Candidates) (int, error) {
	n := c.Len()
	if n == 0 {
		return -1, shared.ErrNoWorkers
	}
	if len(c.ActiveRequests) != n {
		return -1, hosted.ErrNoActiveRequests
	}
	g := l.rng.stream()
	best, low, ties := 0, c.ActiveRequests[0], 1
	for i, a := range c.ActiveRequests[1:] {
		switch {
		case a < low:
			best, low, ties = i+1, a, 1
		case a == low:
			ties++
			if g.intn(ties) == 0 {
				best = i + 1
			}
		}
	}
	return best, nil
}

// PickHosted is Pick over the view's accessor, read once per row.
func (l *LeastLoaded) PickHosted(v *hosted.WorkerInputView) (int, error) {
	n := v.Len()
	if n == 0 {
		return -1, shared.ErrNoWorkers
	}
	active := v.ActiveRequestsFunc()
	if active == nil {
		return -1, hosted.ErrNoActiveRequests
	}
	g := l.rng.stream()
	best, low, ties := 0, active(0), 1
	for i := 1; i < n; i++ {
		a := active(i)
		switch {
		case a < low:
			best, low, ties = i, a, 1
		case a == low:
			ties++
			if g.intn(ties) == 0 {
				best = i
			}
		}
	}
	return best, nil
}

// Interface guards.
var (
	_ shared.Picker             = (*LeastLoaded)(nil)
	_ hosted.HostedWorkerPicker = (*LeastLoaded)(nil)
)
