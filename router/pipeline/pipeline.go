// Package pipeline runs one policy over a candidate set: filters in declared
// order, scorers summed with their weights, then the picker. It owns no
// state; per-selection buffers live in a Scratch the caller reuses, so a
// selection in steady state allocates nothing.
package pipeline

import (
	"context"
	"fmt"
	"math"

	"github.com/switchyard-router/switchyard/shared"
)

// Scratch holds the buffers of one selection: the candidate columns, the
// filter keep flags and the scorer cost rows. Not safe for concurrent use;
// pool one per goroutine (sync.Pool).
type Scratch struct {
	c       shared.Candidates
	ids     []shared.WorkerID
	ranks   []uint32
	active  []int64
	load    []shared.Load
	overlap []int32
	kv      []int64
	keep    []bool
	costs   []float64
	sum     []float64
}

// Candidates sizes the columns for n rows, allocating only the columns in
// declared (plus IDs always, and DPRanks when withRanks), and returns the
// candidate set for the caller to fill. The returned pointer is valid until
// the next call.
func (s *Scratch) Candidates(n int, declared shared.Inputs, withRanks bool) *shared.Candidates {
	declared = declared.Normalize()
	s.ids = grow(s.ids, n)
	s.c = shared.Candidates{IDs: s.ids}
	if withRanks {
		s.ranks = grow(s.ranks, n)
		s.c.DPRanks = s.ranks
	}
	if declared.Has(shared.InputActiveRequests) {
		s.active = grow(s.active, n)
		s.c.ActiveRequests = s.active
	}
	if declared.Has(shared.InputLoad) {
		s.load = grow(s.load, n)
		s.c.Load = s.load
	}
	if declared.Has(shared.InputCache) {
		s.overlap = grow(s.overlap, n)
		s.c.OverlapBlocks = s.overlap
	}
	if declared.Has(shared.InputCapacity) {
		s.kv = grow(s.kv, n)
		s.c.TotalKVBlocks = s.kv
	}
	return &s.c
}

func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n, n+n/4)
	}
	return b[:n]
}

// Run selects one row of c with policy p and returns it; c is compacted by
// the filters in place, so the row indexes the compacted set. Errors:
// shared.ErrNoWorkers for an empty set, shared.ErrAllFiltered (wrapped with
// the filter's name), *shared.NonFiniteCostError, *shared.RowOutOfRangeError,
// or a component's own error wrapped with its kind and name.
func Run(ctx context.Context, p *shared.Policy, req *shared.Request, c *shared.Candidates, s *Scratch) (int, error) {
	if c.Len() == 0 {
		return -1, shared.ErrNoWorkers
	}
	for _, f := range p.Filters {
		n := c.Len()
		s.keep = grow(s.keep, n)
		for i := range s.keep {
			s.keep[i] = true
		}
		if err := f.Filter.Filter(ctx, req, c, s.keep); err != nil {
			return -1, fmt.Errorf("filter %q: %w", f.Name, err)
		}
		if c.Compact(s.keep) == 0 {
			return -1, fmt.Errorf("filter %q: %w", f.Name, shared.ErrAllFiltered)
		}
	}
	if len(p.Scorers) > 0 {
		n := c.Len()
		s.sum = grow(s.sum, n)
		s.costs = grow(s.costs, n)
		clear(s.sum)
		c.Costs = s.sum
		for si, sc := range p.Scorers {
			clear(s.costs)
			if err := sc.Scorer.Score(ctx, req, c, s.costs); err != nil {
				return -1, fmt.Errorf("scorer %q: %w", sc.Name, err)
			}
			for i, v := range s.costs {
				sum := s.sum[i] + sc.Weight*v
				// A finite cost can still overflow once weighted and summed;
				// the sum is what the picker reads, so that is what must be
				// finite.
				if math.IsNaN(sum) || math.IsInf(sum, 0) {
					return -1, &shared.NonFiniteCostError{Scorer: si, Name: sc.Name, Row: i, Cost: v, Sum: sum}
				}
				s.sum[i] = sum
			}
		}
	} else {
		c.Costs = nil
	}
	row, err := p.Picker.Pick(ctx, req, c)
	if err != nil {
		return -1, fmt.Errorf("picker %q: %w", p.PickerName, err)
	}
	if row < 0 || row >= c.Len() {
		return -1, fmt.Errorf("picker %q: %w", p.PickerName, &shared.RowOutOfRangeError{Row: row, Count: c.Len()})
	}
	return row, nil
}
