package disagg

import (
	"context"
	"fmt"

	"github.com/switchyard-router/switchyard/shared"
)

// TypeLowestCost is the type name of the LowestCost picker.
const TypeLowestCost = "lowest-cost"

// LowestCost picks the row with the lowest summed scorer cost
// (Candidates.Costs). Ties go to the lowest (WorkerID, DPRank), whatever
// the row order, so the pick is deterministic: no randomness, no state.
// Without scorers (Costs nil) every row ties and the lowest worker id wins.
// One pass, no allocation.
type LowestCost struct{}

// LowestCostType describes the lowest-cost picker.
func LowestCostType() shared.TypeInfo {
	return shared.TypeInfo{
		Name: TypeLowestCost,
		Kind: shared.KindPicker,
		Doc: "Picks the lowest summed scorer cost; ties go to the lowest worker id (then data-parallel " +
			"rank), so the result is deterministic. Roles: prefill, decode.",
		New: func(info shared.InstanceInfo, p shared.Params) (shared.Component, error) {
			return NewLowestCost(info, p)
		},
	}
}

// NewLowestCost returns a lowest-cost picker. It takes no parameters and
// fails with a plain error wrapping ErrRole when info.Role is neither
// prefill nor decode.
func NewLowestCost(info shared.InstanceInfo, _ shared.Params) (*LowestCost, error) {
	if err := checkRole(TypeLowestCost, info.Role); err != nil {
		return nil, err
	}
	return &LowestCost{}, nil
}

// Inputs returns none: the picker reads only Candidates.Costs.
func (*LowestCost) Inputs() shared.Inputs { return 0 }

// Pick returns the lowest-cost row, ties to the lowest worker id. It fails
// with shared.ErrNoWorkers when c is empty and with ErrMissingColumn when
// Costs is non-nil with a length other than c.Len().
func (*LowestCost) Pick(_ context.Context, _ *shared.Request, c *shared.Candidates) (int, error) {
	n := c.Len()
	if n == 0 {
		return -1, shared.ErrNoWorkers
	}
	if c.Costs != nil && len(c.Costs) != n {
		return -1, fmt.Errorf("%s: %w: costs has %d entries for %d candidates", TypeLowestCost, ErrMissingColumn, len(c.Costs), n)
	}
	if c.DPRanks != nil && len(c.DPRanks) != n {
		return -1, fmt.Errorf("%s: %w: dp ranks has %d entries for %d candidates", TypeLowestCost, ErrMissingColumn, len(c.DPRanks), n)
	}
	best := 0
	for i := 1; i < n; i++ {
		if c.Costs != nil {
			if c.Costs[i] < c.Costs[best] {
				best = i
				continue
			}
			if c.Costs[i] > c.Costs[best] {
				continue
			}
		}
		if lessID(c, i, best) {
			best = i
		}
	}
	return best, nil
}

// lessID reports whether row a's (WorkerID, DPRank) is below row b's.
func lessID(c *shared.Candidates, a, b int) bool {
	if c.IDs[a] != c.IDs[b] {
		return c.IDs[a] < c.IDs[b]
	}
	return c.DPRanks != nil && c.DPRanks[a] < c.DPRanks[b]
}

// Interface guard.
var _ shared.Picker = (*LowestCost)(nil)
