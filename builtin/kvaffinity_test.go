package builtin

import (
	"context"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/shared"
)

// scoreKVAffinity builds a kv-affinity scorer from params and scores c.
func scoreKVAffinity(t *testing.T, params shared.Params, req *shared.Request, c *shared.Candidates) []float64 {
	t.Helper()
	s, err := NewKVAffinity(params)
	if err != nil {
		t.Fatal(err)
	}
	costs := make([]float64, c.Len())
	if err := s.Score(context.Background(), req, c, costs); err != nil {
		t.Fatal(err)
	}
	return costs
}

func TestKVAffinityScore(t *testing.T) {
	// Four workers; request of 1000 tokens, block size 100 (10 blocks).
	// In-flight counts 0, 4, 2, 1: mean 1.75, spill bound 2*1.75+1 = 4.5,
	// nobody over it; max-min 4 <= 32: balanced.
	c := &shared.Candidates{
		IDs: idsN(4),
		Load: []shared.Load{
			{ActivePrefillTokens: 0, ActiveDecodeBlocks: 0, ActiveRequests: 0},
			{ActivePrefillTokens: 500, ActiveDecodeBlocks: 32, ActiveRequests: 4},
			{ActivePrefillTokens: 50, ActiveDecodeBlocks: 8, ActiveRequests: 2},
			{ActivePrefillTokens: 250, ActiveDecodeBlocks: 16, ActiveRequests: 1},
		},
		OverlapBlocks: []int32{0, 4, 2, 3},
		TotalKVBlocks: []int64{100, 100, 100, 100},
	}
	req := &shared.Request{PromptTokens: 1000, BlockSize: 100}
	for _, tt := range []struct {
		name   string
		params shared.Params
		want   []float64
	}{
		// pending + 10 - 4*overlap + decode/32:
		// 0+10-0+0, 5+10-16+1, 0.5+10-8+0.25, 2.5+10-12+0.5
		{"defaults", nil, []float64{10, 0, 2.75, 1}},
		// Credit only this request's saving: the second worker's queued
		// prefill and decode now outweigh its prefix.
		{"affinity 1", shared.Params{ParamAffinity: 1.0}, []float64{10, 12, 8.75, 10}},
		{"no decode weight", shared.Params{ParamDecodeWeight: 0.0}, []float64{10, -1, 2.5, 0.5}},
		{"kv-cost's weights", shared.Params{ParamAffinity: 1.0, ParamDecodeWeight: 1.0},
			[]float64{10, 15 - 4 + 32, 10.5 - 2 + 8, 12.5 - 3 + 16}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, scoreKVAffinity(t, tt.params, req, c)); diff != "" {
				t.Errorf("costs (-want +got):\n%s", diff)
			}
		})
	}
}

