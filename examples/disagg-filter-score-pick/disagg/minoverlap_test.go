package disagg

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/shared"
)

func TestMinOverlapFilter(t *testing.T) {
	overlap := []int32{0, 1, 2, 3, 7}
	tests := []struct {
		name string
		min  float64
		want []bool
	}{
		{"0 keeps all", 0, []bool{true, true, true, true, true}},
		{"1", 1, []bool{false, true, true, true, true}},
		{"2 inclusive", 2, []bool{false, false, true, true, true}},
		{"fraction rounds up", 2.5, []bool{false, false, false, true, true}},
		{"just above 2", math.Nextafter(2, 3), []bool{false, false, false, true, true}},
		{"7 exactly", 7, []bool{false, false, false, false, true}},
		{"above all keeps none", 8, []bool{false, false, false, false, false}},
		{"huge", 1e300, []bool{false, false, false, false, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := NewMinOverlap(prefill, shared.Params{ParamMinDeviceOverlapBlocks: tt.min})
			if err != nil {
				t.Fatal(err)
			}
			c := &shared.Candidates{IDs: idsN(len(overlap)), OverlapBlocks: overlap}
			keep := []bool{true, true, true, true, true}
			if err := f.Filter(context.Background(), &shared.Request{BlockSize: 16}, c, keep); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, keep); diff != "" {
				t.Errorf("keep (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMinOverlapLeavesDroppedRowsDropped(t *testing.T) {
	f, _ := NewMinOverlap(decode, shared.Params{ParamMinDeviceOverlapBlocks: 1.0})
	c := &shared.Candidates{IDs: idsN(3), OverlapBlocks: []int32{5, 0, 5}}
	keep := []bool{false, true, true} // an earlier decision in the same call
	if err := f.Filter(context.Background(), nil, c, keep); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]bool{false, false, true}, keep); diff != "" {
		t.Errorf("keep (-want +got):\n%s", diff)
	}
}

func TestMinOverlapParams(t *testing.T) {
	tests := []struct {
		name      string
		params    shared.Params
		wantParam string
	}{
		{"zero", shared.Params{ParamMinDeviceOverlapBlocks: 0.0}, ""},
		{"int value", shared.Params{ParamMinDeviceOverlapBlocks: int64(3)}, ""},
		{"fraction", shared.Params{ParamMinDeviceOverlapBlocks: 0.5}, ""},
		{"absent", nil, ParamMinDeviceOverlapBlocks},
		{"negative", shared.Params{ParamMinDeviceOverlapBlocks: -1.0}, ParamMinDeviceOverlapBlocks},
		{"tiny negative", shared.Params{ParamMinDeviceOverlapBlocks: -1e-300}, ParamMinDeviceOverlapBlocks},
		{"NaN", shared.Params{ParamMinDeviceOverlapBlocks: math.NaN()}, ParamMinDeviceOverlapBlocks},
		{"+Inf", shared.Params{ParamMinDeviceOverlapBlocks: math.Inf(1)}, ParamMinDeviceOverlapBlocks},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkParamError(t, MinOverlapType(), prefill, tt.params, tt.wantParam)
		})
	}
}

func TestMinOverlapMissingColumn(t *testing.T) {
	f, _ := NewMinOverlap(prefill, shared.Params{ParamMinDeviceOverlapBlocks: 1.0})
	for _, c := range []*shared.Candidates{
		{IDs: idsN(2)},
		{IDs: idsN(2), OverlapBlocks: []int32{1}},
	} {
		if err := f.Filter(context.Background(), nil, c, []bool{true, true}); !errors.Is(err, ErrMissingColumn) {
			t.Errorf("Filter(%+v): %v, want ErrMissingColumn", c, err)
		}
	}
	c := &shared.Candidates{IDs: idsN(2), OverlapBlocks: []int32{1, 2}}
	if err := f.Filter(context.Background(), nil, c, []bool{true}); !errors.Is(err, ErrMissingColumn) {
		t.Errorf("Filter with short keep: %v, want ErrMissingColumn", err)
	}
}
