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
	ParamEngineLoad          = "engine_load"
	ParamCPUWeight           = "cpu_weight"
)

// DefaultCPUWeight is kv-cost's cpu_weight: a block the worker's engine
// holds on its CPU tier is worth 0.8 of a GPU hit. It is llm-d's default
// tier weight (DefaultKVCacheBackendConfig: gpu 1.0, cpu 0.8, in
// pkg/kvcache/backend.go of llm-d/llm-d-router@ebab6879), inside vLLM's
// own measurement of its offloading connector (prompts loaded from CPU
// memory reach their first token 2 to 22 times sooner than recomputed:
// a load costs 5% to 50% of the prefill it saves). See docs/kv-events.md,
// "The CPU tier, and what a CPU-tier hit is worth".
const DefaultCPUWeight = 0.8

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
//	prefill = max(0, (active_prefill_tokens + prompt_tokens)/bs
//	                 - overlap_credit*(overlap_blocks + cpu_weight*cpu_blocks))
//	        + unsent_waiting * prompt_tokens/bs
//	decode  = max(active_decode_blocks, kv_usage * total_kv_blocks)
//	cost    = prefill_load_scale*prefill + decode + decode_request_weight*active_requests
//
// where bs is the request's block size, the division is in float64, and
// active_prefill_tokens, active_decode_blocks and active_requests are the
// router's own bookings from the worker's Load record (LOAD), overlap_blocks
// comes from CACHE and total_kv_blocks from CAPACITY. Lower is better.
//
// cpu_blocks (Candidates.CPUOverlapBlocks, part of CACHE) are the blocks
// right after overlap_blocks that the worker's engine holds on its CPU
// tier, known for a worker whose prefix index follows its engine's KV
// events; the engine loads them instead of computing them, so each is
// credited cpu_weight (DefaultCPUWeight, 0.8) of a GPU block. 0 for
// every other worker, and when the column is nil (an out-of-process
// copy of this scorer: plugins are not sent it), which scores as before
// the CPU tier was known.
//
// The engine's own report (Load.KVUsage, Load.Waiting; engine_load = true,
// the default) enters where it knows more than the bookings:
//
//   - decode: the engine's KV usage times its capacity is the blocks its
//     running requests hold, output blocks included, and requests the
//     router did not send; the bookings count only prompt blocks, but
//     include requests sent since the engine's last report. The larger of
//     the two is taken. Without a KV usage or with capacity unknown
//     (total_kv_blocks 0) decode is the bookings alone.
//   - unsent_waiting = max(0, waiting - active_requests): requests queued at
//     the engine beyond every request the router has in flight there were
//     sent by someone else (or outlived their booking); each is charged one
//     prompt of this request's length, as their lengths are unknown. 0
//     without a waiting count.
//
// This follows Dynamo's KV router, which charges prefill blocks and active
// decode blocks and read the decode blocks from the engines' own
// ForwardPassMetrics (kv_active_blocks) before it tracked them itself, and
// its default worker selector, which also subtracts the engine's normalised
// waiting count; the max of the two views is ours, so that neither a stale
// report nor a missing booking hides load. In replay the simulated engines
// report after every change, so their report is never stale there.
type KVCost struct {
	overlapCredit       float64
	prefillLoadScale    float64
	decodeRequestWeight float64
	engineLoad          bool
	cpuWeight           float64
}

