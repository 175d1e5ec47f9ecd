package disagg

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/switchyard-router/switchyard/shared"
)

// row is one candidate row in ascending-id order, before permutation.
type row struct {
	id   shared.WorkerID
	rank uint32
	cost float64
}

// build lays rows out in the order perm gives (perm[i] is the row placed
// at position i); ranks are set when withRanks.
func build(rows []row, perm []int, withCosts, withRanks bool) *shared.Candidates {
	c := &shared.Candidates{}
	for _, p := range perm {
		c.IDs = append(c.IDs, rows[p].id)
		if withRanks {
			c.DPRanks = append(c.DPRanks, rows[p].rank)
		}
		if withCosts {
			c.Costs = append(c.Costs, rows[p].cost)
		}
	}
	return c
}

func TestLowestCost(t *testing.T) {
	tests := []struct {
		name      string
		rows      []row
		withCosts bool
		withRanks bool
		wantID    shared.WorkerID
		wantRank  uint32
	}{
		{"one", []row{{id: 7, cost: 3}}, true, false, 7, 0},
		{"unique minimum", []row{{id: 1, cost: 5}, {id: 2, cost: 2}, {id: 3, cost: 9}}, true, false, 2, 0},
		{"tie goes to lowest id", []row{{id: 4, cost: 3}, {id: 9, cost: 1}, {id: 12, cost: 1}, {id: 30, cost: 1}}, true, false, 9, 0},
		{"all equal", []row{{id: 5, cost: 0}, {id: 6, cost: 0}, {id: 8, cost: 0}}, true, false, 5, 0},
		{"negative and fractional costs", []row{{id: 1, cost: 0.5}, {id: 2, cost: -0.25}, {id: 3, cost: -0.2}}, true, false, 2, 0},
		{"no scorer: lowest id", []row{{id: 3}, {id: 11}, {id: 40}, {id: 41}}, false, false, 3, 0},
		{"tie on id: lowest rank", []row{{id: 2, rank: 0, cost: 4}, {id: 3, rank: 0, cost: 1}, {id: 3, rank: 1, cost: 1}, {id: 5, rank: 2, cost: 1}}, true, true, 3, 0},
		{"ranks, no scorer", []row{{id: 1, rank: 1}, {id: 1, rank: 2}, {id: 2, rank: 0}}, false, true, 1, 1},
	}
	p, err := NewLowestCost(prefill, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Every order of the rows gives the same worker.
			for _, perm := range permutations(len(tt.rows)) {
				c := build(tt.rows, perm, tt.withCosts, tt.withRanks)
				got, err := p.Pick(context.Background(), nil, c)
				if err != nil {
					t.Fatal(err)
				}
				var gotRank uint32
				if c.DPRanks != nil {
					gotRank = c.DPRanks[got]
				}
				if c.IDs[got] != tt.wantID || gotRank != tt.wantRank {
					t.Fatalf("order %v: picked worker %d rank %d, want %d rank %d", perm, c.IDs[got], gotRank, tt.wantID, tt.wantRank)
				}
			}
		})
	}
}

func TestLowestCostErrors(t *testing.T) {
	p, _ := NewLowestCost(decode, nil)
	if _, err := p.Pick(context.Background(), nil, &shared.Candidates{}); !errors.Is(err, shared.ErrNoWorkers) {
		t.Errorf("empty: %v, want ErrNoWorkers", err)
	}
	c := &shared.Candidates{IDs: idsN(2), Costs: []float64{1}}
	if _, err := p.Pick(context.Background(), nil, c); !errors.Is(err, ErrMissingColumn) {
		t.Errorf("short costs: %v, want ErrMissingColumn", err)
	}
}

// TestPolicyEndToEnd runs filter, scorer and picker the way the pipeline
// does (filter, compact, score, pick) on a hand-computed case.
func TestPolicyEndToEnd(t *testing.T) {
	f, _ := NewMinOverlap(prefill, shared.Params{ParamMinDeviceOverlapBlocks: 2.0})
	s, _ := NewPrefillCost(prefill, nil)
	p, _ := NewLowestCost(prefill, nil)
	// 64 tokens at block size 16: 4 blocks.
	req := &shared.Request{PromptTokens: 64, BlockSize: 16}
	c := &shared.Candidates{
		IDs:           []shared.WorkerID{1, 2, 3, 4},
		OverlapBlocks: []int32{1, 2, 4, 3},
		Load: []shared.Load{
			{ActivePrefillTokens: 0},  // dropped: overlap 1 < 2
			{ActivePrefillTokens: 16}, // 1 + (4-2) = 3
			{ActivePrefillTokens: 32}, // 2 + 0 = 2
			{ActivePrefillTokens: 16}, // 1 + 1 = 2: ties with 3, loses on id
		},
	}
	keep := []bool{true, true, true, true}
	if err := f.Filter(context.Background(), req, c, keep); err != nil {
		t.Fatal(err)
	}
	c.Compact(keep)
	c.Costs = make([]float64, c.Len())
	if err := s.Score(context.Background(), req, c, c.Costs); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(c.Costs) != "[3 2 2]" {
		t.Fatalf("costs %v, want [3 2 2]", c.Costs)
	}
	row, err := p.Pick(context.Background(), req, c)
	if err != nil {
		t.Fatal(err)
	}
	if c.IDs[row] != 3 {
		t.Errorf("picked worker %d, want 3", c.IDs[row])
	}
}

// TestConcurrentUse runs every type from many goroutines under -race.
func TestConcurrentUse(t *testing.T) {
	f, _ := NewMinOverlap(decode, shared.Params{ParamMinDeviceOverlapBlocks: 1.0})
	sp, _ := NewPrefillCost(decode, nil)
	sd, _ := NewDecodeCost(decode, nil)
	p, _ := NewLowestCost(decode, nil)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				req := &shared.Request{PromptTokens: 100 + g, BlockSize: 16}
				c := &shared.Candidates{
					IDs:           idsN(3),
					OverlapBlocks: []int32{int32(i % 3), 1, 2},
					Load:          []shared.Load{{ActiveDecodeBlocks: 5}, {ActiveDecodeBlocks: 1}, {ActiveDecodeBlocks: 1}},
				}
				keep := []bool{true, true, true}
				costs, more := make([]float64, 3), make([]float64, 3)
				if f.Filter(context.Background(), req, c, keep) != nil ||
					sp.Score(context.Background(), req, c, costs) != nil ||
					sd.Score(context.Background(), req, c, more) != nil {
					t.Error("component failed")
					return
				}
				c.Costs = []float64{0, more[1], more[2]}
				if row, err := p.Pick(context.Background(), req, c); err != nil || row != 0 {
					t.Errorf("Pick = %d, %v; want 0", row, err)
					return
				}
			}
		})
	}
	wg.Wait()
}
