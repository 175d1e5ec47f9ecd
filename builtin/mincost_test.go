package builtin

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/shared"
)

// TestMinCostZeroTemperature: at T = 0 the pick is always a minimum, and
// every tied minimum is picked about equally often.
func TestMinCostZeroTemperature(t *testing.T) {
	m, err := NewMinCost(seeded(5))
	if err != nil {
		t.Fatal(err)
	}
	costs := []float64{4, 1.5, 9, 1.5, 2, 1.5}
	c := &shared.Candidates{IDs: idsN(len(costs)), Costs: costs}
	seen := map[int]int{}
	for range 6000 {
		row, err := m.Pick(context.Background(), nil, c)
		if err != nil {
			t.Fatal(err)
		}
		if costs[row] != 1.5 {
			t.Fatalf("picked row %d of cost %v, want a minimum (1.5)", row, costs[row])
		}
		seen[row]++
	}
	for row, n := range seen {
		if n < 1700 || n > 2300 {
			t.Errorf("tied row %d picked %d times of 6000, want 2000 ± 300", row, n)
		}
	}
	if len(seen) != 3 {
		t.Errorf("picked rows %v, want all three minima", seen)
	}
}

// TestMinCostSoftmax: at T > 0 the observed frequencies match the weights
// exp(-(c_i - c_min) / ((c_max - c_min) T)) within 0.01 absolute over
// 200000 draws (the binomial standard deviation is at most 0.0012).
func TestMinCostSoftmax(t *testing.T) {
	costs := []float64{10, 12, 20, 15, 10}
	for _, temp := range []float64{0.25, 0.7, 2} {
		m, err := NewMinCost(shared.Params{ParamTemperature: temp, ParamSeed: int64(11)})
		if err != nil {
			t.Fatal(err)
		}
		c := &shared.Candidates{IDs: idsN(len(costs)), Costs: costs}
		const draws = 200000
		counts := make([]float64, len(costs))
		for range draws {
			row, err := m.Pick(context.Background(), nil, c)
			if err != nil {
				t.Fatal(err)
			}
			counts[row]++
		}
		weights := make([]float64, len(costs))
		var total float64
		for i, c := range costs {
			weights[i] = math.Exp(-(c - 10) / ((20 - 10) * temp))
			total += weights[i]
		}
		for i := range weights {
			weights[i] /= total
			counts[i] /= draws
		}
		if diff := cmp.Diff(weights, counts, cmpApprox(0.01)); diff != "" {
			t.Errorf("T=%v frequencies (-want +got):\n%s", temp, diff)
		}
	}
}

// TestMinCostEqualCosts: equal costs (or no scorer) give a uniform draw.
func TestMinCostEqualCosts(t *testing.T) {
	for _, costs := range [][]float64{{3, 3, 3, 3}, nil} {
		for _, temp := range []float64{0, 0.7} {
			m, _ := NewMinCost(shared.Params{ParamTemperature: temp, ParamSeed: int64(1)})
			c := &shared.Candidates{IDs: idsN(4), Costs: costs}
			counts := make([]int, 4)
			for range 8000 {
				row, err := m.Pick(context.Background(), nil, c)
				if err != nil {
					t.Fatal(err)
				}
				counts[row]++
			}
			for row, n := range counts {
				if n < 1800 || n > 2200 {
					t.Errorf("costs %v T=%v: row %d picked %d of 8000, want 2000 ± 200", costs, temp, row, n)
				}
			}
		}
	}
}

// TestMinCostTinyTemperature: a temperature so small that the softmax
// degenerates still picks only minima.
func TestMinCostTinyTemperature(t *testing.T) {
	m, _ := NewMinCost(shared.Params{ParamTemperature: 1e-320, ParamSeed: int64(1)})
	c := &shared.Candidates{IDs: idsN(3), Costs: []float64{1, 1 + 1e-9, 5}}
	for range 500 {
		if row, err := m.Pick(context.Background(), nil, c); err != nil || row != 0 {
			t.Fatalf("Pick = %d, %v; want 0, nil", row, err)
		}
	}
}

func TestMinCostSeedRepeats(t *testing.T) {
	costs := []float64{5, 1, 3, 1, 2, 8, 1}
	c := &shared.Candidates{IDs: idsN(len(costs)), Costs: costs}
	for _, temp := range []float64{0, 0.7} {
		seq := func() []int {
			m, _ := NewMinCost(shared.Params{ParamTemperature: temp, ParamSeed: int64(99)})
			var out []int
			for range 50 {
				row, _ := m.Pick(context.Background(), nil, c)
				out = append(out, row)
			}
			return out
		}
		if diff := cmp.Diff(seq(), seq()); diff != "" {
			t.Errorf("T=%v: same seed, different picks (-first +second):\n%s", temp, diff)
		}
	}
}