// KVCostType describes the kv-cost scorer.
func KVCostType() shared.TypeInfo {
	return shared.TypeInfo{
		Name:   TypeKVCost,
		Kind:   shared.KindScorer,
		Inputs: shared.InputLoad | shared.InputCache | shared.InputCapacity,
		Params: []shared.ParamSpec{
			{Name: ParamOverlapCredit, Type: shared.Number, Default: 1.0,
				Doc: "Prefill blocks saved per block of the request's prefix the worker already " +
					"holds (overlap_blocks). Unitless, >= 0 and at most 1e6; default 1 (each cached block " +
					"is not prefilled again); 0 ignores the prefix cache."},
			{Name: ParamPrefillLoadScale, Type: shared.Number, Default: 1.0,
				Doc: "Weight of the prefill term (pending prefill blocks) against decode blocks. " +
					"Unitless, >= 0 and at most 1e6; default 1."},
			{Name: ParamDecodeRequestWeight, Type: shared.Number, Default: 0.0,
				Doc: "Cost in blocks added per in-flight request (Load.active_requests). >= 0 and " +
					"at most 1e6; default 0 (request count ignored)."},
			{Name: ParamEngineLoad, Type: shared.Bool, Default: true,
				Doc: "Use the engine's own report: decode blocks are the larger of the booked ones " +
					"and kv_usage*total_kv_blocks, and requests waiting at the engine beyond the " +
					"router's in-flight ones are charged one prompt each. Default true; false " +
					"scores the router's bookings alone."},
			{Name: ParamCPUWeight, Type: shared.Number, Default: DefaultCPUWeight,
				Doc: "Worth of a block the worker's engine holds on its CPU tier (after its GPU hit, " +
					"known from KV events) against a GPU hit: each is credited overlap_credit*cpu_weight. " +
					"Unitless, 0 to 1; default 0.8 (llm-d's CPU tier weight); 0 ignores the CPU tier."},
		},
		Doc: "Scores each worker by (max(0, (active_prefill_tokens + prompt_tokens)/block_size - " +
			"overlap_credit*(overlap_blocks + cpu_weight*cpu_blocks)) + unsent_waiting*prompt_tokens/block_size) * prefill_load_scale + " +
			"max(active_decode_blocks, kv_usage*total_kv_blocks) + decode_request_weight*active_requests, " +
			"in KV blocks, where unsent_waiting = max(0, engine waiting - active_requests); lower is better.",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewKVCost(p) },
	}
}

// NewKVCost returns a kv-cost scorer from p (absent parameters take their
// defaults). A parameter that is NaN, infinite, negative or above 1e6
// (maxKVWeight), or a cpu_weight above 1, fails with a *shared.ParamError
// naming it.
func NewKVCost(p shared.Params) (*KVCost, error) {
	s := &KVCost{
		overlapCredit:       p.Float(ParamOverlapCredit, 1),
		prefillLoadScale:    p.Float(ParamPrefillLoadScale, 1),
		decodeRequestWeight: p.Float(ParamDecodeRequestWeight, 0),
		engineLoad:          p.Bool(ParamEngineLoad, true),
		cpuWeight:           p.Float(ParamCPUWeight, DefaultCPUWeight),
	}
	for _, c := range []struct {
		name string
		v    float64
	}{
		{ParamOverlapCredit, s.overlapCredit},
		{ParamPrefillLoadScale, s.prefillLoadScale},
		{ParamDecodeRequestWeight, s.decodeRequestWeight},
		{ParamCPUWeight, s.cpuWeight},
	} {
		if err := shared.NonNegative(c.name, c.v); err != nil {
			return nil, err
		}
		if c.v > maxKVWeight {
			return nil, &shared.ParamError{Param: c.name, Err: fmt.Errorf("must be at most %g, got %g", maxKVWeight, c.v)}
		}
	}
	if s.cpuWeight > 1 {
		// A CPU-tier block is never worth more than a GPU hit: it is
		// loaded, where a GPU block is used in place.
		return nil, &shared.ParamError{Param: ParamCPUWeight, Err: fmt.Errorf("must be between 0 and 1, got %g", s.cpuWeight)}
	}
	return s, nil
}

// Inputs returns LOAD|CACHE|CAPACITY.
func (*KVCost) Inputs() shared.Inputs {
	return shared.InputLoad | shared.InputCache | shared.InputCapacity
}

