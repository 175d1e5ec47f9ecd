package shared

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Small components for the plugin contract tests, with the built-in-like
// semantics the tests compare against when run locally.

// maxActiveFilter drops rows with more than max active requests.
type maxActiveFilter struct{ max int64 }

func (f *maxActiveFilter) Inputs() Inputs { return InputActiveRequests }
func (f *maxActiveFilter) Filter(_ context.Context, _ *Request, c *Candidates, keep []bool) error {
	for i, a := range c.ActiveRequests {
		if a > f.max {
			keep[i] = false
		}
	}
	return nil
}

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

// sleepyScorer sleeps d or until ctx is done, then scores 0.
type sleepyScorer struct{ d time.Duration }

func (sleepyScorer) Inputs() Inputs { return 0 }
func (s sleepyScorer) Score(ctx context.Context, _ *Request, _ *Candidates, _ []float64) error {
	select {
	case <-time.After(s.d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// gates are the channels "gated" scorers wait on, by name (the test
// plugin runs in the test's process).
var gates sync.Map // string -> chan struct{}

// newGate registers a gate named after the test and returns its name and
// an idempotent release; the test's cleanup releases it.
func newGate(t *testing.T) (name string, release func()) {
	ch := make(chan struct{})
	name = t.Name()
	gates.Store(name, ch)
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(func() { release(); gates.Delete(name) })
	return name, release
}

// gatedScorer holds its task until its gate is released, whatever its
// context says, then scores 0: a plugin that keeps a task past its
// deadline, for as long as the test wants, whatever the machine's speed.
type gatedScorer struct{ gate chan struct{} }

func (gatedScorer) Inputs() Inputs { return 0 }
func (s gatedScorer) Score(context.Context, *Request, *Candidates, []float64) error {
	<-s.gate
	return nil
}

// notAScorer is a Component that implements no kind interface.
type notAScorer struct{}

func (notAScorer) Inputs() Inputs { return 0 }

// testTypes are the types the in-process test plugin serves.
func testTypes() []TypeInfo {
	return []TypeInfo{
		{
			Name: "max-active", Kind: KindFilter, Inputs: InputActiveRequests,
			Doc: "Drops workers with more than max active requests.",
			Params: []ParamSpec{
				{Name: "max", Type: Int, Default: int64(4), Doc: "Most active requests kept (inclusive)."},
			},
			New: func(_ InstanceInfo, p Params) (Component, error) {
				m := p.Int("max", 4)
				if m < 0 {
					return nil, &ParamError{Param: "max", Err: fmt.Errorf("must be >= 0, got %d", m)}
				}
				return &maxActiveFilter{max: m}, nil
			},
		},
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
		{
			Name: "gated", Kind: KindScorer, Doc: "Holds its task until the test releases its gate.",
			Params: []ParamSpec{{Name: "gate", Type: String, Required: true, Doc: "The gate's name (newGate)."}},
			New: func(_ InstanceInfo, p Params) (Component, error) {
				ch, ok := gates.Load(p.String("gate", ""))
				if !ok {
					return nil, fmt.Errorf("no gate %q", p.String("gate", ""))
				}
				return gatedScorer{gate: ch.(chan struct{})}, nil
			},
		},
		{
			Name: "sleepy", Kind: KindScorer, Doc: "Sleeps, or until its context ends.",
			Params: []ParamSpec{{Name: "sleep", Type: Duration, Required: true, Doc: "How long to sleep."}},
			New: func(_ InstanceInfo, p Params) (Component, error) {
				return sleepyScorer{d: p.Duration("sleep", 0)}, nil
			},
		},
		{
			Name: "liar", Kind: KindScorer, Doc: "Claims to be a scorer but is not.",
			New: func(InstanceInfo, Params) (Component, error) { return notAScorer{}, nil },
		},
	}
}
