// Package queuedepth holds the one component type of the plugin-example
// binary: queue-depth, a scorer charging each worker for the requests it is
// already serving and, when its engine reports one, its queue.
//
// This is the plugin template. The logic lives in this non-main package so
// it can be tested without starting a plugin process; main.go only hands
// Types() to shared.Serve. The package imports only the SDK (shared) and
// the standard library, like every plugin should.
package queuedepth

import (
	"context"
	"errors"
	"fmt"

	"github.com/switchyard-router/switchyard/shared"
)

// TypeQueueDepth is the type name policy files use: type = "queue-depth".
// It must be unique across the built-in types and every plugin the router
// loads.
const TypeQueueDepth = "queue-depth"

// ParamWaitingWeight is the name of the queue-depth scorer's parameter.
const ParamWaitingWeight = "waiting_weight"

// ErrMissingColumn: a declared input's column (or costs) does not have one
// entry per candidate.
var ErrMissingColumn = errors.New("declared input column missing")

// Types returns the descriptors of every type this plugin serves; main.go
// passes them to shared.Serve.
func Types() []shared.TypeInfo { return []shared.TypeInfo{QueueDepthType()} }

// QueueDepth scores each worker by its queue depth, in requests:
//
//	cost = active_requests + waiting_weight * waiting
//
// active_requests is the router's in-flight count for the worker
// (ACTIVE_REQUESTS); waiting is the engine-reported queue length
// (Load.Waiting) when the engine reports one (Load.HasWaiting) and 0
// otherwise. Lower is better. Note that the engine's running requests are
// usually part of active_requests already: waiting adds what is queued
// inside the engine, which the router cannot see from its own bookings.
//
// The instance declares exactly what it reads: ACTIVE_REQUESTS, plus LOAD
// only when waiting_weight > 0, so with waiting_weight = 0 the router skips
// the Load column altogether. It is stateless and safe for concurrent use.
type QueueDepth struct {
	waitingWeight float64
}

// QueueDepthType describes the queue-depth scorer: its kind, the inputs an
// instance may declare, and the parameter schema the router decodes the
// policy file's attributes against (and `router plugins describe` prints).
func QueueDepthType() shared.TypeInfo {
	return shared.TypeInfo{
		Name:   TypeQueueDepth,
		Kind:   shared.KindScorer,
		Inputs: shared.InputActiveRequests | shared.InputLoad,
		Params: []shared.ParamSpec{
			{Name: ParamWaitingWeight, Type: shared.Number, Default: 1.0,
				Doc: "Cost per request waiting in the worker's engine queue (engine-reported " +
					"Load.waiting; counted as 0 when the engine reports none), relative to 1 per " +
					"in-flight request. Unitless, finite, >= 0; default 1. 0 scores in-flight " +
					"requests only and stops reading LOAD."},
		},
		Doc: "Scores each worker by active_requests + waiting_weight * waiting, in requests: its " +
			"in-flight requests plus, when its engine reports a queue, the requests waiting there. " +
			"Lower is better.",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewQueueDepth(p) },
	}
}

// NewQueueDepth returns a queue-depth scorer from p (an absent
// waiting_weight means 1). A waiting_weight that is NaN, infinite or
// negative fails with a *shared.ParamError naming it, which the router
// reports at that attribute's file:line:col.
func NewQueueDepth(p shared.Params) (*QueueDepth, error) {
	w := p.Float(ParamWaitingWeight, 1)
	if err := shared.NonNegative(ParamWaitingWeight, w); err != nil {
		return nil, err
	}
	return &QueueDepth{waitingWeight: w}, nil
}

// Inputs returns ACTIVE_REQUESTS, and LOAD when waiting_weight > 0.
func (s *QueueDepth) Inputs() shared.Inputs {
	if s.waitingWeight > 0 {
		return shared.InputActiveRequests | shared.InputLoad
	}
	return shared.InputActiveRequests
}

// Score writes each row's cost into costs (len(costs) == c.Len()). It fails
// with ErrMissingColumn when a declared column or costs does not have
// c.Len() entries. It does not allocate.
func (s *QueueDepth) Score(_ context.Context, _ *shared.Request, c *shared.Candidates, costs []float64) error {
	n := c.Len()
	if len(c.ActiveRequests) != n || len(costs) != n {
		return fmt.Errorf("%s: %w: need ACTIVE_REQUESTS and costs of %d rows", TypeQueueDepth, ErrMissingColumn, n)
	}
	if s.waitingWeight == 0 {
		for i, a := range c.ActiveRequests {
			costs[i] = float64(a)
		}
		return nil
	}
	if len(c.Load) != n {
		return fmt.Errorf("%s: %w: need LOAD of %d rows", TypeQueueDepth, ErrMissingColumn, n)
	}
	for i, a := range c.ActiveRequests {
		costs[i] = float64(a)
		if l := &c.Load[i]; l.HasWaiting {
			costs[i] += s.waitingWeight * float64(l.Waiting)
		}
	}
	return nil
}

// Interface guard: the build fails if QueueDepth stops being a Scorer.
var _ shared.Scorer = (*QueueDepth)(nil)
