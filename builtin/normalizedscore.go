package builtin

import (
	"context"
	"fmt"
	"math"

	"github.com/switchyard-router/switchyard/shared"
)

// TypeNormalizedScore is the type name of the NormalizedScore scorer.
const TypeNormalizedScore = "normalized-score"

// ParamSignal names the signal a normalized-score scorer reads.
const ParamSignal = "signal"

// The signals of the normalized-score scorer.
const (
	// SignalQueue is the engine's waiting-queue length, min-max normalised
	// over the candidates.
	SignalQueue = "queue"
	// SignalKVUsage is the engine's KV-cache usage fraction.
	SignalKVUsage = "kv-usage"
	// SignalPrefixMatch is the fraction of the prompt the worker holds.
	SignalPrefixMatch = "prefix-match"
)

// NormalizedScore is llm-d's scorer family: each signal is turned into a
// score in [0, 1], higher better, as llm-d's default scheduler profile
// scores it, and written as the cost 1 - score, so that the weighted costs
// of several such scorers (the policy's `weight` per scorer block) rank the
// candidates exactly as llm-d's weighted score sum does, lowest cost for
// the highest score. The signals, with the llm-d source each follows
// (github.com/llm-d/llm-d-router, the repository llm-d-inference-scheduler
// moved to):
//
//   - "queue" (scorer/queuedepth/queue.go @ 2342697faf4e5a1a3ebf5e95d9ca5c903ba64c4a):
//     score = (q_max - q) / (q_max - q_min) over the candidates that
//     report a waiting count (Load.Waiting, the engine's own
//     num_requests_waiting), 1 when all are equal; a candidate without a
//     report takes no part in the range and scores 0 (llm-d leaves it
//     unscored, which its weighted sum counts as 0).
//   - "kv-usage" (scorer/kvcacheutilization/kvcache_utilization.go @
//     2342697faf4e5a1a3ebf5e95d9ca5c903ba64c4a): score = 1 - kv_usage, the
//     engine's reported KV-cache usage fraction clamped to [0, 1]; 0
//     without a report.
//   - "prefix-match" (scorer/prefix/plugin.go @
//     068b68d08c44a311012602f9e051276c689ef9c3, its default
//     prefixLengthWeight 0): score = the fraction of the prompt the worker
//     holds, min(1, overlap_blocks * block_size / prompt_tokens); llm-d
//     divides matched by total blocks of its own approximate index, which
//     differs only by the prompt's partial last block. A request without
//     prompt tokens scores 0 everywhere.
//
// Score makes at most two passes over the rows and allocates nothing.
type NormalizedScore struct {
	signal string
}

// NormalizedScoreType describes the normalized-score scorer.
func NormalizedScoreType() shared.TypeInfo {
	return shared.TypeInfo{
		Name:   TypeNormalizedScore,
		Kind:   shared.KindScorer,
		Inputs: shared.InputLoad | shared.InputCache,
		Params: []shared.ParamSpec{
			{Name: ParamSignal, Type: shared.String, Required: true,
				Doc: `The signal scored: "queue" (the engine's waiting count, min-max normalised over ` +
					`the candidates), "kv-usage" (1 - the engine's KV-cache usage) or "prefix-match" ` +
					`(the fraction of the prompt the worker holds). Each is a score in [0, 1] as ` +
					`llm-d's default scheduler profile computes it, written as the cost 1 - score.`},
		},
		Doc: "llm-d's normalised scorers as costs (1 - score, in [0, 1]): queue depth min-max " +
			"normalised over the candidates, KV-cache usage, or prefix match ratio; weight them " +
			"with the scorer block's weight.",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewNormalizedScore(p) },
	}
}

// NewNormalizedScore returns a normalized-score scorer from p. A signal
// other than "queue", "kv-usage" or "prefix-match" (or none) fails with a
// *shared.ParamError naming it.
func NewNormalizedScore(p shared.Params) (*NormalizedScore, error) {
	s := p.String(ParamSignal, "")
	switch s {
	case SignalQueue, SignalKVUsage, SignalPrefixMatch:
		return &NormalizedScore{signal: s}, nil
	}
	return nil, &shared.ParamError{Param: ParamSignal,
		Err: fmt.Errorf("must be %q, %q or %q, got %q", SignalQueue, SignalKVUsage, SignalPrefixMatch, s)}
}

