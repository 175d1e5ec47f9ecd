package disagg

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/shared"
)

func TestPrefillCost(t *testing.T) {
	// block_size 16 in every case but the last two.
	tests := []struct {
		name      string
		prompt    int
		blockSize int
		pending   []int64 // active_prefill_tokens
		overlap   []int32
		want      []float64
	}{
		// 100 tokens = ceil(100/16) = 7 blocks.
		{"idle, no cache", 100, 16, []int64{0}, []int32{0}, []float64{7}},
		{"idle, partial cache", 100, 16, []int64{0}, []int32{3}, []float64{4}},
		{"idle, whole prompt cached", 100, 16, []int64{0}, []int32{7}, []float64{0}},
		{"overlap beyond the prompt clamps at 0", 100, 16, []int64{0}, []int32{9}, []float64{0}},
		{"pending tokens, fractional blocks", 100, 16, []int64{24}, []int32{0}, []float64{1.5 + 7}},
		{"pending and cache", 100, 16, []int64{40}, []int32{5}, []float64{2.5 + 2}},
		{"exact multiple", 32, 16, []int64{0}, []int32{0}, []float64{2}},
		{"one token over", 33, 16, []int64{0}, []int32{0}, []float64{3}},
		{"empty prompt", 0, 16, []int64{8}, []int32{0}, []float64{0.5}},
		{"several rows", 100, 16,
			[]int64{0, 16, 160, 8},
			[]int32{0, 7, 2, 6},
			[]float64{7, 1, 10 + 5, 0.5 + 1}},
		// 1000 tokens at 512 = 2 blocks; 256 pending tokens = 0.5 block.
		{"mooncake block size", 1000, 512, []int64{256, 0}, []int32{1, 2}, []float64{1.5, 0}},
		{"block size 1", 5, 1, []int64{3}, []int32{2}, []float64{3 + 3}},
	}
	s, err := NewPrefillCost(prefill, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := len(tt.pending)
			c := &shared.Candidates{IDs: idsN(n), Load: make([]shared.Load, n), OverlapBlocks: tt.overlap}
			for i, p := range tt.pending {
				// Other Load fields must not matter.
				c.Load[i] = shared.Load{Available: true, ActivePrefillTokens: p, ActiveDecodeBlocks: 99, ActiveRequests: 7}
			}
			costs := make([]float64, n)
			req := &shared.Request{PromptTokens: tt.prompt, BlockSize: tt.blockSize}
			if err := s.Score(context.Background(), req, c, costs); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, costs); diff != "" {
				t.Errorf("costs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPrefillCostErrors(t *testing.T) {
	s, _ := NewPrefillCost(decode, nil)
	ok := &shared.Candidates{IDs: idsN(1), Load: make([]shared.Load, 1), OverlapBlocks: []int32{0}}
	if err := s.Score(context.Background(), &shared.Request{BlockSize: 0}, ok, make([]float64, 1)); !errors.Is(err, ErrBlockSize) {
		t.Errorf("block size 0: %v, want ErrBlockSize", err)
	}
	for _, c := range []*shared.Candidates{
		{IDs: idsN(1), OverlapBlocks: []int32{0}},
		{IDs: idsN(1), Load: make([]shared.Load, 1)},
	} {
		if err := s.Score(context.Background(), &shared.Request{BlockSize: 16}, c, make([]float64, 1)); !errors.Is(err, ErrMissingColumn) {
			t.Errorf("Score(%+v): %v, want ErrMissingColumn", c, err)
		}
	}
	if err := s.Score(context.Background(), &shared.Request{BlockSize: 16}, ok, nil); !errors.Is(err, ErrMissingColumn) {
		t.Errorf("Score with no costs: %v, want ErrMissingColumn", err)
	}
}
