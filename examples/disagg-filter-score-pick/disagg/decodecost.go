package disagg

import (
	"context"
	"fmt"

	"github.com/switchyard-router/switchyard/shared"
)

// TypeDecodeCost is the type name of the DecodeCost scorer.
const TypeDecodeCost = "decode-cost"

// DecodeCost scores each worker by its booked decode KV blocks:
//
//	cost = active_decode_blocks
//
// from the worker's Load record (LOAD). Lower is better.
type DecodeCost struct{}

// DecodeCostType describes the decode-cost scorer.
func DecodeCostType() shared.TypeInfo {
	return shared.TypeInfo{
		Name:   TypeDecodeCost,
		Kind:   shared.KindScorer,
		Inputs: shared.InputLoad,
		Doc: "Scores each worker by active_decode_blocks, the KV blocks of its in-flight requests. " +
			"Lower is better. Roles: prefill, decode.",
		New: func(info shared.InstanceInfo, p shared.Params) (shared.Component, error) {
			return NewDecodeCost(info, p)
		},
	}
}

// NewDecodeCost returns a decode-cost scorer. It takes no parameters and
// fails with a plain error wrapping ErrRole when info.Role is neither
// prefill nor decode.
func NewDecodeCost(info shared.InstanceInfo, _ shared.Params) (*DecodeCost, error) {
	if err := checkRole(TypeDecodeCost, info.Role); err != nil {
		return nil, err
	}
	return &DecodeCost{}, nil
}

// Inputs returns LOAD.
func (*DecodeCost) Inputs() shared.Inputs { return shared.InputLoad }

// Score writes each row's active_decode_blocks into costs. It fails with
// ErrMissingColumn when the LOAD column or costs does not have c.Len()
// entries. It does not allocate.
func (*DecodeCost) Score(_ context.Context, _ *shared.Request, c *shared.Candidates, costs []float64) error {
	n := c.Len()
	if len(c.Load) != n || len(costs) != n {
		return fmt.Errorf("%s: %w: need the LOAD column and costs of %d rows", TypeDecodeCost, ErrMissingColumn, n)
	}
	for i := range costs {
		costs[i] = float64(c.Load[i].ActiveDecodeBlocks)
	}
	return nil
}

// Interface guard.
var _ shared.Scorer = (*DecodeCost)(nil)