// Inputs returns LOAD for the queue and kv-usage signals, CACHE for
// prefix-match.
func (s *NormalizedScore) Inputs() shared.Inputs {
	if s.signal == SignalPrefixMatch {
		return shared.InputCache
	}
	return shared.InputLoad
}

// Signal returns the configured signal.
func (s *NormalizedScore) Signal() string { return s.signal }

// Score writes each row's cost 1 - score into costs (len(costs) ==
// c.Len()). It fails with ErrMissingColumn when the signal's column (Load,
// or OverlapBlocks) or costs has the wrong length, and with ErrBlockSize
// for prefix-match when req.BlockSize <= 0. It does not allocate.
func (s *NormalizedScore) Score(_ context.Context, req *shared.Request, c *shared.Candidates, costs []float64) error {
	n := c.Len()
	if len(costs) != n {
		return fmt.Errorf("%s: %w: %d costs for %d candidates", TypeNormalizedScore, ErrMissingColumn, len(costs), n)
	}
	switch s.signal {
	case SignalQueue:
		if len(c.Load) != n {
			return fmt.Errorf("%s: %w: need the LOAD column of %d rows", TypeNormalizedScore, ErrMissingColumn, n)
		}
		lo, hi, seen := int64(math.MaxInt64), int64(math.MinInt64), false
		for i := range c.Load[:n] {
			if l := &c.Load[i]; l.HasWaiting {
				lo, hi, seen = min(lo, l.Waiting), max(hi, l.Waiting), true
			}
		}
		for i := range c.Load[:n] {
			l := &c.Load[i]
			switch {
			case !l.HasWaiting || !seen:
				costs[i] = 1
			case hi == lo:
				costs[i] = 0
			default:
				// cost = 1 - (hi-q)/(hi-lo) = (q-lo)/(hi-lo)
				costs[i] = float64(l.Waiting-lo) / float64(hi-lo)
			}
		}
	case SignalKVUsage:
		if len(c.Load) != n {
			return fmt.Errorf("%s: %w: need the LOAD column of %d rows", TypeNormalizedScore, ErrMissingColumn, n)
		}
		for i := range c.Load[:n] {
			l := &c.Load[i]
			if !l.HasKVUsage || math.IsNaN(l.KVUsage) {
				costs[i] = 1
				continue
			}
			costs[i] = min(1, max(0, l.KVUsage))
		}
	default: // SignalPrefixMatch
		if len(c.OverlapBlocks) != n {
			return fmt.Errorf("%s: %w: need the CACHE column of %d rows", TypeNormalizedScore, ErrMissingColumn, n)
		}
		if req.BlockSize <= 0 {
			return fmt.Errorf("%s: %w, got %d", TypeNormalizedScore, ErrBlockSize, req.BlockSize)
		}
		for i, ob := range c.OverlapBlocks[:n] {
			costs[i] = 1 - matchRatio(req, ob)
		}
	}
	return nil
}

// matchRatio is the fraction of req's prompt that a worker holding
// overlap leading blocks has: min(1, overlap*block_size/prompt_tokens),
// 0 for an empty prompt or a non-positive overlap. SGLang's cache-aware
// policy divides matched by total characters, llm-d's prefix scorer and
// AIBrix's prefix-cache policy matched by total blocks; in tokens, this is
// the same up to the prompt's partial last block.
func matchRatio(req *shared.Request, overlap int32) float64 {
	if req.PromptTokens <= 0 || overlap <= 0 || req.BlockSize <= 0 {
		return 0
	}
	return min(1, float64(overlap)*float64(req.BlockSize)/float64(req.PromptTokens))
}

// Interface guard.
var _ shared.Scorer = (*NormalizedScore)(nil)
