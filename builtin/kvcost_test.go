package builtin

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/shared"
)

func TestKVCostScore(t *testing.T) {
	// Four workers; request of 1000 tokens, block size 100 (10 blocks).
	c := &shared.Candidates{
		IDs: idsN(4),
		Load: []shared.Load{
			{ActivePrefillTokens: 0, ActiveDecodeBlocks: 0, ActiveRequests: 0},
			{ActivePrefillTokens: 500, ActiveDecodeBlocks: 30, ActiveRequests: 4},
			{ActivePrefillTokens: 50, ActiveDecodeBlocks: 7, ActiveRequests: 2},
			{ActivePrefillTokens: 250, ActiveDecodeBlocks: 12, ActiveRequests: 1},
		},
		OverlapBlocks: []int32{0, 4, 20, 3},
		TotalKVBlocks: []int64{100, 100, 100, 100},
	}
	req := &shared.Request{PromptTokens: 1000, BlockSize: 100}
	tests := []struct {
		name   string
		params shared.Params
		want   []float64
	}{
		// prefill = (apt+1000)/100 - ob: 10, 15-4=11, 10.5-20<0 -> 0, 12.5-3=9.5
		{"defaults", nil, []float64{10, 11 + 30, 0 + 7, 9.5 + 12}},
		{"no overlap credit", shared.Params{ParamOverlapCredit: 0.0},
			[]float64{10, 15 + 30, 10.5 + 7, 12.5 + 12}},
		{"half credit, scale 2", shared.Params{ParamOverlapCredit: 0.5, ParamPrefillLoadScale: 2.0},
			// prefill: 10, 15-2=13, 10.5-10=0.5, 12.5-1.5=11
			[]float64{20, 26 + 30, 1 + 7, 22 + 12}},
		{"request weight", shared.Params{ParamDecodeRequestWeight: 2.5},
			[]float64{10, 11 + 30 + 10, 7 + 5, 9.5 + 12 + 2.5}},
		{"int params", shared.Params{ParamPrefillLoadScale: int64(0)},
			[]float64{0, 30, 7, 12}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewKVCost(tt.params)
			if err != nil {
				t.Fatal(err)
			}
			costs := make([]float64, c.Len())
			if err := s.Score(context.Background(), req, c, costs); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, costs); diff != "" {
				t.Errorf("costs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestKVCostParams(t *testing.T) {
	tests := []struct {
		name      string
		params    shared.Params
		wantParam string // "" for success
	}{
		{"defaults", nil, ""},
		{"zeros", shared.Params{ParamOverlapCredit: 0.0, ParamPrefillLoadScale: 0.0, ParamDecodeRequestWeight: 0.0}, ""},
		{"negative credit", shared.Params{ParamOverlapCredit: -1.0}, ParamOverlapCredit},
		{"NaN scale", shared.Params{ParamPrefillLoadScale: math.NaN()}, ParamPrefillLoadScale},
		{"infinite weight", shared.Params{ParamDecodeRequestWeight: math.Inf(1)}, ParamDecodeRequestWeight},
		{"largest weights", shared.Params{ParamOverlapCredit: 1e6, ParamPrefillLoadScale: 1e6, ParamDecodeRequestWeight: 1e6}, ""},
		{"huge scale", shared.Params{ParamPrefillLoadScale: 1e308}, ParamPrefillLoadScale},
		{"huge credit", shared.Params{ParamOverlapCredit: 1e7}, ParamOverlapCredit},
		{"huge request weight", shared.Params{ParamDecodeRequestWeight: 1.5e6}, ParamDecodeRequestWeight},
		{"cpu weight 0", shared.Params{ParamCPUWeight: 0.0}, ""},
		{"cpu weight 1", shared.Params{ParamCPUWeight: int64(1)}, ""},
		{"cpu weight over 1", shared.Params{ParamCPUWeight: 1.01}, ParamCPUWeight},
		{"negative cpu weight", shared.Params{ParamCPUWeight: -0.1}, ParamCPUWeight},
		{"NaN cpu weight", shared.Params{ParamCPUWeight: math.NaN()}, ParamCPUWeight},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkNew(t, KVCostType(), tt.params, tt.wantParam) })
	}
}

func TestKVCostErrors(t *testing.T) {
	s, _ := NewKVCost(nil)
	checkKVScorerErrors(t, s)
	c := &shared.Candidates{IDs: idsN(2), Load: make([]shared.Load, 2), OverlapBlocks: make([]int32, 2),
		CPUOverlapBlocks: make([]int32, 1), TotalKVBlocks: make([]int64, 2)}
	if err := s.Score(context.Background(), &shared.Request{BlockSize: 16}, c, make([]float64, 2)); !errors.Is(err, ErrMissingColumn) {
		t.Errorf("CPUOverlapBlocks of 1 row for 2: %v, want ErrMissingColumn", err)
	}
}

// TestKVCostCPUTier: blocks the worker's engine holds on its CPU tier,
// after its GPU hit, are credited cpu_weight (0.8 by default) of a GPU
// block each. Request of 1000 tokens at block size 100 (10 blocks), idle
// workers: one holding 6 blocks on CPU only, one holding them on GPU, one
// with 4 on GPU and the next 2 on CPU, one holding nothing.
func TestKVCostCPUTier(t *testing.T) {
	c := &shared.Candidates{
		IDs:              idsN(4),
		Load:             make([]shared.Load, 4),
		OverlapBlocks:    []int32{0, 6, 4, 0},
		CPUOverlapBlocks: []int32{6, 0, 2, 0},
		TotalKVBlocks:    []int64{100, 100, 100, 100},
	}
	req := &shared.Request{PromptTokens: 1000, BlockSize: 100}
	// In float64 arithmetic, as the scorer computes (a constant
	// expression would be exact: 5.2 where float64 gives
	// 5.199999999999999).
	w, half := 0.8, 0.5
	for _, tt := range []struct {
		name   string
		params shared.Params
		want   []float64
	}{
		// 10 - 0.8*6 = 5.2; 10 - 6 = 4; 10 - (4 + 0.8*2) = 4.4; 10.
		{"default weight", nil, []float64{10 - w*6, 4, 10 - (4 + w*2), 10}},
		{"weight 0: CPU tier ignored", shared.Params{ParamCPUWeight: 0.0}, []float64{10, 4, 6, 10}},
		{"weight 1: as GPU", shared.Params{ParamCPUWeight: 1.0}, []float64{4, 4, 4, 10}},
		// overlap_credit multiplies both: 10 - 0.5*(0.8*6) = 7.6.
		{"half credit", shared.Params{ParamOverlapCredit: 0.5}, []float64{10 - half*(w*6), 7, 10 - half*(4+w*2), 10}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewKVCost(tt.params)
			if err != nil {
				t.Fatal(err)
			}
			costs := make([]float64, c.Len())
			if err := s.Score(context.Background(), req, c, costs); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, costs); diff != "" {
				t.Errorf("costs (-want +got):\n%s", diff)
			}
		})
	}
	// The CPU-only worker beats the empty one and loses to the GPU one.
	s, _ := NewKVCost(nil)
	costs := make([]float64, c.Len())
	if err := s.Score(context.Background(), req, c, costs); err != nil {
		t.Fatal(err)
	}
	if !(costs[1] < costs[0] && costs[0] < costs[3]) {
		t.Errorf("costs %v: want GPU (row 1) < CPU only (row 0) < empty (row 3)", costs)
	}
	// Without the column (an out-of-process copy of the scorer), or with
	// it all zero, the costs are those of the GPU overlap alone, bit for
	// bit.
	plain := *c
	plain.CPUOverlapBlocks = nil
	zeros := *c
	zeros.CPUOverlapBlocks = make([]int32, 4)
	for _, cc := range []*shared.Candidates{&plain, &zeros} {
		got := make([]float64, 4)
		if err := s.Score(context.Background(), req, cc, got); err != nil {
			t.Fatal(err)
		}
		if want := []float64{10, 4, 6, 10}; !slices.Equal(got, want) {
			t.Errorf("CPUOverlapBlocks %v: costs %v, want %v", cc.CPUOverlapBlocks, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = s.Score(context.Background(), req, c, costs) }); n != 0 {
		t.Errorf("Score allocates %v times per call, want 0", n)
	}
}