// Score writes each row's cost into costs (len(costs) == c.Len()). It fails
// with ErrBlockSize when req.BlockSize <= 0 and with ErrMissingColumn when
// c lacks the Load, OverlapBlocks or TotalKVBlocks column, has a
// CPUOverlapBlocks column of another length (nil is all zeros), or costs
// has the wrong length.
// It does not allocate.
func (s *KVCost) Score(_ context.Context, req *shared.Request, c *shared.Candidates, costs []float64) error {
	n := c.Len()
	if req.BlockSize <= 0 {
		return fmt.Errorf("kv-cost: %w, got %d", ErrBlockSize, req.BlockSize)
	}
	if err := checkKVColumns(TypeKVCost, c, costs); err != nil {
		return err
	}
	cpu := c.CPUOverlapBlocks
	if cpu != nil && len(cpu) != n {
		return fmt.Errorf("%s: %w: CPUOverlapBlocks has %d rows, want %d", TypeKVCost, ErrMissingColumn, len(cpu), n)
	}
	bs := float64(req.BlockSize)
	prompt := float64(req.PromptTokens)
	overlap := c.OverlapBlocks[:n]
	capacity := c.TotalKVBlocks[:n]
	costs = costs[:n]
	for i := range c.Load[:n] {
		// s.cost(l, overlap, ...) written out: the loop over every
		// candidate does not pay a call per row.
		l := &c.Load[i]
		prefill := (float64(l.ActivePrefillTokens)+prompt)/bs - s.overlapCredit*float64(overlap[i])
		if prefill < 0 {
			prefill = 0
		}
		unsent, decode := kvLoad(l, capacity[i], s.engineLoad)
		if unsent > 0 {
			prefill += float64(unsent) * prompt / bs
		}
		costs[i] = s.prefillLoadScale*prefill + decode + s.decodeRequestWeight*float64(l.ActiveRequests)
	}
	// The rows with CPU-tier blocks again, with their credit: a row
	// without them costs exactly what it cost before the CPU tier was
	// known, bit for bit, and a selection without any pays one scan.
	for i, b := range cpu {
		if b > 0 {
			costs[i] = s.cost(&c.Load[i], float64(overlap[i])+s.cpuWeight*float64(b), capacity[i], prompt, bs)
		}
	}
	return nil
}

// cost is one row's cost (Score's loop over every row computes the same
// with held = overlap_blocks): held is the blocks of the request the
// worker holds, GPU blocks plus cpu_weight times CPU-tier blocks;
// capacity its total KV blocks, prompt the request's tokens, bs its
// block size.
func (s *KVCost) cost(l *shared.Load, held float64, capacity int64, prompt, bs float64) float64 {
	prefill := (float64(l.ActivePrefillTokens)+prompt)/bs - s.overlapCredit*held
	if prefill < 0 {
		prefill = 0
	}
	unsent, decode := kvLoad(l, capacity, s.engineLoad)
	if unsent > 0 {
		prefill += float64(unsent) * prompt / bs
	}
	return s.prefillLoadScale*prefill + decode + s.decodeRequestWeight*float64(l.ActiveRequests)
}

// checkKVColumns fails with ErrMissingColumn, naming the scorer type, when
// c lacks the Load, OverlapBlocks or TotalKVBlocks column or costs is not
// c.Len() long: the columns kv-cost and kv-affinity read.
func checkKVColumns(typ string, c *shared.Candidates, costs []float64) error {
	n := c.Len()
	if len(c.Load) != n || len(c.OverlapBlocks) != n || len(c.TotalKVBlocks) != n || len(costs) != n {
		return fmt.Errorf("%s: %w: need LOAD, CACHE and CAPACITY columns and costs of %d rows", typ, ErrMissingColumn, n)
	}
	return nil
}

// kvLoad is what a worker's Load record and capacity (total KV blocks, 0
// unknown) say of its load, as kv-cost and kv-affinity read it: requests
// waiting at the engine beyond the router's in flight there (unsent, 0
// without a waiting count), and its decode blocks, the larger of the
// booked ones and kv_usage*capacity. With engineLoad false the engine's
// report is ignored: unsent is 0 and decode the booked blocks.
func kvLoad(l *shared.Load, capacity int64, engineLoad bool) (unsent int64, decode float64) {
	decode = float64(l.ActiveDecodeBlocks)
	if !engineLoad {
		return 0, decode
	}
	if l.HasWaiting && l.Waiting > l.ActiveRequests {
		unsent = l.Waiting - l.ActiveRequests
	}
	if l.HasKVUsage && capacity > 0 {
		decode = max(decode, l.KVUsage*float64(capacity))
	}
	return unsent, decode
}

// Interface guard.
var _ shared.Scorer = (*KVCost)(nil)
