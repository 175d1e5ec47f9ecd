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
	cpu     []int32
	kv      []int64
	names   []string
	labels  []shared.Labels
	ttft    []float64
	tpot    []float64
	keep    []bool
	costs   []float64
	sum     []float64
}

// Overlap returns a scratch slice of n overlap counts, valid until the
// Scratch's next use.
func (s *Scratch) Overlap(n int) []int32 {
	s.overlap = grow(s.overlap, n)
	return s.overlap
}

// Candidates sizes the columns for n rows, allocating only the columns in
// declared (plus IDs always, and DPRanks when withRanks; CACHE is two
// columns, OverlapBlocks and CPUOverlapBlocks; LABELS two, Names and
// Labels), and returns the
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
		s.cpu = grow(s.cpu, n)
		s.c.CPUOverlapBlocks = s.cpu
	}
	if declared.Has(shared.InputCapacity) {
		s.kv = grow(s.kv, n)
		s.c.TotalKVBlocks = s.kv
	}
	if declared.Has(shared.InputLabels) {
		s.names = grow(s.names, n)
		s.c.Names = s.names
		s.labels = grow(s.labels, n)
		s.c.Labels = s.labels
	}
	if declared.Has(shared.InputLatency) {
		s.ttft = grow(s.ttft, n)
		s.c.PredictedTTFT = s.ttft
		s.tpot = grow(s.tpot, n)
		s.c.PredictedTPOT = s.tpot
	}
	return &s.c
}

func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n, n+n/4)
	}
	return b[:n]
}

// Execute selects one row of c with the compiled policy cp and returns it;
// c is compacted by the filters in place, so the row indexes the compacted
// set. Local components run in declared order; a fused run of out-of-process
// components runs in one call, its kept rows compacted and its costs added
// like any scorer's. Errors: shared.ErrNoWorkers for an empty set,
// shared.ErrAllFiltered (wrapped with the filter's name),
// *shared.NonFiniteCostError, *shared.RowOutOfRangeError, or a component's
// (or run's) own error wrapped with its kind and name.
func Execute(ctx context.Context, cp *Compiled, req *shared.Request, c *shared.Candidates, s *Scratch) (int, error) {
	return execute(ctx, cp, req, c, s, nil)
}

// ExecuteTrace is Execute recording in tr (reset first) what each stage
// did: the candidates each filter (or fused run) left out and the
// weighted cost each scorer (or run with scorers) added to each
// candidate it scored. The components run as for Execute. O(candidates)
// more per stage.
func ExecuteTrace(ctx context.Context, cp *Compiled, req *shared.Request, c *shared.Candidates, s *Scratch, tr *Trace) (int, error) {
	tr.Stages = tr.Stages[:0]
	return execute(ctx, cp, req, c, s, tr)
}

// Trace is what a traced selection did, stage by stage (ExecuteTrace).
type Trace struct {
	// Stages are the stages that ran, in order; the one that failed is
	// the last (with what it did before failing, when anything).
	Stages []TraceStage
}

// TraceStage is one stage of a Trace: a filter, a scorer or a fused run
// of out-of-process members (Kind 0; Name lists them).
type TraceStage struct {
	Kind shared.Kind
	Name string
	// Dropped are the candidates the stage left out.
	Dropped []Candidate
	// Scored are the candidates the stage scored, and Costs the weighted
	// cost it added to each (weight × cost; a run's costs as it gave
	// them).
	Scored []Candidate
	Costs  []float64
}

// Candidate names one row of a candidate set: its worker and rank.
type Candidate struct {
	ID   shared.WorkerID
	Rank uint32
}

func candidateAt(c *shared.Candidates, i int) Candidate {
	k := Candidate{ID: c.IDs[i]}
	if c.DPRanks != nil {
		k.Rank = c.DPRanks[i]
	}
	return k
}

// dropped records a stage that keeps the rows of c that keep says.
func (tr *Trace) dropped(kind shared.Kind, name string, c *shared.Candidates, keep []bool) {
	st := TraceStage{Kind: kind, Name: name}
	for i := range c.Len() {
		if !keep[i] {
			st.Dropped = append(st.Dropped, candidateAt(c, i))
		}
	}
	tr.Stages = append(tr.Stages, st)
}

