package builtin

import (
	"context"
	"fmt"

	"github.com/switchyard-router/switchyard/shared"
)

// TypeKVAffinity is the type name of the KVAffinity scorer, the scorer of
// the built-in default policy.
const TypeKVAffinity = "kv-affinity"

// Parameter names of the kv-affinity scorer (engine_load is shared with
// kv-cost: ParamEngineLoad).
const (
	ParamAffinity       = "affinity"
	ParamDecodeWeight   = "decode_weight"
	ParamSpillFactor    = "spill_factor"
	ParamBalanceAbs     = "balance_abs"
	ParamBalanceRel     = "balance_rel"
	defaultAffinity     = 4.0
	defaultDecodeWeight = 1.0 / 32
	defaultSpillFactor  = 2.0
	defaultBalanceAbs   = 32.0
	defaultBalanceRel   = 2.0
)

// maxKVWeight bounds kv-affinity's affinity and decode_weight and kv-cost's
// three weights: far above any useful weight (the defaults are 4 and 1/32,
// and 1, 1 and 0), and low enough that costs
// stay finite for any input their types can hold, and exact to the spill's
// +1 for 2^31-token prompts and engines of 2^24 blocks. A larger finite
// weight (1e308) turned costs into ±Inf and failed every selection.
const maxKVWeight = 1e6

// KVAffinity scores each worker by the prefill work a request would wait
// behind there and cause, in KV blocks of the request's block size bs,
// crediting the prefix the worker already holds more than once so that a
// conversation's turns stay where their cache is, and bounding how far
// that may pile requests onto one worker. Lower is better:
//
//	pending = (active_prefill_tokens + unsent_waiting*prompt_tokens) / bs
//	own     = prompt_tokens/bs - affinity*overlap_blocks
//	decode  = decode_weight * max(active_decode_blocks, kv_usage*total_kv_blocks)
//	cost    = pending + own + decode
//
// with unsent_waiting and the engine's report (engine_load) as in kv-cost.
// Two guards keep the tail of load balancing:
//
//   - Imbalance (SGLang's cache-aware policy, sgl-router
//     src/policies/cache_aware.rs): when the candidates' in-flight request
//     counts differ by more than balance_abs and the largest exceeds
//     balance_rel times the smallest, the fleet is imbalanced and the
//     prefix is ignored for this request (affinity 0): it goes where the
//     least work waits.
//   - Spill (consistent hashing with bounded loads, Mirrokni, Thorup and
//     Zadimoghaddam, SODA 2018): a worker whose in-flight requests exceed
//     spill_factor times the candidates' mean (plus one, so that an idle
//     fleet spills nothing) costs more than every worker within the bound,
//     so it is chosen only when all are over it.
//
// Why these terms. The simulated engine's step time (router/sim) charges
// about 0.021 ms per prefilled token and 7.6e-5 ms per token of decode
// context per step, so queued prefill, not resident decode context,
// decides when a request's first token comes; kv-cost weighs a decode
// block equal to a prefill block, and decode load differences then
// outweigh any prefix, spreading a conversation's turns over workers.
// decode_weight 1/32 keeps decode in the balance (it still decides among
// workers with equal prefill) without letting it override the cache.
// affinity > 1 counts what a kept prefix saves later: the conversation's
// next turn hits only where this one ran. Dynamo's KV router charges the
// same two terms, prefill blocks weighted by --kv-overlap-score-weight
// plus decode blocks, and documents that a larger weight trades
// inter-token latency for TTFT (ai-dynamo/dynamo docs/router); llm-d's
// default scheduler profile leans the same way, a prefix-cache score
// weighted 3 against a queue-depth score weighted 2 (Red Hat OpenShift AI
// 3.4, "Configuring scheduler settings"). The
// defaults were chosen by replaying the bundled Mooncake conversation and
// arXiv traces and a generated session trace at 4, 8 and 16 workers
// over seeds 1 to 5 (BENCHMARKS.md "Routing quality").
//
// Score makes two passes over the rows (two more when some worker is over
// the spill bound) and allocates nothing.
type KVAffinity struct {
	affinity     float64
	decodeWeight float64
	spillFactor  float64
	balanceAbs   float64
	balanceRel   float64
	engineLoad   bool
}

