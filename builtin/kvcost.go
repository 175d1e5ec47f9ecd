package builtin

import (
	"context"
	"errors"
	"fmt"

	"github.com/switchyard-router/switchyard/shared"
)

// TypeKVCost is the type name of the KVCost scorer.
const TypeKVCost = "kv-cost"

// Parameter names of the kv-cost scorer.
const (
	ParamOverlapCredit       = "overlap_credit"
	ParamPrefillLoadScale    = "prefill_load_scale"
	ParamDecodeRequestWeight = "decode_request_weight"
)

// Errors KVCost.Score returns for malformed input.
var (
	// ErrMissingColumn: a declared input's column is nil or has the wrong
	// length.
	ErrMissingColumn = errors.New("declared input column missing")
	// ErrBlockSize: the request's block size is not positive.
	ErrBlockSize = errors.New("request block size must be > 0")
)

// KVCost scores each worker by the KV work a request would queue behind
// there, in KV blocks, modelled on the cost of Dynamo's KV router (prefill
// blocks not covered by the prefix cache, weighted, plus decode blocks):
//
//	prefill = max(0, (active_prefill_tokens + prompt_tokens)/bs - overlap_credit*overlap_blocks)
//	cost    = prefill_load_scale*prefill + active_decode_blocks + decode_request_weight*active_requests
//
// where bs is the request's block size, the division is in float64, and
// active_prefill_tokens, active_decode_blocks and active_requests come from
// the worker's Load record (LOAD) and overlap_blocks from CACHE. Lower is
// better. active_requests is always read from Load.ActiveRequests, which the
// LOAD input carries, so the scorer declares LOAD|CACHE whatever
// decode_request_weight is.
type KVCost struct {
	overlapCredit       float64
	prefillLoadScale    float64
	decodeRequestWeight float64
}

// KVCostType describes the kv-cost scorer.
func KVCostType() shared.TypeInfo {
	return shared.TypeInfo{
		Name:   TypeKVCost,
		Kind:   shared.KindScorer,
		Inputs: shared.InputLoad | shared.InputCache,
		Params: []shared.ParamSpec{
			{Name: ParamOverlapCredit, Type: shared.Number, Default: 1.0,
				Doc: "Prefill blocks saved per block of the request's prefix the worker already " +
					"holds (overlap_blocks). Unitless, finite, >= 0; default 1 (each cached block " +
					"is not prefilled again); 0 ignores the prefix cache."},
			{Name: ParamPrefillLoadScale, Type: shared.Number, Default: 1.0,
				Doc: "Weight of the prefill term (pending prefill blocks) against decode blocks. " +
					"Unitless, finite, >= 0; default 1."},
			{Name: ParamDecodeRequestWeight, Type: shared.Number, Default: 0.0,
				Doc: "Cost in blocks added per in-flight request (Load.active_requests). Finite, " +
					">= 0; default 0 (request count ignored)."},
		},
		Doc: "Scores each worker by max(0, (active_prefill_tokens + prompt_tokens)/block_size - " +
			"overlap_credit*overlap_blocks) * prefill_load_scale + active_decode_blocks + " +
			"decode_request_weight*active_requests, in KV blocks; lower is better.",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewKVCost(p) },
	}
}

// NewKVCost returns a kv-cost scorer from p (absent parameters take their
// defaults). A parameter that is NaN, infinite or negative fails with a
// *shared.ParamError naming it.
func NewKVCost(p shared.Params) (*KVCost, error) {
	s := &KVCost{
		overlapCredit:       p.Float(ParamOverlapCredit, 1),
		prefillLoadScale:    p.Float(ParamPrefillLoadScale, 1),
		decodeRequestWeight: p.Float(ParamDecodeRequestWeight, 0),
	}
	for _, c := range []struct {
		name string
		v    float64
	}{
		{ParamOverlapCredit, s.overlapCredit},
		{ParamPrefillLoadScale, s.prefillLoadScale},
		{ParamDecodeRequestWeight, s.decodeRequestWeight},
	} {
		if err := shared.NonNegative(c.name, c.v); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Inputs returns LOAD|CACHE.
func (*KVCost) Inputs() shared.Inputs { return shared.InputLoad | shared.InputCache }

// Score writes each row's cost into costs (len(costs) == c.Len()). It fails
// with ErrBlockSize when req.BlockSize <= 0 and with ErrMissingColumn when
// c lacks the Load or OverlapBlocks column or costs has the wrong length.
// It does not allocate.
func (s *KVCost) Score(_ context.Context, req *shared.Request, c *shared.Candidates, costs []float64) error {
	n := c.Len()
	if req.BlockSize <= 0 {
		return fmt.Errorf("kv-cost: %w, got %d", ErrBlockSize, req.BlockSize)
	}
	if len(c.Load) != n || len(c.OverlapBlocks) != n || len(costs) != n {
		return fmt.Errorf("kv-cost: %w: need LOAD and CACHE columns and costs of %d rows", ErrMissingColumn, n)
	}
	bs := float64(req.BlockSize)
	prompt := float64(req.PromptTokens)
	overlap := c.OverlapBlocks[:n]
	costs = costs[:n]
	for i := range c.Load[:n] {
		l := &c.Load[i]
		prefill := (float64(l.ActivePrefillTokens)+prompt)/bs - s.overlapCredit*float64(overlap[i])
		if prefill < 0 {
			prefill = 0
		}
		costs[i] = s.prefillLoadScale*prefill + float64(l.ActiveDecodeBlocks) +
			s.decodeRequestWeight*float64(l.ActiveRequests)
	}
	return nil
}

// Interface guard.
var _ shared.Scorer = (*KVCost)(nil)
