package builtin

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/shared"
)

func TestBusyFilter(t *testing.T) {
	c := &shared.Candidates{
		IDs:            idsN(5),
		ActiveRequests: []int64{0, 3, 4, 9, 2},
		Load: []shared.Load{
			{KVUsage: 0.95, HasKVUsage: true},
			{KVUsage: 0.5, HasKVUsage: true},
			{},                                 // no report: never dropped for KV
			{KVUsage: 0.99, HasKVUsage: false}, // stale value, not reported
			{KVUsage: 0.9, HasKVUsage: true},
		},
	}
	tests := []struct {
		name       string
		params     shared.Params
		wantInputs shared.Inputs
		wantKeep   []bool
	}{
		{"requests", shared.Params{ParamMaxActiveRequests: int64(4)}, shared.InputActiveRequests,
			[]bool{true, true, false, false, true}},
		{"kv usage", shared.Params{ParamMaxKVUsage: 0.9}, shared.InputLoad,
			[]bool{false, true, true, true, false}},
		{"both", shared.Params{ParamMaxActiveRequests: int64(4), ParamMaxKVUsage: 0.9},
			shared.InputActiveRequests | shared.InputLoad,
			[]bool{false, true, false, false, false}},
		{"kv usage 1", shared.Params{ParamMaxKVUsage: 1.0}, shared.InputLoad,
			[]bool{true, true, true, true, true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := NewBusy(tt.params)
			if err != nil {
				t.Fatal(err)
			}
			if got := b.Inputs(); got != tt.wantInputs {
				t.Errorf("Inputs() = %v, want %v", got, tt.wantInputs)
			}
			keep := []bool{true, true, true, true, true}
			if err := b.Filter(context.Background(), nil, c, keep); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantKeep, keep); diff != "" {
				t.Errorf("keep (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBusyParams(t *testing.T) {
	tests := []struct {
		name      string
		params    shared.Params
		wantParam string
	}{
		{"requests only", shared.Params{ParamMaxActiveRequests: int64(1)}, ""},
		{"kv only", shared.Params{ParamMaxKVUsage: 0.01}, ""},
		{"neither", nil, ParamMaxActiveRequests},
		{"requests 0", shared.Params{ParamMaxActiveRequests: int64(0)}, ParamMaxActiveRequests},
		{"kv 0", shared.Params{ParamMaxKVUsage: 0.0}, ParamMaxKVUsage},
		{"kv over 1", shared.Params{ParamMaxKVUsage: 1.5}, ParamMaxKVUsage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkNew(t, BusyType(), tt.params, tt.wantParam) })
	}
}

func TestBusyMissingColumn(t *testing.T) {
	b, _ := NewBusy(shared.Params{ParamMaxKVUsage: 0.5})
	err := b.Filter(context.Background(), nil, &shared.Candidates{IDs: idsN(1)}, []bool{true})
	if !errors.Is(err, ErrMissingColumn) {
		t.Errorf("Filter without LOAD: %v, want ErrMissingColumn", err)
	}
}