// TestKVAffinitySpill: a worker over spill_factor*mean+1 in-flight
// requests ranks after every worker within the bound, however much of the
// prompt it holds; when all are over, their order is kept.
func TestKVAffinitySpill(t *testing.T) {
	// 1000-token prompt, block size 100. The holder has 9 of its blocks
	// and 10 requests in flight, the others 1 and 2. Mean 13/3, bound
	// 2*13/3+1 = 9.67: the holder is over it.
	c := &shared.Candidates{
		IDs: idsN(3),
		Load: []shared.Load{
			{ActivePrefillTokens: 100, ActiveRequests: 10},
			{ActivePrefillTokens: 300, ActiveRequests: 1},
			{ActivePrefillTokens: 200, ActiveRequests: 2},
		},
		OverlapBlocks: []int32{9, 0, 0},
		TotalKVBlocks: []int64{100, 100, 100},
	}
	req := &shared.Request{PromptTokens: 1000, BlockSize: 100}
	// Without the bound the holder wins: 1+10-36 = -25 against 13 and 12.
	if got, want := scoreKVAffinity(t, shared.Params{ParamSpillFactor: 0.0}, req, c), []float64{-25, 13, 12}; !cmp.Equal(got, want) {
		t.Fatalf("no spill: costs %v, want %v", got, want)
	}
	// With it the holder costs -25 + (13 - -25 + 1) = 14, behind both.
	if got, want := scoreKVAffinity(t, nil, req, c), []float64{14, 13, 12}; !cmp.Equal(got, want) {
		t.Fatalf("spill: costs %v, want %v", got, want)
	}
	// A looser bound (factor 3: 3*13/3+1 = 14) keeps the holder.
	if got, want := scoreKVAffinity(t, shared.Params{ParamSpillFactor: 3.0}, req, c), []float64{-25, 13, 12}; !cmp.Equal(got, want) {
		t.Fatalf("spill factor 3: costs %v, want %v", got, want)
	}
	// An idle fleet spills nothing: the +1 keeps a single request from
	// counting as over a mean of 1/3.
	idle := &shared.Candidates{IDs: idsN(3), Load: []shared.Load{{ActiveRequests: 1}, {}, {}},
		OverlapBlocks: []int32{9, 0, 0}, TotalKVBlocks: []int64{100, 100, 100}}
	if got, want := scoreKVAffinity(t, nil, req, idle), []float64{-26, 10, 10}; !cmp.Equal(got, want) {
		t.Fatalf("idle fleet: costs %v, want %v", got, want)
	}
}

// TestKVAffinityImbalance: when the in-flight counts differ by more than
// balance_abs and the largest exceeds balance_rel times the smallest, the
// prefix is ignored and the least pending work wins; either condition
// alone keeps the prefix.
func TestKVAffinityImbalance(t *testing.T) {
	req := &shared.Request{PromptTokens: 1000, BlockSize: 100}
	cands := func(a, b int64) *shared.Candidates {
		return &shared.Candidates{
			IDs: idsN(2),
			Load: []shared.Load{
				{ActivePrefillTokens: 800, ActiveRequests: a},
				{ActivePrefillTokens: 0, ActiveRequests: b},
			},
			OverlapBlocks: []int32{5, 0},
			TotalKVBlocks: []int64{100, 100},
		}
	}
	noSpill := func(p shared.Params) shared.Params { p[ParamSpillFactor] = 0.0; return p }
	for _, tt := range []struct {
		name   string
		a, b   int64
		params shared.Params
		want   []float64
	}{
		// 40 - 5 = 35 > 32 and 40 > 2*5: imbalanced, affinity 0: 8+10, 10.
		{"imbalanced", 40, 5, noSpill(shared.Params{}), []float64{18, 10}},
		// Gap 15 <= 32: balanced, 8+10-20 = -2.
		{"small gap", 40, 25, noSpill(shared.Params{}), []float64{-2, 10}},
		// Gap 35 > 32, but 50 <= 4*15: balanced.
		{"relative below", 50, 15, noSpill(shared.Params{ParamBalanceRel: 4.0}), []float64{-2, 10}},
		{"switch off", 40, 5, noSpill(shared.Params{ParamBalanceRel: 0.0}), []float64{-2, 10}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, scoreKVAffinity(t, tt.params, req, cands(tt.a, tt.b))); diff != "" {
				t.Errorf("costs (-want +got):\n%s", diff)
			}
		})
	}
}

// TestKVAffinityEngineLoad: the engine's report enters as in kv-cost, with
// decode weighed by decode_weight.
func TestKVAffinityEngineLoad(t *testing.T) {
	c := &shared.Candidates{
		IDs: idsN(3),
		Load: []shared.Load{
			// usage 0.64 of 100 = 64 > booked 16: decode 64/32 = 2.
			{ActiveDecodeBlocks: 16, ActiveRequests: 2, KVUsage: 0.64, HasKVUsage: true},
			// waiting 5 > 2 in flight: 3 unsent prompts = 30 blocks.
			{ActiveDecodeBlocks: 16, ActiveRequests: 2, Waiting: 5, HasWaiting: true},
			// capacity unknown: usage ignored.
			{ActiveDecodeBlocks: 16, ActiveRequests: 2, KVUsage: 0.9, HasKVUsage: true},
		},
		OverlapBlocks: make([]int32, 3),
		TotalKVBlocks: []int64{100, 100, 0},
	}
	req := &shared.Request{PromptTokens: 1000, BlockSize: 100}
	if got, want := scoreKVAffinity(t, nil, req, c), []float64{12, 40.5, 10.5}; !cmp.Equal(got, want) {
		t.Errorf("engine load: costs %v, want %v", got, want)
	}
	if got, want := scoreKVAffinity(t, shared.Params{ParamEngineLoad: false}, req, c), []float64{10.5, 10.5, 10.5}; !cmp.Equal(got, want) {
		t.Errorf("bookings only: costs %v, want %v", got, want)
	}
}

