package disagg

import (
	"context"
	"fmt"

	"github.com/switchyard-router/switchyard/shared"
)

// TypeMinOverlap is the type name of the MinOverlap filter.
const TypeMinOverlap = "min-overlap"

// ParamMinDeviceOverlapBlocks is the name of the min-overlap filter's
// threshold.
const ParamMinDeviceOverlapBlocks = "min_device_overlap_blocks"

// MinOverlap keeps the workers that already hold at least
// min_device_overlap_blocks leading blocks of the request's prompt
// (overlap_blocks, from CACHE) and drops the rest. The comparison is
// inclusive: overlap_blocks >= min_device_overlap_blocks keeps the worker.
// A filter that keeps nothing is allowed; the router then reports
// shared.ErrAllFiltered and the request is handled as all-filtered.
type MinOverlap struct {
	min float64
}

// MinOverlapType describes the min-overlap filter.
func MinOverlapType() shared.TypeInfo {
	return shared.TypeInfo{
		Name:   TypeMinOverlap,
		Kind:   shared.KindFilter,
		Inputs: shared.InputCache,
		Params: []shared.ParamSpec{
			{Name: ParamMinDeviceOverlapBlocks, Type: shared.Number, Required: true,
				Doc: "Keep a worker only when it already holds at least this many leading KV blocks " +
					"of the request's prompt (overlap_blocks; inclusive). In blocks of block_size " +
					"tokens, finite, >= 0; required, no default. 0 keeps every worker; a fraction " +
					"such as 1.5 keeps workers with 2 or more."},
		},
		Doc: "Keeps workers whose prefix overlap with the request (overlap_blocks, CACHE) is at least " +
			"min_device_overlap_blocks. Roles: prefill, decode.",
		New: func(info shared.InstanceInfo, p shared.Params) (shared.Component, error) {
			return NewMinOverlap(info, p)
		},
	}
}

// NewMinOverlap returns a min-overlap filter. It fails with a plain error
// wrapping ErrRole when info.Role is neither prefill nor decode, and with a
// *shared.ParamError when min_device_overlap_blocks is absent, NaN,
// infinite or negative.
func NewMinOverlap(info shared.InstanceInfo, p shared.Params) (*MinOverlap, error) {
	if err := checkRole(TypeMinOverlap, info.Role); err != nil {
		return nil, err
	}
	if !p.Has(ParamMinDeviceOverlapBlocks) {
		return nil, &shared.ParamError{Param: ParamMinDeviceOverlapBlocks,
			Err: fmt.Errorf("required: the minimum overlap in blocks, a finite number >= 0")}
	}
	m := p.Float(ParamMinDeviceOverlapBlocks, 0)
	if err := shared.NonNegative(ParamMinDeviceOverlapBlocks, m); err != nil {
		return nil, err
	}
	return &MinOverlap{min: m}, nil
}

// Inputs returns CACHE.
func (*MinOverlap) Inputs() shared.Inputs { return shared.InputCache }

// Filter clears keep[i] for each row whose OverlapBlocks is below the
// threshold. It fails with ErrMissingColumn when the CACHE column or keep
// does not have c.Len() entries. It does not allocate.
func (f *MinOverlap) Filter(_ context.Context, _ *shared.Request, c *shared.Candidates, keep []bool) error {
	n := c.Len()
	if len(c.OverlapBlocks) != n || len(keep) != n {
		return fmt.Errorf("%s: %w: need the CACHE column and keep of %d rows", TypeMinOverlap, ErrMissingColumn, n)
	}
	for i, o := range c.OverlapBlocks {
		if float64(o) < f.min {
			keep[i] = false
		}
	}
	return nil
}

// Interface guard.
var _ shared.Filter = (*MinOverlap)(nil)
