package pipeline

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// Test components with function fields, as Nomad's plugin mocks do.
type filterFunc func(c *shared.Candidates, keep []bool) error

func (filterFunc) Inputs() shared.Inputs { return shared.InputActiveRequests }
func (f filterFunc) Filter(_ context.Context, _ *shared.Request, c *shared.Candidates, keep []bool) error {
	return f(c, keep)
}

type scorerFunc func(c *shared.Candidates, costs []float64) error

func (scorerFunc) Inputs() shared.Inputs { return shared.InputActiveRequests }
func (f scorerFunc) Score(_ context.Context, _ *shared.Request, c *shared.Candidates, costs []float64) error {
	return f(c, costs)
}

type pickerFunc func(c *shared.Candidates) (int, error)

func (pickerFunc) Inputs() shared.Inputs { return 0 }
func (f pickerFunc) Pick(_ context.Context, _ *shared.Request, c *shared.Candidates) (int, error) {
	return f(c)
}

// lowest picks the minimum summed cost, first on ties.
var lowest = pickerFunc(func(c *shared.Candidates) (int, error) {
	best := 0
	for i, v := range c.Costs {
		if v < c.Costs[best] {
			best = i
		}
	}
	return best, nil
})

// run compiles p and executes it once.
func run(t *testing.T, p *policy.Policy, c *shared.Candidates, s *Scratch) (int, error) {
	t.Helper()
	cp, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	return Execute(context.Background(), cp, &shared.Request{}, c, s)
}

func candidates(s *Scratch, active ...int64) *shared.Candidates {
	c := s.Candidates(len(active), shared.InputActiveRequests, false)
	for i, a := range active {
		c.IDs[i] = shared.WorkerID(10 + i)
		c.ActiveRequests[i] = a
	}
	return c
}

func TestRunFiltersInOrderThenSumsWeightedCosts(t *testing.T) {
	var seen [][]shared.WorkerID
	record := func(c *shared.Candidates) { seen = append(seen, append([]shared.WorkerID(nil), c.IDs...)) }
	p := &policy.Policy{
		Name: "p",
		Filters: []policy.NamedFilter{
			{Name: "drop-busy", Filter: filterFunc(func(c *shared.Candidates, keep []bool) error {
				record(c)
				for i, a := range c.ActiveRequests {
					keep[i] = a < 5
				}
				return nil
			})},
			{Name: "drop-first", Filter: filterFunc(func(c *shared.Candidates, keep []bool) error {
				record(c)
				keep[0] = false
				return nil
			})},
		},
		Scorers: []policy.WeightedScorer{
			{Name: "active", Weight: 2, Scorer: scorerFunc(func(c *shared.Candidates, costs []float64) error {
				for i, a := range c.ActiveRequests {
					costs[i] = float64(a)
				}
				return nil
			})},
			{Name: "id", Weight: 0.5, Scorer: scorerFunc(func(c *shared.Candidates, costs []float64) error {
				for i, id := range c.IDs {
					costs[i] = float64(id)
				}
				return nil
			})},
		},
		PickerName: "lowest",
		Picker:     lowest,
	}
	var s Scratch
	c := candidates(&s, 1, 9, 3, 2, 7)
	row, err := run(t, p, c, &s)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]shared.WorkerID{{10, 11, 12, 13, 14}, {10, 12, 13}}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Fatalf("filters saw (-want +got):\n%s", diff)
	}
	// Survivors 12 (active 3) and 13 (active 2): costs 2*3+6 = 12, 2*2+6.5 = 10.5.
	if diff := cmp.Diff([]float64{12, 10.5}, c.Costs); diff != "" {
		t.Fatalf("summed costs (-want +got):\n%s", diff)
	}
	if row != 1 || c.IDs[row] != 13 {
		t.Fatalf("picked row %d (worker %d), want row 1 (worker 13)", row, c.IDs[row])
	}
}

