package builtin

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync/atomic"

	"github.com/switchyard-router/switchyard/shared"
)

// TypeMinCost is the type name of the MinCost picker.
const TypeMinCost = "min-cost"

// ParamTemperature is the name of the min-cost picker's temperature.
const ParamTemperature = "temperature"

// TiesRotate is the min-cost picker's ties value that rotates among tied
// lowest costs (llm-d's max-score picker); TiesRandom (the default) draws
// uniformly. The parameter is ParamTies.
const TiesRotate = "rotate"

// MinCost picks by the summed scorer costs (Candidates.Costs). At
// temperature 0 it picks a lowest-cost row, uniformly among ties. At
// temperature T > 0 it samples a softmax over range-normalised costs:
//
//	p_i ~ exp(-(c_i - c_min) / ((c_max - c_min) * T))
//
// so the cheapest row has weight 1, the dearest exp(-1/T), independent of
// the costs' scale; when all costs are equal (or the policy has no scorer)
// the draw is uniform. Draws come from the instance's generator, so with a
// seed a single-threaded replay repeats exactly.
//
// A pick makes two passes over the costs (range, then a one-pass weighted
// reservoir draw, Chao 1982) and allocates nothing.
//
// With ties = "rotate" a temperature-0 pick among n tied lowest costs takes
// the (k mod n)-th of them in row order, k a counter of the instance that
// advances by one per tied pick and restarts at 0 when it reaches n: the
// deterministic round-robin tie-break of llm-d's max-score picker
// (github.com/llm-d/llm-d-router pkg/epp/framework/plugins/scheduling/
// picker/maxscore/picker.go @ 0fa77a00202aa8c1bd72a9b3aa5b647e82f2e47f and
// RotateScoredEndpoints in picker/common.go @
// 5155e4cbfb5ce9e7abbca075eb2130cf9492072f), which replaced a random
// shuffle because concurrent requests seeing equal scores converged on one
// endpoint.
type MinCost struct {
	temperature float64
	rotate      bool
	counter     atomic.Int64 // ties = "rotate": the rotation counter
	rng         *rng
}

// MinCostType describes the min-cost picker.
func MinCostType() shared.TypeInfo {
	return shared.TypeInfo{
		Name: TypeMinCost,
		Kind: shared.KindPicker,
		Params: []shared.ParamSpec{
			{Name: ParamTemperature, Type: shared.Number, Default: 0.0,
				Doc: "Softmax temperature over range-normalised costs, unitless, finite, >= 0. " +
					"Default 0: always a lowest-cost candidate (uniform among ties). At T > 0 the " +
					"dearest candidate is exp(1/T) times less likely than the cheapest (T = 1: e times)."},
			{Name: ParamTies, Type: shared.String, Default: TiesRandom,
				Doc: `Ties among the lowest costs at temperature 0: "random" (default, uniform) or ` +
					`"rotate" (round-robin over the tied rows in row order, llm-d's max-score picker).`},
			seedSpec(),
		},
		Doc: "Picks the lowest summed scorer cost (temperature 0, uniform among ties) or samples " +
			"p_i ~ exp(-(c_i - c_min) / ((c_max - c_min) * T)) (temperature T > 0).",
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) { return NewMinCost(p) },
	}
}

// NewMinCost returns a min-cost picker from p. A temperature that is NaN,
// infinite or negative, or a ties other than "random" or "rotate", fails
// with a *shared.ParamError.
func NewMinCost(p shared.Params) (*MinCost, error) {
	t := p.Float(ParamTemperature, 0)
	if err := shared.NonNegative(ParamTemperature, t); err != nil {
		return nil, err
	}
	rotate, err := choice(p, ParamTies, TiesRandom, TiesRotate)
	if err != nil {
		return nil, err
	}
	return &MinCost{temperature: t, rotate: rotate, rng: newRNG(p)}, nil
}

// Inputs returns 0: the picker reads only the costs the scorers wrote.
func (*MinCost) Inputs() shared.Inputs { return 0 }

// Temperature returns the configured temperature.
func (m *MinCost) Temperature() float64 { return m.temperature }

