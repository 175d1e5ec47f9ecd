package builtin

import (
	"context"
	"errors"
	"math"
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkNew(t, KVCostType(), tt.params, tt.wantParam) })
	}
}

func TestKVCostErrors(t *testing.T) {
	s, _ := NewKVCost(nil)
	c := &shared.Candidates{IDs: idsN(1), Load: make([]shared.Load, 1), OverlapBlocks: make([]int32, 1)}
	costs := make([]float64, 1)
	if err := s.Score(context.Background(), &shared.Request{BlockSize: 0}, c, costs); !errors.Is(err, ErrBlockSize) {
		t.Errorf("block size 0: %v, want ErrBlockSize", err)
	}
	noCache := &shared.Candidates{IDs: idsN(1), Load: make([]shared.Load, 1)}
	if err := s.Score(context.Background(), &shared.Request{BlockSize: 16}, noCache, costs); !errors.Is(err, ErrMissingColumn) {
		t.Errorf("no CACHE column: %v, want ErrMissingColumn", err)
	}
	if got := s.Inputs(); got != shared.InputLoad|shared.InputCache {
		t.Errorf("Inputs() = %v, want LOAD|CACHE", got)
	}
}
