package builtin

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/shared"
)

func TestNormalizedScore(t *testing.T) {
	// Four workers: waiting 2, 6, (no report), 10; KV usage 0.25, (none),
	// 1.5 (clamped), 0; overlap 0, 2, 5, 9 blocks of 100 tokens.
	c := &shared.Candidates{
		IDs: idsN(4),
		Load: []shared.Load{
			{Waiting: 2, HasWaiting: true, KVUsage: 0.25, HasKVUsage: true},
			{Waiting: 6, HasWaiting: true},
			{KVUsage: 1.5, HasKVUsage: true},
			{Waiting: 10, HasWaiting: true, HasKVUsage: true},
		},
		OverlapBlocks: []int32{0, 2, 5, 9},
	}
	req := &shared.Request{PromptTokens: 800, BlockSize: 100}
	tests := []struct {
		signal string
		want   []float64
	}{
		// llm-d's queue score (10-q)/(10-2): 1, 0.5, unscored (0), 0.
		{SignalQueue, []float64{0, 0.5, 1, 1}},
		// 1 - kv_usage: 0.75, unscored, 0 (clamped), 1.
		{SignalKVUsage, []float64{0.25, 1, 1, 0}},
		// match ratio overlap*100/800: 0, 0.25, 0.625, 1 (capped).
		{SignalPrefixMatch, []float64{1, 0.75, 0.375, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.signal, func(t *testing.T) {
			s, err := NewNormalizedScore(shared.Params{ParamSignal: tt.signal})
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

func TestNormalizedScoreQueueEqual(t *testing.T) {
	// All queues equal: llm-d scores 1 (cost 0); none reported: all cost 1.
	s, _ := NewNormalizedScore(shared.Params{ParamSignal: SignalQueue})
	for _, tt := range []struct {
		loads []shared.Load
		want  []float64
	}{
		{[]shared.Load{{Waiting: 3, HasWaiting: true}, {Waiting: 3, HasWaiting: true}}, []float64{0, 0}},
		{[]shared.Load{{}, {}}, []float64{1, 1}},
		{[]shared.Load{{Waiting: 3, HasWaiting: true}, {}}, []float64{0, 1}},
	} {
		c := &shared.Candidates{IDs: idsN(2), Load: tt.loads}
		costs := make([]float64, 2)
		if err := s.Score(context.Background(), &shared.Request{BlockSize: 16}, c, costs); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tt.want, costs); diff != "" {
			t.Errorf("loads %+v: costs (-want +got):\n%s", tt.loads, diff)
		}
	}
}

// TestNormalizedScoreLLMDProfile sums the three signals with llm-d's
// default weights (queue 2, kv-cache-utilization 2, prefix-cache 3) and
// checks the ranking is llm-d's: the worker holding the prefix wins over
// an idle one only while its queue and usage cost less than its match.
func TestNormalizedScoreLLMDProfile(t *testing.T) {
	c := &shared.Candidates{
		IDs: idsN(3),
		Load: []shared.Load{
			{Waiting: 0, HasWaiting: true, KVUsage: 0.1, HasKVUsage: true},
			{Waiting: 4, HasWaiting: true, KVUsage: 0.5, HasKVUsage: true},
			{Waiting: 8, HasWaiting: true, KVUsage: 0.9, HasKVUsage: true},
		},
		OverlapBlocks: []int32{0, 4, 4},
	}
	req := &shared.Request{PromptTokens: 400, BlockSize: 100}
	sum := make([]float64, 3)
	for _, w := range []struct {
		signal string
		weight float64
	}{{SignalQueue, 2}, {SignalKVUsage, 2}, {SignalPrefixMatch, 3}} {
		s, err := NewNormalizedScore(shared.Params{ParamSignal: w.signal})
		if err != nil {
			t.Fatal(err)
		}
		costs := make([]float64, 3)
		if err := s.Score(context.Background(), req, c, costs); err != nil {
			t.Fatal(err)
		}
		for i := range sum {
			sum[i] += w.weight * costs[i]
		}
	}
	// llm-d scores: 2*1+2*0.9+0 = 3.8; 2*0.5+2*0.5+3 = 5; 0+2*0.1+3 = 3.2.
	// Costs are 7 - score: 3.2, 2, 3.8.
	if diff := cmp.Diff([]float64{3.2, 2, 3.8}, sum, cmpApprox(1e-12)); diff != "" {
		t.Errorf("weighted costs (-want +got):\n%s", diff)
	}
}

func TestNormalizedScoreErrors(t *testing.T) {
	checkNew(t, NormalizedScoreType(), shared.Params{}, ParamSignal)
	checkNew(t, NormalizedScoreType(), shared.Params{ParamSignal: "queue-depth"}, ParamSignal)
	checkNew(t, NormalizedScoreType(), shared.Params{ParamSignal: SignalKVUsage}, "")

	s, _ := NewNormalizedScore(shared.Params{ParamSignal: SignalPrefixMatch})
	if got := s.Inputs(); got != shared.InputCache {
		t.Errorf("prefix-match Inputs = %v, want CACHE", got)
	}
	c := &shared.Candidates{IDs: idsN(2)}
	err := s.Score(context.Background(), &shared.Request{BlockSize: 16}, c, make([]float64, 2))
	if !errors.Is(err, ErrMissingColumn) {
		t.Errorf("missing CACHE: err = %v, want ErrMissingColumn", err)
	}
	c.OverlapBlocks = []int32{1, 2}
	err = s.Score(context.Background(), &shared.Request{}, c, make([]float64, 2))
	if !errors.Is(err, ErrBlockSize) {
		t.Errorf("block size 0: err = %v, want ErrBlockSize", err)
	}
	q, _ := NewNormalizedScore(shared.Params{ParamSignal: SignalQueue})
	if got := q.Inputs(); got != shared.InputLoad {
		t.Errorf("queue Inputs = %v, want LOAD", got)
	}
	if err := q.Score(context.Background(), &shared.Request{BlockSize: 16}, c, make([]float64, 2)); !errors.Is(err, ErrMissingColumn) {
		t.Errorf("missing LOAD: err = %v, want ErrMissingColumn", err)
	}
}