// scored records a stage that added weight × costs to c's rows; it
// joins the stage just recorded when that is the same fused run.
func (tr *Trace) scored(kind shared.Kind, name string, c *shared.Candidates, weight float64, costs []float64) {
	var st *TraceStage
	if n := len(tr.Stages); kind == 0 && n > 0 && tr.Stages[n-1].Kind == 0 && tr.Stages[n-1].Name == name && tr.Stages[n-1].Scored == nil {
		st = &tr.Stages[n-1]
	} else {
		tr.Stages = append(tr.Stages, TraceStage{Kind: kind, Name: name})
		st = &tr.Stages[len(tr.Stages)-1]
	}
	for i := range c.Len() {
		st.Scored = append(st.Scored, candidateAt(c, i))
		st.Costs = append(st.Costs, weight*costs[i])
	}
}

func execute(ctx context.Context, cp *Compiled, req *shared.Request, c *shared.Candidates, s *Scratch, tr *Trace) (int, error) {
	if c.Len() == 0 {
		return -1, shared.ErrNoWorkers
	}
	c.Costs = nil
	for si := range cp.stages {
		st := &cp.stages[si]
		switch st.kind {
		case shared.KindFilter:
			n := c.Len()
			s.keep = grow(s.keep, n)
			for i := range s.keep {
				s.keep[i] = true
			}
			if err := st.member.Component.(shared.Filter).Filter(ctx, req, c, s.keep); err != nil {
				return -1, fmt.Errorf("filter %q: %w", st.member.Name, err)
			}
			if tr != nil {
				tr.dropped(shared.KindFilter, st.member.Name, c, s.keep)
			}
			if c.Compact(s.keep) == 0 {
				return -1, fmt.Errorf("filter %q: %w", st.member.Name, shared.ErrAllFiltered)
			}
		case shared.KindScorer:
			n := c.Len()
			if c.Costs == nil {
				// The first scorer writes the running sum itself, weighted
				// in place: one row to clear and one pass, not two of each.
				s.sum = grow(s.sum, n)
				clear(s.sum)
				if err := st.member.Component.(shared.Scorer).Score(ctx, req, c, s.sum); err != nil {
					return -1, fmt.Errorf("scorer %q: %w", st.member.Name, err)
				}
				if tr != nil {
					tr.scored(shared.KindScorer, st.member.Name, c, st.member.Weight, s.sum)
				}
				if err := s.weigh(c, si, st.member.Name, st.member.Weight); err != nil {
					return -1, err
				}
				continue
			}
			s.costs = grow(s.costs, n)
			clear(s.costs)
			if err := st.member.Component.(shared.Scorer).Score(ctx, req, c, s.costs); err != nil {
				return -1, fmt.Errorf("scorer %q: %w", st.member.Name, err)
			}
			if tr != nil {
				tr.scored(shared.KindScorer, st.member.Name, c, st.member.Weight, s.costs)
			}
			if err := s.addCosts(c, si, st.member.Name, st.member.Weight, s.costs); err != nil {
				return -1, err
			}
		case shared.KindPicker:
			row, err := st.member.Component.(shared.Picker).Pick(ctx, req, c)
			if err != nil {
				return -1, fmt.Errorf("picker %q: %w", st.member.Name, err)
			}
			if row < 0 || row >= c.Len() {
				return -1, fmt.Errorf("picker %q: %w", st.member.Name, &shared.RowOutOfRangeError{Row: row, Count: c.Len()})
			}
			return row, nil
		default:
			row, done, err := s.runFused(ctx, st, si, req, c, tr)
			if err != nil || done {
				return row, err
			}
		}
	}
	return -1, fmt.Errorf("policy %q has no picker", cp.Policy.Name)
}

