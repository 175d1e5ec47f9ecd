package pluginclient

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/shared"
)

// Small components for the plugin contract tests, with the built-in-like
// semantics the tests compare against when run locally.

// maxActiveFilter drops rows with more than max active requests.
type maxActiveFilter struct{ max int64 }

func (f *maxActiveFilter) Inputs() shared.Inputs { return shared.InputActiveRequests }
func (f *maxActiveFilter) Filter(_ context.Context, _ *shared.Request, c *shared.Candidates, keep []bool) error {
	for i, a := range c.ActiveRequests {
		if a > f.max {
			keep[i] = false
		}
	}
	return nil
}

// loadScorer: scale*active_requests + active_decode_blocks - overlap_blocks.
type loadScorer struct{ scale float64 }

func (s *loadScorer) Inputs() shared.Inputs {
	return shared.InputActiveRequests | shared.InputLoad | shared.InputCache
}
func (s *loadScorer) Score(_ context.Context, _ *shared.Request, c *shared.Candidates, costs []float64) error {
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

func (lowestPicker) Inputs() shared.Inputs { return shared.InputActiveRequests }
func (lowestPicker) Pick(_ context.Context, _ *shared.Request, c *shared.Candidates) (int, error) {
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

func (panicScorer) Inputs() shared.Inputs { return 0 }
func (panicScorer) Score(_ context.Context, req *shared.Request, _ *shared.Candidates, costs []float64) error {
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

func (sleepyScorer) Inputs() shared.Inputs { return 0 }
func (s sleepyScorer) Score(ctx context.Context, _ *shared.Request, _ *shared.Candidates, _ []float64) error {
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

func (gatedScorer) Inputs() shared.Inputs { return 0 }
func (s gatedScorer) Score(context.Context, *shared.Request, *shared.Candidates, []float64) error {
	<-s.gate
	return nil
}

// recorders are where "record" filters copy what they are given, by name
// (the test plugin runs in the test's process).
var recorders sync.Map // string -> *recorder

// recorder holds the request and candidates a "record" filter saw last.
type recorder struct {
	name string
	mu   sync.Mutex
	req  shared.Request
	c    shared.Candidates
}

// newRecorder registers a recorder named after the test.
func newRecorder(t *testing.T) *recorder {
	r := &recorder{name: t.Name()}
	recorders.Store(r.name, r)
	t.Cleanup(func() { recorders.Delete(r.name) })
	return r
}

// last returns deep copies of what the filter saw last.
func (r *recorder) last() (shared.Request, shared.Candidates) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.req, r.c
}

// recordFilter copies the request and candidates it is given into its
// recorder (deeply: the SDK reuses its buffers) and keeps every row.
type recordFilter struct{ r *recorder }

func (recordFilter) Inputs() shared.Inputs { return shared.PluginInputs }
func (f recordFilter) Filter(_ context.Context, req *shared.Request, c *shared.Candidates, _ []bool) error {
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	f.r.req = *req
	f.r.req.BlockHashes = slices.Clone(req.BlockHashes)
	f.r.req.Metadata = maps.Clone(req.Metadata)
	f.r.c = shared.Candidates{IDs: slices.Clone(c.IDs), DPRanks: slices.Clone(c.DPRanks), ActiveRequests: slices.Clone(c.ActiveRequests),
		Load: slices.Clone(c.Load), OverlapBlocks: slices.Clone(c.OverlapBlocks), TotalKVBlocks: slices.Clone(c.TotalKVBlocks), Costs: slices.Clone(c.Costs),
		Names: slices.Clone(c.Names)}
	// Labels are the task's storage, reused by the next task: deep copy.
	for _, l := range c.Labels {
		f.r.c.Labels = append(f.r.c.Labels, slices.Clone(l))
	}
	return nil
}

// notAScorer is a Component that implements no kind interface.
type notAScorer struct{}

func (notAScorer) Inputs() shared.Inputs { return 0 }

// testTypes are the types the in-process test plugin serves.
func testTypes() []shared.TypeInfo {
	return []shared.TypeInfo{
		{
			Name: "max-active", Kind: shared.KindFilter, Inputs: shared.InputActiveRequests,
			Doc: "Drops workers with more than max active requests.",
			Params: []shared.ParamSpec{
				{Name: "max", Type: shared.Int, Default: int64(4), Doc: "Most active requests kept (inclusive)."},
			},
			New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) {
				m := p.Int("max", 4)
				if m < 0 {
					return nil, &shared.ParamError{Param: "max", Err: fmt.Errorf("must be >= 0, got %d", m)}
				}
				return &maxActiveFilter{max: m}, nil
			},
		},
		{
			Name: "load", Kind: shared.KindScorer, Inputs: shared.InputActiveRequests | shared.InputLoad | shared.InputCache,
			Doc: "Active requests times scale plus decode blocks minus overlap.",
			Params: []shared.ParamSpec{
				{Name: "scale", Type: shared.Number, Default: 1.0, Doc: "Weight of active requests."},
				{Name: "offset", Type: shared.Number, Doc: "Unused; must be >= 0 when given."},
				{Name: "window", Type: shared.Duration, Default: 20 * time.Millisecond, Doc: "Unused duration."},
				{Name: "label", Type: shared.String, Doc: "Unused string."},
				{Name: "strict", Type: shared.Bool, Default: false, Doc: "Unused bool."},
			},
			New: func(info shared.InstanceInfo, p shared.Params) (shared.Component, error) {
				var errs []error
				if err := shared.NonNegative("scale", p.Float("scale", 1)); err != nil {
					errs = append(errs, err)
				}
				if err := shared.NonNegative("offset", p.Float("offset", 0)); err != nil {
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
			Name: "lowest", Kind: shared.KindPicker, Inputs: shared.InputActiveRequests, Doc: "Lowest cost.",
			New: func(shared.InstanceInfo, shared.Params) (shared.Component, error) { return lowestPicker{}, nil },
		},
		{
			Name: "panicky", Kind: shared.KindScorer, Doc: "Panics on model \"panic\".",
			New: func(shared.InstanceInfo, shared.Params) (shared.Component, error) { return panicScorer{}, nil },
		},
		{
			Name: "gated", Kind: shared.KindScorer, Doc: "Holds its task until the test releases its gate.",
			Params: []shared.ParamSpec{{Name: "gate", Type: shared.String, Required: true, Doc: "The gate's name (newGate)."}},
			New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) {
				ch, ok := gates.Load(p.String("gate", ""))
				if !ok {
					return nil, fmt.Errorf("no gate %q", p.String("gate", ""))
				}
				return gatedScorer{gate: ch.(chan struct{})}, nil
			},
		},
		{
			Name: "sleepy", Kind: shared.KindScorer, Doc: "Sleeps, or until its context ends.",
			Params: []shared.ParamSpec{{Name: "sleep", Type: shared.Duration, Required: true, Doc: "How long to sleep."}},
			New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) {
				return sleepyScorer{d: p.Duration("sleep", 0)}, nil
			},
		},
		{
			Name: "record", Kind: shared.KindFilter, Inputs: shared.PluginInputs, Doc: "Records what it is given; keeps every row.",
			Params: []shared.ParamSpec{{Name: "recorder", Type: shared.String, Required: true, Doc: "The recorder's name (newRecorder)."}},
			New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) {
				r, ok := recorders.Load(p.String("recorder", ""))
				if !ok {
					return nil, fmt.Errorf("no recorder %q", p.String("recorder", ""))
				}
				return recordFilter{r: r.(*recorder)}, nil
			},
		},
		{
			Name: "liar", Kind: shared.KindScorer, Doc: "Claims to be a scorer but is not.",
			New: func(shared.InstanceInfo, shared.Params) (shared.Component, error) { return notAScorer{}, nil },
		},
	}
}