// checkKVScorerErrors checks what kv-cost and kv-affinity share: a block
// size <= 0 fails with ErrBlockSize, a missing CACHE or CAPACITY column or
// a costs slice of the wrong length with ErrMissingColumn, no candidates
// is no error, and the inputs are LOAD|CACHE|CAPACITY.
func checkKVScorerErrors(t *testing.T, s shared.Scorer) {
	t.Helper()
	c := &shared.Candidates{IDs: idsN(1), Load: make([]shared.Load, 1), OverlapBlocks: make([]int32, 1), TotalKVBlocks: make([]int64, 1)}
	costs := make([]float64, 1)
	if err := s.Score(context.Background(), &shared.Request{BlockSize: 0}, c, costs); !errors.Is(err, ErrBlockSize) {
		t.Errorf("block size 0: %v, want ErrBlockSize", err)
	}
	noCache := &shared.Candidates{IDs: idsN(1), Load: make([]shared.Load, 1)}
	if err := s.Score(context.Background(), &shared.Request{BlockSize: 16}, noCache, costs); !errors.Is(err, ErrMissingColumn) {
		t.Errorf("no CACHE column: %v, want ErrMissingColumn", err)
	}
	noCapacity := &shared.Candidates{IDs: idsN(1), Load: make([]shared.Load, 1), OverlapBlocks: make([]int32, 1)}
	if err := s.Score(context.Background(), &shared.Request{BlockSize: 16}, noCapacity, costs); !errors.Is(err, ErrMissingColumn) {
		t.Errorf("no CAPACITY column: %v, want ErrMissingColumn", err)
	}
	if err := s.Score(context.Background(), &shared.Request{BlockSize: 16}, c, nil); !errors.Is(err, ErrMissingColumn) {
		t.Errorf("costs of 0 rows: %v, want ErrMissingColumn", err)
	}
	if err := s.Score(context.Background(), &shared.Request{BlockSize: 16}, &shared.Candidates{}, nil); err != nil {
		t.Errorf("no candidates: %v, want nil", err)
	}
	if got := s.Inputs(); got != shared.InputLoad|shared.InputCache|shared.InputCapacity {
		t.Errorf("Inputs() = %v, want LOAD|CACHE|CAPACITY", got)
	}
}

