package builtin

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/switchyard-router/switchyard/shared"
)

// TypeBusy is the type name of the Busy filter.
const TypeBusy = "busy"

// Parameter names of the busy filter.
const (
	ParamMaxActiveRequests = "max_active_requests"
	ParamMaxKVUsage        = "max_kv_usage"
)

// Busy drops the workers that are at or over a limit: ACTIVE_REQUESTS >=
// max_active_requests, or an engine-reported KV usage >= max_kv_usage. A
// worker whose engine has not reported KV usage is never dropped for it.
// Each limit is optional but at least one is set; the instance declares
// ACTIVE_REQUESTS when max_active_requests is set and LOAD when
// max_kv_usage is set.
type Busy struct {
	maxActive int64   // 0: no limit
	maxKV     float64 // 0: no limit
}

// BusyType describes the busy filter.
func BusyType() shared.TypeInfo {
	return shared.TypeInfo{
		Name:   TypeBusy,
		Kind:   shared.KindFilter,
		Inputs: shared.InputActiveRequests | shared.InputLoad,
		Params: []shared.ParamSpec{
			{Name: ParamMaxActiveRequests, Type: shared.Int,
				Doc: "Drop a worker with this many in-flight requests (ACTIVE_REQUESTS) or more. " +
					"Requests, >= 1; optional, no default (no request limit)."},
			{Name: ParamMaxKVUsage, Type: shared.Number,
				Doc: "Drop a worker whose engine-reported KV-cache usage is at or over this fraction. " +
					"In (0, 1]; optional, no default (no KV limit). Workers that report no KV usage are kept."},
		},
		Doc: "Drops workers at or over max_active_requests in-flight requests or max_kv_usage " +
			"KV-cache usage; at least one limit must be set.",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewBusy(p) },
	}
}

// errNoLimit is the reason given when neither limit is set.
var errNoLimit = errors.New("set max_active_requests, max_kv_usage or both")

// NewBusy returns a busy filter from p. It fails with a *shared.ParamError
// when neither limit is set, when max_active_requests < 1, or when
// max_kv_usage is not in (0, 1].
func NewBusy(p shared.Params) (*Busy, error) {
	b := &Busy{}
	if !p.Has(ParamMaxActiveRequests) && !p.Has(ParamMaxKVUsage) {
		return nil, &shared.ParamError{Param: ParamMaxActiveRequests, Err: errNoLimit}
	}
	if p.Has(ParamMaxActiveRequests) {
		b.maxActive = p.Int(ParamMaxActiveRequests, 0)
		if b.maxActive < 1 {
			return nil, &shared.ParamError{Param: ParamMaxActiveRequests,
				Err: fmt.Errorf("must be >= 1, got %d", b.maxActive)}
		}
	}
	if p.Has(ParamMaxKVUsage) {
		b.maxKV = p.Float(ParamMaxKVUsage, 0)
		if math.IsNaN(b.maxKV) || b.maxKV <= 0 || b.maxKV > 1 {
			return nil, &shared.ParamError{Param: ParamMaxKVUsage,
				Err: fmt.Errorf("must be in (0, 1], got %v", b.maxKV)}
		}
	}
	return b, nil
}

// Inputs returns ACTIVE_REQUESTS when max_active_requests is set, LOAD when
// max_kv_usage is set, or both.
func (b *Busy) Inputs() shared.Inputs {
	var in shared.Inputs
	if b.maxActive > 0 {
		in |= shared.InputActiveRequests
	}
	if b.maxKV > 0 {
		in |= shared.InputLoad
	}
	return in
}

// Filter clears keep[i] for each busy row. It fails with ErrMissingColumn
// when a column the instance declared is missing.
func (b *Busy) Filter(_ context.Context, _ *shared.Request, c *shared.Candidates, keep []bool) error {
	n := c.Len()
	if len(keep) != n {
		return fmt.Errorf("busy: keep has %d entries for %d candidates", len(keep), n)
	}
	if b.maxActive > 0 {
		if len(c.ActiveRequests) != n {
			return fmt.Errorf("busy: %w: ACTIVE_REQUESTS", ErrMissingColumn)
		}
		for i, a := range c.ActiveRequests {
			if a >= b.maxActive {
				keep[i] = false
			}
		}
	}
	if b.maxKV > 0 {
		if len(c.Load) != n {
			return fmt.Errorf("busy: %w: LOAD", ErrMissingColumn)
		}
		for i := range c.Load {
			if l := &c.Load[i]; l.HasKVUsage && l.KVUsage >= b.maxKV {
				keep[i] = false
			}
		}
	}
	return nil
}

// Interface guard.
var _ shared.Filter = (*Busy)(nil)
