package config

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/shared"
)

// Small stand-ins for the built-in types, so these tests do not depend on
// package builtin. Their names and parameters follow docs/policy-file.md.

type testComponent struct {
	inputs shared.Inputs
	params shared.Params
}

func (c *testComponent) Inputs() shared.Inputs { return c.inputs }

type testFilter struct{ testComponent }

func (*testFilter) Filter(context.Context, *shared.Request, *shared.Candidates, []bool) error {
	return nil
}

type testScorer struct{ testComponent }

func (*testScorer) Score(context.Context, *shared.Request, *shared.Candidates, []float64) error {
	return nil
}

type testPicker struct{ testComponent }

func (*testPicker) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	return 0, nil
}

// nonNegative returns a constructor that rejects negative Number params.
func nonNegative(names ...string) func(p shared.Params) error {
	return func(p shared.Params) error {
		for _, n := range names {
			if err := shared.NonNegative(n, p.Float(n, 0)); err != nil {
				return err
			}
		}
		return nil
	}
}

func filterType(name string, in shared.Inputs, params []shared.ParamSpec, check func(shared.Params) error) shared.TypeInfo {
	return shared.TypeInfo{Name: name, Kind: shared.KindFilter, Inputs: in, Params: params,
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) {
			if check != nil {
				if err := check(p); err != nil {
					return nil, err
				}
			}
			return &testFilter{testComponent{in, p}}, nil
		}}
}

func scorerType(name string, in shared.Inputs, params []shared.ParamSpec, check func(shared.Params) error) shared.TypeInfo {
	return shared.TypeInfo{Name: name, Kind: shared.KindScorer, Inputs: in, Params: params,
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) {
			if check != nil {
				if err := check(p); err != nil {
					return nil, err
				}
			}
			return &testScorer{testComponent{in, p}}, nil
		}}
}

func pickerType(name string, in shared.Inputs, params []shared.ParamSpec, check func(shared.Params) error) shared.TypeInfo {
	return shared.TypeInfo{Name: name, Kind: shared.KindPicker, Inputs: in, Params: params,
		New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) {
			if check != nil {
				if err := check(p); err != nil {
					return nil, err
				}
			}
			return &testPicker{testComponent{in, p}}, nil
		}}
}

// testCatalog registers kv-cost, min-cost, least-loaded, round-robin, busy,
// header-priority, plus:
//   - "legacy-least-loaded", a picker declaring OCCUPANCY;
//   - "all-types", a filter with one parameter of each type (count is
//     required);
//   - "broken", a filter whose constructor fails without naming a parameter.
func testCatalog(t testing.TB) *catalog.Catalog {
	t.Helper()
	cat := catalog.New()
	types := []shared.TypeInfo{
		scorerType("kv-affinity", shared.InputLoad|shared.InputCache, []shared.ParamSpec{
			{Name: "affinity", Type: shared.Number, Default: 4.0, Doc: "Credit per cached block."},
		}, nonNegative("affinity")),
		scorerType("kv-cost", shared.InputLoad|shared.InputCache, []shared.ParamSpec{
			{Name: "overlap_credit", Type: shared.Number, Default: 1.0, Doc: "Credit per cached block."},
			{Name: "prefill_load_scale", Type: shared.Number, Default: 1.0},
			{Name: "decode_request_weight", Type: shared.Number, Default: 0.0},
		}, nonNegative("overlap_credit", "prefill_load_scale", "decode_request_weight")),
		pickerType("min-cost", 0, []shared.ParamSpec{
			{Name: "temperature", Type: shared.Number, Default: 0.0, Doc: "Softmax temperature; 0 picks the lowest cost."},
			{Name: "seed", Type: shared.Int},
		}, nonNegative("temperature")),
		pickerType("least-loaded", shared.InputActiveRequests, nil, nil),
		pickerType("round-robin", 0, nil, nil),
		pickerType("legacy-least-loaded", shared.InputOccupancy, nil, nil),
		filterType("busy", shared.InputActiveRequests|shared.InputLoad, []shared.ParamSpec{
			{Name: "max_active_requests", Type: shared.Int},
			{Name: "max_kv_usage", Type: shared.Number},
		}, func(p shared.Params) error {
			if p.Has("max_active_requests") && p.Int("max_active_requests", 0) < 1 {
				return &shared.ParamError{Param: "max_active_requests", Err: fmt.Errorf("must be >= 1")}
			}
			return nil
		}),
		filterType("all-types", 0, []shared.ParamSpec{
			{Name: "ratio", Type: shared.Number, Default: 0.5},
			{Name: "count", Type: shared.Int, Required: true},
			{Name: "enabled", Type: shared.Bool, Default: true},
			{Name: "label", Type: shared.String},
			{Name: "timeout", Type: shared.Duration, Default: time.Second},
			{Name: "prefer", Type: shared.StringList},
			{Name: "weights", Type: shared.NumberList},
			{Name: "tags", Type: shared.StringList, Default: []string{"t"}},
		}, nil),
		filterType("broken", 0, nil, func(shared.Params) error { return fmt.Errorf("out of cheese") }),
		{Name: "header-priority", Kind: shared.KindClassifier, Params: []shared.ParamSpec{
			{Name: "header", Type: shared.String, Default: "x-priority"},
		}, New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) {
			return &testComponent{0, p}, nil
		}},
	}
	for _, ti := range types {
		if err := cat.Register(catalog.SourceBuiltin, ti); err != nil {
			t.Fatal(err)
		}
	}
	return cat
}
