package disagg

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/shared"
)

func TestDecodeCost(t *testing.T) {
	tests := []struct {
		name string
		load []shared.Load
		want []float64
	}{
		{"idle", []shared.Load{{}}, []float64{0}},
		{"blocks only count", []shared.Load{
			{ActiveDecodeBlocks: 12, ActivePrefillTokens: 5000, ActiveRequests: 1},
			{ActiveDecodeBlocks: 3, ActiveRequests: 40, KVUsage: 0.9, HasKVUsage: true},
			{ActiveDecodeBlocks: 0, Waiting: 8, HasWaiting: true},
		}, []float64{12, 3, 0}},
		{"large", []shared.Load{{ActiveDecodeBlocks: 1 << 40}}, []float64{1 << 40}},
	}
	s, err := NewDecodeCost(decode, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := len(tt.load)
			c := &shared.Candidates{IDs: idsN(n), Load: tt.load}
			costs := make([]float64, n)
			// The request is not read: a zero block size is fine.
			if err := s.Score(context.Background(), &shared.Request{}, c, costs); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, costs); diff != "" {
				t.Errorf("costs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeCostMissingColumn(t *testing.T) {
	s, _ := NewDecodeCost(prefill, nil)
	if err := s.Score(context.Background(), nil, &shared.Candidates{IDs: idsN(2)}, make([]float64, 2)); !errors.Is(err, ErrMissingColumn) {
		t.Errorf("no LOAD: %v, want ErrMissingColumn", err)
	}
	c := &shared.Candidates{IDs: idsN(2), Load: make([]shared.Load, 2)}
	if err := s.Score(context.Background(), nil, c, make([]float64, 1)); !errors.Is(err, ErrMissingColumn) {
		t.Errorf("short costs: %v, want ErrMissingColumn", err)
	}
}