// Pick returns a row of c chosen by cost as the type describes. It fails
// with shared.ErrNoWorkers when c is empty and with ErrMissingColumn when
// c.Costs is non-nil with a length other than c.Len(). A nil c.Costs (no
// scorer) counts as all costs equal.
func (m *MinCost) Pick(_ context.Context, _ *shared.Request, c *shared.Candidates) (int, error) {
	n := c.Len()
	if n == 0 {
		return -1, shared.ErrNoWorkers
	}
	costs := c.Costs
	if costs == nil {
		return m.rng.intn(n), nil
	}
	if len(costs) != n {
		return -1, fmt.Errorf("min-cost: %w: %d costs for %d candidates", ErrMissingColumn, len(costs), n)
	}
	if m.temperature == 0 {
		return m.lowest(costs), nil
	}
	return m.softmax(costs), nil
}

// lowest returns a minimum-cost row, uniform among ties, or rotating among
// them with ties = "rotate". The uniform choice is a reservoir scan (tie j
// replaces the kept row when a draw in [0, j) is 0), evaluated in three
// passes so that it costs one draw per two ties on average rather than one
// per tie: the lowest cost, how many rows hold it and how many draws the
// scan would have spent before its first row; then the winning tie from
// the end (stream.reservoirWinner); then that tie's row, counted from the
// nearer end. It picks the row the one-pass scan picks from the same
// stream (but for the rejection-zone draws reservoirWinner describes,
// under 2.3e-13 a pick).
func (m *MinCost) lowest(costs []float64) int {
	if m.rotate {
		return m.rotated(costs)
	}
	g := m.rng.stream()
	first, last, low, ties, draws, skip := 0, 0, costs[0], 1, 0, 0
	for i := 1; i < len(costs); i++ {
		switch c := costs[i]; {
		case c < low:
			first, last, low, ties, skip = i, i, c, 1, draws
		case c == low:
			last = i
			ties++
			draws++
		}
	}
	if ties == 1 {
		return first
	}
	j := g.reservoirWinner(ties, skip)
	if j <= ties/2 { // the j-th tie from the first row
		for i := first; ; i++ {
			if costs[i] == low {
				if j--; j == 0 {
					return i
				}
			}
		}
	}
	for i, back := last, ties-j; ; i-- { // the (ties-j)-th before the last
		if costs[i] == low {
			if back == 0 {
				return i
			}
			back--
		}
	}
}

// rotated returns the (k mod n)-th of the n rows with the lowest cost, k
// the instance's rotation counter, which it advances (back to 0 at n).
func (m *MinCost) rotated(costs []float64) int {
	low, n := costs[0], 0
	for _, c := range costs {
		switch {
		case c < low:
			low, n = c, 1
		case c == low:
			n++
		}
	}
	if n == 1 {
		return slices.Index(costs, low)
	}
	var rot int64
	for {
		old := m.counter.Load()
		rot = old % int64(n)
		next := old + 1
		if next >= int64(n) {
			next = 0
		}
		if m.counter.CompareAndSwap(old, next) {
			break
		}
	}
	for i, c := range costs {
		if c == low {
			if rot == 0 {
				return i
			}
			rot--
		}
	}
	return 0 // unreachable: n rows cost low
}

// softmax samples row i with weight exp(-(c_i - c_min) * k), k = 1 /
// ((c_max - c_min) * T), by Chao's one-pass weighted reservoir: row i
// replaces the current choice with probability w_i / (w_0 + ... + w_i).
func (m *MinCost) softmax(costs []float64) int {
	low, high := costs[0], costs[0]
	for _, c := range costs[1:] {
		if c < low {
			low = c
		} else if c > high {
			high = c
		}
	}
	span := high - low
	if span == 0 {
		return m.rng.intn(len(costs))
	}
	k := 1 / (span * m.temperature)
	if math.IsInf(k, 0) { // T so small that every weight but the minimum's underflows
		return m.lowest(costs)
	}
	g := m.rng.stream()
	best, total := 0, 0.0
	for i, c := range costs {
		w := math.Exp(-(c - low) * k)
		total += w
		if g.float64()*total < w {
			best = i
		}
	}
	return best
}

// Interface guard.
var _ shared.Picker = (*MinCost)(nil)