func TestKVAffinityParams(t *testing.T) {
	for _, tt := range []struct {
		name      string
		params    shared.Params
		wantParam string // "" for success
	}{
		{"defaults", nil, ""},
		{"all off", shared.Params{ParamAffinity: 0.0, ParamDecodeWeight: 0.0, ParamSpillFactor: 0.0, ParamBalanceAbs: 0.0, ParamBalanceRel: 0.0}, ""},
		{"negative affinity", shared.Params{ParamAffinity: -1.0}, ParamAffinity},
		{"NaN decode weight", shared.Params{ParamDecodeWeight: math.NaN()}, ParamDecodeWeight},
		{"spill below 1", shared.Params{ParamSpillFactor: 0.5}, ParamSpillFactor},
		{"infinite spill", shared.Params{ParamSpillFactor: math.Inf(1)}, ParamSpillFactor},
		{"rel below 1", shared.Params{ParamBalanceRel: 0.9}, ParamBalanceRel},
		{"negative abs", shared.Params{ParamBalanceAbs: -2.0}, ParamBalanceAbs},
		// Finite but so large that a cost overflows to ±Inf and every
		// selection with a cached prefix or decode load would fail.
		{"huge affinity", shared.Params{ParamAffinity: 1e308}, ParamAffinity},
		{"huge decode weight", shared.Params{ParamDecodeWeight: 1e308}, ParamDecodeWeight},
		{"affinity over the bound", shared.Params{ParamAffinity: 1e6 + 1}, ParamAffinity},
		{"weights at the bound", shared.Params{ParamAffinity: 1e6, ParamDecodeWeight: 1e6}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) { checkNew(t, KVAffinityType(), tt.params, tt.wantParam) })
	}
}

// At the largest weights allowed, with inputs at their extremes (2^31
// tokens prompted, queued and held, a full engine of 2^24 blocks), every
// cost is finite and the spilled worker, the cheapest before the spill,
// still ranks last.
func TestKVAffinityLargestWeightsStayFinite(t *testing.T) {
	c := &shared.Candidates{
		IDs: idsN(3),
		Load: []shared.Load{
			{ActivePrefillTokens: math.MaxInt32, ActiveDecodeBlocks: math.MaxInt32, ActiveRequests: 0, HasKVUsage: true, KVUsage: 1},
			{ActiveRequests: 0},
			{ActivePrefillTokens: math.MaxInt32, ActiveRequests: 10},
		},
		OverlapBlocks: []int32{math.MaxInt32, 0, math.MaxInt32},
		TotalKVBlocks: []int64{1 << 24, 1 << 24, 1 << 24},
	}
	req := &shared.Request{PromptTokens: math.MaxInt32, BlockSize: 1}
	costs := scoreKVAffinity(t, shared.Params{ParamAffinity: 1e6, ParamDecodeWeight: 1e6}, req, c)
	for i, v := range costs {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Fatalf("cost %d = %v, want finite (costs %v)", i, v, costs)
		}
	}
	if costs[2] <= max(costs[0], costs[1]) {
		t.Fatalf("costs %v: worker 2 is over the spill bound and should cost the most", costs)
	}
}

func TestKVAffinityErrors(t *testing.T) {
	s, _ := NewKVAffinity(nil)
	checkKVScorerErrors(t, s)
}