// TestKVCostEngineLoad checks how the engine's report combines with the
// bookings: decode is the larger of booked blocks and kv_usage*capacity
// (capacity 0 = unknown leaves the bookings), and waiting requests beyond
// the router's in-flight ones cost one prompt each.
func TestKVCostEngineLoad(t *testing.T) {
	// Request of 1000 tokens, block size 100 (10 blocks), no overlap.
	c := &shared.Candidates{
		IDs: idsN(5),
		Load: []shared.Load{
			// usage 0.5 of 100 = 50 > booked 20: decode 50.
			{ActiveDecodeBlocks: 20, ActiveRequests: 2, KVUsage: 0.5, HasKVUsage: true},
			// usage 0.1 of 100 = 10 < booked 20: decode 20.
			{ActiveDecodeBlocks: 20, ActiveRequests: 2, KVUsage: 0.1, HasKVUsage: true},
			// capacity unknown: usage ignored, decode 20.
			{ActiveDecodeBlocks: 20, ActiveRequests: 2, KVUsage: 0.9, HasKVUsage: true},
			// waiting 5 > 2 in flight: 3 unsent prompts = 30 prefill blocks.
			{ActiveDecodeBlocks: 20, ActiveRequests: 2, Waiting: 5, HasWaiting: true},
			// waiting 1 <= 2 in flight: nothing added.
			{ActiveDecodeBlocks: 20, ActiveRequests: 2, Waiting: 1, HasWaiting: true},
		},
		OverlapBlocks: make([]int32, 5),
		TotalKVBlocks: []int64{100, 100, 0, 100, 100},
	}
	req := &shared.Request{PromptTokens: 1000, BlockSize: 100}
	for _, tt := range []struct {
		name   string
		params shared.Params
		want   []float64
	}{
		{"engine load", nil, []float64{10 + 50, 10 + 20, 10 + 20, 10 + 30 + 20, 10 + 20}},
		{"bookings only", shared.Params{ParamEngineLoad: false}, []float64{30, 30, 30, 30, 30}},
		{"prefill scale applies to waiting", shared.Params{ParamPrefillLoadScale: 2.0},
			[]float64{20 + 50, 20 + 20, 20 + 20, 80 + 20, 20 + 20}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewKVCost(tt.params)
			if err != nil {
				t.Fatal(err)
			}
			costs := make([]float64, c.Len())
			if err := s.Score(context.Background(), req, c, costs); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, costs); diff != "" {
				t.Errorf("costs (-want +got):\n%s", diff)
			}
		})
	}
}