// weigh makes the first scorer's costs, written in s.sum, the running
// sum: weight*cost each, which must be finite (as addCosts checks), and
// sets c.Costs to it.
func (s *Scratch) weigh(c *shared.Candidates, si int, name string, weight float64) error {
	sum := s.sum[:c.Len()]
	if weight == 1 {
		// The costs are the sum as they are: only checked. v-v is 0 for
		// a finite v and NaN otherwise, so one NaN in the total says
		// some row is not finite, found then by the loop below.
		// Four sums, so that no add waits on the one before.
		var z0, z1, z2, z3 float64
		i := 0
		for ; i+4 <= len(sum); i += 4 {
			z0 += sum[i] - sum[i]
			z1 += sum[i+1] - sum[i+1]
			z2 += sum[i+2] - sum[i+2]
			z3 += sum[i+3] - sum[i+3]
		}
		for ; i < len(sum); i++ {
			z0 += sum[i] - sum[i]
		}
		if z0+z1+z2+z3 == 0 {
			c.Costs = sum
			return nil
		}
	}
	for i, v := range sum {
		w := weight * v
		if math.IsNaN(w) || math.IsInf(w, 0) {
			return &shared.NonFiniteCostError{Scorer: si, Name: name, Row: i, Cost: v, Sum: w}
		}
		sum[i] = w
	}
	c.Costs = sum
	return nil
}

// addCosts adds weight*costs to the running sum (c.Costs), which must stay
// finite: a finite cost can still overflow once weighted and summed, and the
// sum is what the picker reads.
func (s *Scratch) addCosts(c *shared.Candidates, si int, name string, weight float64, costs []float64) error {
	n := c.Len()
	if c.Costs == nil {
		s.sum = grow(s.sum, n)
		clear(s.sum)
		c.Costs = s.sum
	}
	for i, v := range costs[:n] {
		sum := c.Costs[i] + weight*v
		if math.IsNaN(sum) || math.IsInf(sum, 0) {
			return &shared.NonFiniteCostError{Scorer: si, Name: name, Row: i, Cost: v, Sum: sum}
		}
		c.Costs[i] = sum
	}
	return nil
}

// runFused executes one fused run and applies its result to c. It returns
// the picked row (in the compacted c) and done when the run picked.
func (s *Scratch) runFused(ctx context.Context, st *stage, si int, req *shared.Request, c *shared.Candidates, tr *Trace) (int, bool, error) {
	n := c.Len()
	res, err := st.run.Run(ctx, req, c)
	if err != nil {
		return -1, false, fmt.Errorf("%s: %w", st.names, err)
	}
	if res.FilteredBy != "" {
		if tr != nil {
			s.keep = grow(s.keep, n)
			clear(s.keep)
			tr.dropped(0, res.FilteredBy, c, s.keep)
		}
		return -1, false, fmt.Errorf("filter %q: %w", res.FilteredBy, shared.ErrAllFiltered)
	}
	picked := res.Picked
	if res.Kept != nil {
		s.keep = grow(s.keep, n)
		clear(s.keep)
		prev := -1
		for _, r := range res.Kept {
			if int(r) >= n || int(r) <= prev {
				return -1, false, fmt.Errorf("%s: kept rows not ascending within [0, %d)", st.names, n)
			}
			s.keep[r] = true
			prev = int(r)
		}
		if picked >= 0 {
			if picked >= n || !s.keep[picked] {
				return -1, false, fmt.Errorf("%s: %w", st.names, &shared.RowOutOfRangeError{Row: picked, Count: n})
			}
			kept := 0
			for r := 0; r < picked; r++ {
				if s.keep[r] {
					kept++
				}
			}
			picked = kept
		}
		if tr != nil {
			tr.dropped(0, st.names, c, s.keep)
		}
		if c.Compact(s.keep) == 0 {
			return -1, false, fmt.Errorf("%s: %w", st.names, shared.ErrAllFiltered)
		}
	}
	if st.scores {
		if len(res.Costs) != c.Len() {
			return -1, false, fmt.Errorf("%s: %d costs for %d rows", st.names, len(res.Costs), c.Len())
		}
		if tr != nil {
			tr.scored(0, st.names, c, 1, res.Costs)
		}
		if err := s.addCosts(c, si, st.names, 1, res.Costs); err != nil {
			return -1, false, err
		}
	}
	if !st.picks {
		return -1, false, nil
	}
	if picked < 0 || picked >= c.Len() {
		return -1, false, fmt.Errorf("%s: %w", st.names, &shared.RowOutOfRangeError{Row: res.Picked, Count: n})
	}
	return picked, true, nil
}