// KVAffinityType describes the kv-affinity scorer.
func KVAffinityType() shared.TypeInfo {
	return shared.TypeInfo{
		Name:   TypeKVAffinity,
		Kind:   shared.KindScorer,
		Inputs: shared.InputLoad | shared.InputCache | shared.InputCapacity,
		Params: []shared.ParamSpec{
			{Name: ParamAffinity, Type: shared.Number, Default: defaultAffinity,
				Doc: "Prefill blocks credited per block of the request's prefix the worker holds " +
					"(overlap_blocks). Unitless, finite, >= 0; default 4: the block's own prefill " +
					"plus what keeping the conversation together saves its next turns; 1 credits " +
					"only this request's saving, 0 ignores the prefix cache; at most 1e6."},
			{Name: ParamDecodeWeight, Type: shared.Number, Default: defaultDecodeWeight,
				Doc: "Cost of one block of decode context (max(active_decode_blocks, " +
					"kv_usage*total_kv_blocks)) in prefill blocks. Unitless, >= 0 and at most 1e6; " +
					"default 0.03125 (1/32)."},
			{Name: ParamSpillFactor, Type: shared.Number, Default: defaultSpillFactor,
				Doc: "Bounded load: a worker with more than spill_factor*mean+1 in-flight " +
					"requests (mean over the candidates) costs more than every worker within the " +
					"bound. Finite, 0 (off) or >= 1; default 2."},
			{Name: ParamBalanceAbs, Type: shared.Number, Default: defaultBalanceAbs,
				Doc: "Imbalance switch, absolute part: the candidates' in-flight request counts " +
					"must differ by more than this (requests) for the prefix to be ignored. " +
					"Finite, >= 0; default 32. Set balance_rel to 0 to turn the switch off."},
			{Name: ParamBalanceRel, Type: shared.Number, Default: defaultBalanceRel,
				Doc: "Imbalance switch, relative part: the largest in-flight count must also " +
					"exceed balance_rel times the smallest. Finite, 0 (switch off) or >= 1; " +
					"default 2."},
			{Name: ParamEngineLoad, Type: shared.Bool, Default: true,
				Doc: "Use the engine's own report as kv-cost does: decode blocks are the larger " +
					"of the booked ones and kv_usage*total_kv_blocks, and requests waiting at the " +
					"engine beyond the router's in-flight ones are charged one prompt each. " +
					"Default true."},
		},
		Doc: "Scores each worker by pending prefill + (prompt_tokens/block_size - affinity*overlap_blocks) " +
			"+ decode_weight*decode blocks, in KV blocks; ignores the prefix when in-flight counts are " +
			"imbalanced (balance_abs, balance_rel) and ranks workers over spill_factor*mean+1 " +
			"in-flight requests last; lower is better.",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewKVAffinity(p) },
	}
}

// NewKVAffinity returns a kv-affinity scorer from p (absent parameters take
// their defaults). A parameter that is NaN, infinite or negative, an
// affinity or decode_weight over 1e6, or a spill_factor or balance_rel
// strictly between 0 and 1, fails with a *shared.ParamError naming it.
func NewKVAffinity(p shared.Params) (*KVAffinity, error) {
	s := &KVAffinity{
		affinity:     p.Float(ParamAffinity, defaultAffinity),
		decodeWeight: p.Float(ParamDecodeWeight, defaultDecodeWeight),
		spillFactor:  p.Float(ParamSpillFactor, defaultSpillFactor),
		balanceAbs:   p.Float(ParamBalanceAbs, defaultBalanceAbs),
		balanceRel:   p.Float(ParamBalanceRel, defaultBalanceRel),
		engineLoad:   p.Bool(ParamEngineLoad, true),
	}
	for _, c := range []struct {
		name     string
		v        float64
		capped   bool // at most maxKVWeight
		offOrOne bool // 0 turns it off; otherwise at least 1
	}{
		{ParamAffinity, s.affinity, true, false},
		{ParamDecodeWeight, s.decodeWeight, true, false},
		{ParamSpillFactor, s.spillFactor, false, true},
		{ParamBalanceAbs, s.balanceAbs, false, false},
		{ParamBalanceRel, s.balanceRel, false, true},
	} {
		if err := shared.NonNegative(c.name, c.v); err != nil {
			return nil, err
		}
		if c.capped && c.v > maxKVWeight {
			return nil, &shared.ParamError{Param: c.name, Err: fmt.Errorf("must be at most %g, got %g", maxKVWeight, c.v)}
		}
		if c.offOrOne && c.v > 0 && c.v < 1 {
			return nil, &shared.ParamError{Param: c.name, Err: fmt.Errorf("must be 0 (off) or >= 1, got %g", c.v)}
		}
	}
	return s, nil
}

