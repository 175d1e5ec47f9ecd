package disagg

import (
	"context"
	"fmt"

	"github.com/switchyard-router/switchyard/shared"
)

// TypePrefillCost is the type name of the PrefillCost scorer.
const TypePrefillCost = "prefill-cost"

// PrefillCost scores each worker by the prefill work the request would wait
// behind plus the prefill work it brings, in KV blocks:
//
//	request_blocks = ceil(prompt_tokens / block_size)
//	cost = active_prefill_tokens / block_size + max(0, request_blocks - overlap_blocks)
//
// where block_size is the request's block size, the first division is in
// float64, active_prefill_tokens comes from the worker's Load record (LOAD)
// and overlap_blocks from CACHE. Lower is better.
type PrefillCost struct{}

// PrefillCostType describes the prefill-cost scorer.
func PrefillCostType() shared.TypeInfo {
	return shared.TypeInfo{
		Name:   TypePrefillCost,
		Kind:   shared.KindScorer,
		Inputs: shared.InputLoad | shared.InputCache,
		Doc: "Scores each worker by active_prefill_tokens/block_size + max(0, ceil(prompt_tokens/block_size) " +
			"- overlap_blocks), in KV blocks: the prefill queued there plus the request's blocks the " +
			"worker does not already hold. Lower is better. Roles: prefill, decode.",
		New: func(info shared.InstanceInfo, p shared.Params) (shared.Component, error) {
			return NewPrefillCost(info, p)
		},
	}
}

// NewPrefillCost returns a prefill-cost scorer. It takes no parameters and
// fails with a plain error wrapping ErrRole when info.Role is neither
// prefill nor decode.
func NewPrefillCost(info shared.InstanceInfo, _ shared.Params) (*PrefillCost, error) {
	if err := checkRole(TypePrefillCost, info.Role); err != nil {
		return nil, err
	}
	return &PrefillCost{}, nil
}

// Inputs returns LOAD|CACHE.
func (*PrefillCost) Inputs() shared.Inputs { return shared.InputLoad | shared.InputCache }

// Score writes each row's cost into costs. It fails with ErrBlockSize when
// req.BlockSize <= 0 and with ErrMissingColumn when the LOAD or CACHE column
// or costs does not have c.Len() entries. It does not allocate.
func (*PrefillCost) Score(_ context.Context, req *shared.Request, c *shared.Candidates, costs []float64) error {
	n := c.Len()
	if req.BlockSize <= 0 {
		return fmt.Errorf("%s: %w, got %d", TypePrefillCost, ErrBlockSize, req.BlockSize)
	}
	if len(c.Load) != n || len(c.OverlapBlocks) != n || len(costs) != n {
		return fmt.Errorf("%s: %w: need the LOAD and CACHE columns and costs of %d rows", TypePrefillCost, ErrMissingColumn, n)
	}
	bs := int64(req.BlockSize)
	prompt := max(int64(req.PromptTokens), 0)
	requestBlocks := (prompt + bs - 1) / bs
	for i := range costs {
		uncached := max(requestBlocks-int64(c.OverlapBlocks[i]), 0)
		costs[i] = float64(c.Load[i].ActivePrefillTokens)/float64(bs) + float64(uncached)
	}
	return nil
}

// Interface guard.
var _ shared.Scorer = (*PrefillCost)(nil)
