package queuedepth

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/shared"
)

func TestQueueDepth(t *testing.T) {
	active := []int64{0, 3, 2, 5}
	load := []shared.Load{
		{Waiting: 4, HasWaiting: true},
		{}, // no engine report: waiting counts as 0
		{Waiting: 9, HasWaiting: false, KVUsage: 0.9, HasKVUsage: true}, // stale value: ignored
		{Waiting: 1, HasWaiting: true, ActivePrefillTokens: 4096, ActiveDecodeBlocks: 100},
	}
	tests := []struct {
		name       string
		params     shared.Params
		wantInputs shared.Inputs
		want       []float64
	}{
		{"default weight 1", nil, shared.InputActiveRequests | shared.InputLoad, []float64{4, 3, 2, 6}},
		{"weight 0.5", shared.Params{ParamWaitingWeight: 0.5}, shared.InputActiveRequests | shared.InputLoad, []float64{2, 3, 2, 5.5}},
		{"weight 2 as an int", shared.Params{ParamWaitingWeight: int64(2)}, shared.InputActiveRequests | shared.InputLoad, []float64{8, 3, 2, 7}},
		{"weight 0: in-flight only", shared.Params{ParamWaitingWeight: 0.0}, shared.InputActiveRequests, []float64{0, 3, 2, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			typ := QueueDepthType()
			inst, err := typ.New(shared.InstanceInfo{}, typ.WithDefaults(tt.params))
			if err != nil {
				t.Fatal(err)
			}
			s := inst.(*QueueDepth)
			if got := s.Inputs(); got != tt.wantInputs {
				t.Errorf("Inputs() = %v, want %v", got, tt.wantInputs)
			}
			c := &shared.Candidates{IDs: []shared.WorkerID{1, 2, 3, 4}, ActiveRequests: active}
			if tt.wantInputs.Has(shared.InputLoad) {
				c.Load = load // the router fills only declared columns
			}
			costs := make([]float64, c.Len())
			if err := s.Score(context.Background(), &shared.Request{}, c, costs); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, costs); diff != "" {
				t.Errorf("costs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestQueueDepthParams(t *testing.T) {
	tests := []struct {
		name    string
		weight  any
		wantErr bool
	}{
		{"zero", 0.0, false},
		{"large", 1e6, false},
		{"negative", -0.1, true},
		{"NaN", math.NaN(), true},
		{"+Inf", math.Inf(1), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewQueueDepth(shared.Params{ParamWaitingWeight: tt.weight})
			if !tt.wantErr {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var pe *shared.ParamError
			if !errors.As(err, &pe) || pe.Param != ParamWaitingWeight {
				t.Fatalf("error %v, want *ParamError for %q", err, ParamWaitingWeight)
			}
		})
	}
}

func TestQueueDepthType(t *testing.T) {
	types := Types()
	if len(types) != 1 {
		t.Fatalf("Types() has %d types, want 1", len(types))
	}
	ti := types[0]
	if ti.Name != TypeQueueDepth || ti.Kind != shared.KindScorer || ti.New == nil || ti.Doc == "" {
		t.Errorf("descriptor %+v", ti)
	}
	spec, ok := ti.Param(ParamWaitingWeight)
	if !ok || spec.Type != shared.Number || spec.Required || spec.Default != 1.0 || spec.Doc == "" {
		t.Errorf("waiting_weight spec %+v", spec)
	}
}

func TestQueueDepthMissingColumn(t *testing.T) {
	s, _ := NewQueueDepth(nil)
	ids := []shared.WorkerID{1, 2}
	for name, c := range map[string]*shared.Candidates{
		"no ACTIVE_REQUESTS": {IDs: ids, Load: make([]shared.Load, 2)},
		"no LOAD":            {IDs: ids, ActiveRequests: []int64{0, 0}},
	} {
		if err := s.Score(context.Background(), nil, c, make([]float64, 2)); !errors.Is(err, ErrMissingColumn) {
			t.Errorf("%s: %v, want ErrMissingColumn", name, err)
		}
	}
	c := &shared.Candidates{IDs: ids, ActiveRequests: []int64{0, 0}, Load: make([]shared.Load, 2)}
	if err := s.Score(context.Background(), nil, c, make([]float64, 1)); !errors.Is(err, ErrMissingColumn) {
		t.Errorf("short costs: %v, want ErrMissingColumn", err)
	}
}

func TestQueueDepthConcurrent(t *testing.T) {
	s, _ := NewQueueDepth(shared.Params{ParamWaitingWeight: 2.0})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			c := &shared.Candidates{
				IDs:            []shared.WorkerID{1},
				ActiveRequests: []int64{int64(g)},
				Load:           []shared.Load{{Waiting: 3, HasWaiting: true}},
			}
			costs := make([]float64, 1)
			for range 500 {
				if err := s.Score(context.Background(), nil, c, costs); err != nil || costs[0] != float64(g)+6 {
					t.Errorf("cost %v, %v; want %d", costs[0], err, g+6)
					return
				}
			}
		})
	}
	wg.Wait()
}