// Inputs returns LOAD|CACHE|CAPACITY.
func (*KVAffinity) Inputs() shared.Inputs {
	return shared.InputLoad | shared.InputCache | shared.InputCapacity
}

// Score writes each row's cost into costs (len(costs) == c.Len()). It fails
// with ErrBlockSize when req.BlockSize <= 0 and with ErrMissingColumn when
// c lacks the Load, OverlapBlocks or TotalKVBlocks column or costs has the
// wrong length. It does not allocate.
func (s *KVAffinity) Score(_ context.Context, req *shared.Request, c *shared.Candidates, costs []float64) error {
	n := c.Len()
	if req.BlockSize <= 0 {
		return fmt.Errorf("kv-affinity: %w, got %d", ErrBlockSize, req.BlockSize)
	}
	if err := checkKVColumns(TypeKVAffinity, c, costs); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	loads := c.Load[:n]
	bs := float64(req.BlockSize)
	prompt := float64(req.PromptTokens) / bs
	overlap := c.OverlapBlocks[:n]
	capacity := c.TotalKVBlocks[:n]
	costs = costs[:n]
	// One pass writes the costs with the prefix credited and gathers the
	// in-flight counts' range and sum; the imbalance switch, which those
	// decide after the pass, rarely turns the credit off, and then a
	// second pass writes the costs again without it.
	minActive, maxActive, sumActive := s.costs(loads, overlap, capacity, costs, bs, prompt, s.affinity)
	if s.affinity != 0 && s.balanceRel > 0 && float64(maxActive-minActive) > s.balanceAbs && float64(maxActive) > s.balanceRel*float64(minActive) {
		s.costs(loads, overlap, capacity, costs, bs, prompt, 0)
	}
	bound := s.spillFactor*float64(sumActive)/float64(n) + 1
	spill := s.spillFactor > 0 && float64(maxActive) > bound
	if !spill {
		return nil
	}
	lo, hi := costs[0], costs[0]
	for _, cost := range costs {
		if cost < lo {
			lo = cost
		}
		if cost > hi {
			hi = cost
		}
	}
	over := hi - lo + 1 // ranks a worker over the bound after every worker within it
	for i := range loads {
		if float64(loads[i].ActiveRequests) > bound {
			costs[i] += over
		}
	}
	return nil
}

// costs writes each row's cost with the given prefix credit (affinity
// prefill blocks per held block) into costs, bs being the request's block
// size and prompt its length in blocks, and returns the smallest, the
// largest and the sum of the rows' in-flight request counts.
func (s *KVAffinity) costs(loads []shared.Load, overlap []int32, capacity []int64, costs []float64, bs, prompt, affinity float64) (minActive, maxActive, sumActive int64) {
	minActive, maxActive = loads[0].ActiveRequests, loads[0].ActiveRequests
	for i := range loads {
		l := &loads[i]
		a := l.ActiveRequests
		minActive = min(minActive, a)
		maxActive = max(maxActive, a)
		sumActive += a
		unsent, decode := kvLoad(l, capacity[i], s.engineLoad)
		pending := float64(l.ActivePrefillTokens)/bs + float64(unsent)*prompt
		costs[i] = pending + prompt - affinity*float64(overlap[i]) + s.decodeWeight*decode
	}
	return minActive, maxActive, sumActive
}

// Interface guard.
var _ shared.Scorer = (*KVAffinity)(nil)