func TestMinCostErrors(t *testing.T) {
	for _, temp := range []float64{-0.1, math.NaN(), math.Inf(1)} {
		checkNew(t, MinCostType(), shared.Params{ParamTemperature: temp}, ParamTemperature)
	}
	m, _ := NewMinCost(nil)
	if _, err := m.Pick(context.Background(), nil, &shared.Candidates{}); !errors.Is(err, shared.ErrNoWorkers) {
		t.Errorf("Pick on empty: %v, want ErrNoWorkers", err)
	}
	if _, err := m.Pick(context.Background(), nil, &shared.Candidates{IDs: idsN(2), Costs: []float64{1}}); !errors.Is(err, ErrMissingColumn) {
		t.Errorf("Pick with short costs: %v, want ErrMissingColumn", err)
	}
}

// TestMinCostRotate checks llm-d's round-robin tie-break: tied lowest
// rows are taken in turn, in row order, and an untied minimum is taken
// without moving the rotation.
func TestMinCostRotate(t *testing.T) {
	m, err := NewMinCost(shared.Params{ParamTies: TiesRotate})
	if err != nil {
		t.Fatal(err)
	}
	tied := &shared.Candidates{IDs: idsN(4), Costs: []float64{1, 0.5, 3, 0.5}}
	single := &shared.Candidates{IDs: idsN(3), Costs: []float64{2, 1, 3}}
	var got []int
	for _, c := range []*shared.Candidates{tied, tied, single, tied, tied} {
		row, err := m.Pick(context.Background(), &shared.Request{}, c)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, row)
	}
	if diff := cmp.Diff([]int{1, 3, 1, 1, 3}, got); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	checkNew(t, MinCostType(), shared.Params{ParamTies: "first"}, ParamTies)
}

// onePassLowest is min-cost's temperature-0 pick as a single reservoir
// scan, one draw per tie (the picker's code before the three-pass form):
// the reference TestMinCostLowestMatchesOnePassScan holds lowest to.
func onePassLowest(g stream, costs []float64) int {
	best, low, ties := 0, costs[0], 1
	for i := 1; i < len(costs); i++ {
		switch c := costs[i]; {
		case c < low:
			best, low, ties = i, c, 1
		case c == low:
			ties++
			if g.intn(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// TestMinCostLowestMatchesOnePassScan: the three-pass tie-break picks the
// row a one-pass reservoir scan over the same stream picks, on cost rows
// with few and many distinct values (so ties at a higher cost spend draws
// before a lower cost supersedes them), lengths 1 to 300, 20,000 rows in
// all; and 3,000 picks among 300 tied rows fall about evenly in every
// tenth of them.
func TestMinCostLowestMatchesOnePassScan(t *testing.T) {
	m, err := NewMinCost(seeded(11))
	if err != nil {
		t.Fatal(err)
	}
	src := newRNG(seeded(12))
	spread := map[int]int{}
	for trial := range 20000 {
		n := 1 + src.intn(300)
		levels := 1 + src.intn(4)
		if trial%5 == 0 {
			levels = 1 + src.intn(n)
		}
		costs := make([]float64, n)
		for i := range costs {
			costs[i] = float64(src.intn(levels))
		}
		before := m.rng.state.Load()
		got := m.lowest(costs)
		ref := newRNG(seeded(int64(before)))
		if want := onePassLowest(ref.stream(), costs); got != want {
			t.Fatalf("trial %d (%d rows, %d levels): lowest = row %d, the one-pass scan row %d", trial, n, levels, got, want)
		}
		if m.rng.state.Load() != ref.state.Load() {
			t.Fatalf("trial %d: lowest advanced the generator differently from the one-pass scan", trial)
		}
	}
	tied := make([]float64, 300)
	for range 3000 {
		spread[m.lowest(tied)/30]++
	}
	for decile := range 10 {
		if k := spread[decile]; k < 200 || k > 400 {
			t.Errorf("all-tied picks in rows %d-%d: %d of 3000, want 300 ± 100 (uniform): %v", decile*30, decile*30+29, k, spread)
		}
	}
}