func TestRunErrors(t *testing.T) {
	keepNone := filterFunc(func(c *shared.Candidates, keep []bool) error { clear(keep); return nil })
	nan := scorerFunc(func(c *shared.Candidates, costs []float64) error { costs[1] = math.NaN(); return nil })
	boom := errors.New("boom")
	tests := []struct {
		name  string
		p     policy.Policy
		rows  int
		check func(error) bool
	}{
		{"no workers", policy.Policy{Picker: lowest}, 0, func(err error) bool { return errors.Is(err, shared.ErrNoWorkers) }},
		{"all filtered", policy.Policy{Filters: []policy.NamedFilter{{Name: "f", Filter: keepNone}}, Picker: lowest}, 3,
			func(err error) bool { return errors.Is(err, shared.ErrAllFiltered) }},
		{"non-finite cost", policy.Policy{Scorers: []policy.WeightedScorer{{Name: "ok", Weight: 1, Scorer: scorerFunc(func(*shared.Candidates, []float64) error { return nil })}, {Name: "nan", Weight: 1, Scorer: nan}}, Picker: lowest}, 3,
			func(err error) bool {
				var e *shared.NonFiniteCostError
				return errors.As(err, &e) && e.Scorer == 1 && e.Row == 1 && e.Name == "nan"
			}},
		{"non-finite first cost", policy.Policy{Scorers: []policy.WeightedScorer{{Name: "nan", Weight: 2, Scorer: nan}}, Picker: lowest}, 3,
			func(err error) bool {
				var e *shared.NonFiniteCostError
				return errors.As(err, &e) && e.Scorer == 0 && e.Row == 1 && e.Name == "nan" && math.IsNaN(e.Cost)
			}},
		{"non-finite first cost at weight 1", policy.Policy{Scorers: []policy.WeightedScorer{{Name: "nan", Weight: 1, Scorer: nan}}, Picker: lowest}, 3,
			func(err error) bool {
				var e *shared.NonFiniteCostError
				return errors.As(err, &e) && e.Scorer == 0 && e.Row == 1 && e.Name == "nan" && math.IsNaN(e.Cost)
			}},
		// Nine rows: the infinite one is past the weight-1 check's groups of four.
		{"infinite first cost at weight 1 in the last row", policy.Policy{Scorers: []policy.WeightedScorer{{Name: "inf", Weight: 1, Scorer: scorerFunc(func(_ *shared.Candidates, costs []float64) error {
			costs[8] = math.Inf(-1)
			return nil
		})}}, Picker: lowest}, 9,
			func(err error) bool {
				var e *shared.NonFiniteCostError
				return errors.As(err, &e) && e.Row == 8 && math.IsInf(e.Cost, -1)
			}},
		{"weighted sum overflows", policy.Policy{Scorers: []policy.WeightedScorer{{Name: "big", Weight: 1e308, Scorer: scorerFunc(func(_ *shared.Candidates, costs []float64) error {
			costs[2] = 10
			return nil
		})}}, Picker: lowest}, 3,
			func(err error) bool {
				var e *shared.NonFiniteCostError
				return errors.As(err, &e) && e.Row == 2 && e.Cost == 10 && math.IsInf(e.Sum, 1) &&
					e.Error() == "scorer big: cost 10 at row 2 overflows the weighted sum (+Inf)"
			}},
		{"row out of range", policy.Policy{Picker: pickerFunc(func(*shared.Candidates) (int, error) { return 3, nil })}, 3,
			func(err error) bool {
				var e *shared.RowOutOfRangeError
				return errors.As(err, &e) && e.Row == 3 && e.Count == 3
			}},
		{"picker error wrapped", policy.Policy{PickerName: "x", Picker: pickerFunc(func(*shared.Candidates) (int, error) { return 0, boom })}, 3,
			func(err error) bool { return errors.Is(err, boom) && err.Error() == `picker "x": boom` }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s Scratch
			active := make([]int64, tt.rows)
			_, err := run(t, &tt.p, candidates(&s, active...), &s)
			if err == nil || !tt.check(err) {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

func TestRunAllocatesNothingInSteadyState(t *testing.T) {
	p := &policy.Policy{
		Filters: []policy.NamedFilter{{Name: "f", Filter: filterFunc(func(c *shared.Candidates, keep []bool) error { keep[0] = false; return nil })}},
		Scorers: []policy.WeightedScorer{{Name: "s", Weight: 1, Scorer: scorerFunc(func(c *shared.Candidates, costs []float64) error {
			for i, a := range c.ActiveRequests {
				costs[i] = float64(a)
			}
			return nil
		})}},
		Picker: lowest,
	}
	var s Scratch
	req := &shared.Request{}
	ctx := context.Background()
	cp, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		c := candidates(&s, 4, 3, 2, 1)
		if _, err := Execute(ctx, cp, req, c, &s); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("allocs per run = %v, want 0", allocs)
	}
}
