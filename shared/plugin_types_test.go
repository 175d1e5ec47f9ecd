package shared

import (
	"context"
	"errors"
	"time"
)

// Small components for the plugin side's tests. (The contract tests of the
// whole connection, with more types, are internal/pluginclient's.)

// loadScorer: scale*active_requests + active_decode_blocks - overlap_blocks.
type loadScorer struct{ scale float64 }

func (s *loadScorer) Inputs() Inputs { return InputActiveRequests | InputLoad | InputCache }
func (s *loadScorer) Score(_ context.Context, _ *Request, c *Candidates, costs []float64) error {
	for i := range costs {
		costs[i] = s.scale*float64(c.ActiveRequests[i]) + float64(c.Load[i].ActiveDecodeBlocks) - float64(c.OverlapBlocks[i])
		if c.Load[i].HasKVUsage {
			costs[i] += c.Load[i].KVUsage
		}
	}
	return nil
}

// lowestPicker picks the lowest cost (lowest active requests when there
// are no costs), ties to the lowest row.
type lowestPicker struct{}

func (lowestPicker) Inputs() Inputs { return InputActiveRequests }
func (lowestPicker) Pick(_ context.Context, _ *Request, c *Candidates) (int, error) {
	best := 0
	for i := 1; i < c.Len(); i++ {
		if c.Costs != nil {
			if c.Costs[i] < c.Costs[best] {
				best = i
			}
		} else if c.ActiveRequests[i] < c.ActiveRequests[best] {
			best = i
		}
	}
	return best, nil
}

// panicScorer panics when the request's model is "panic".
type panicScorer struct{}

func (panicScorer) Inputs() Inputs { return 0 }
func (panicScorer) Score(_ context.Context, req *Request, _ *Candidates, costs []float64) error {
	if req.Model == "panic" {
		panic("boom")
	}
	for i := range costs {
		costs[i] = 1
	}
	return nil
}

// testTypes are the types the tests serve.
func testTypes() []TypeInfo {
	return []TypeInfo{
		{
			Name: "load", Kind: KindScorer, Inputs: InputActiveRequests | InputLoad | InputCache,
			Doc: "Active requests times scale plus decode blocks minus overlap.",
			Params: []ParamSpec{
				{Name: "scale", Type: Number, Default: 1.0, Doc: "Weight of active requests."},
				{Name: "offset", Type: Number, Doc: "Unused; must be >= 0 when given."},
				{Name: "window", Type: Duration, Default: 20 * time.Millisecond, Doc: "Unused duration."},
				{Name: "label", Type: String, Doc: "Unused string."},
				{Name: "strict", Type: Bool, Default: false, Doc: "Unused bool."},
			},
			New: func(info InstanceInfo, p Params) (Component, error) {
				var errs []error
				if err := NonNegative("scale", p.Float("scale", 1)); err != nil {
					errs = append(errs, err)
				}
				if err := NonNegative("offset", p.Float("offset", 0)); err != nil {
					errs = append(errs, err)
				}
				if info.Role == "bogus" {
					errs = append(errs, errors.New("role bogus is not served"))
				}
				if err := errors.Join(errs...); err != nil {
					return nil, err
				}
				return &loadScorer{scale: p.Float("scale", 1)}, nil
			},
		},
		{
			Name: "lowest", Kind: KindPicker, Inputs: InputActiveRequests, Doc: "Lowest cost.",
			New: func(InstanceInfo, Params) (Component, error) { return lowestPicker{}, nil },
		},
		{
			Name: "panicky", Kind: KindScorer, Doc: "Panics on model \"panic\".",
			New: func(InstanceInfo, Params) (Component, error) { return panicScorer{}, nil },
		},
	}
}
