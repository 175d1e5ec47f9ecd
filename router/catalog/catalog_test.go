package catalog

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/switchyard-router/switchyard/shared"
)

// TestRegisterRefusesReservedParams: a type whose parameter the policy
// file's block takes for itself, or whose NUMBER default is not finite, is
// refused with an error naming the type, its source and the parameter.
func TestRegisterRefusesReservedParams(t *testing.T) {
	newComp := func(shared.InstanceInfo, shared.Params) (shared.Component, error) { return nil, context.Canceled }
	for _, tc := range []struct {
		kind  shared.Kind
		param shared.ParamSpec
		is    error
		want  string
	}{
		{shared.KindScorer, shared.ParamSpec{Name: "weight", Type: shared.Number}, ErrReservedParam,
			`registering type "x" from plugin p: parameter "weight": reserved parameter name: a scorer block's "weight" attribute is the block's own, so the parameter could never be set`},
		{shared.KindPicker, shared.ParamSpec{Name: "type", Type: shared.String}, ErrReservedParam,
			`registering type "x" from plugin p: parameter "type": reserved parameter name: a picker block's "type" attribute is the block's own, so the parameter could never be set`},
		{shared.KindFilter, shared.ParamSpec{Name: "limit", Type: shared.Number, Default: math.Inf(-1)}, ErrNonFiniteDefault,
			`registering type "x" from plugin p: parameter "limit": non-finite default -Inf: a NUMBER default must be finite`},
		{shared.KindFilter, shared.ParamSpec{Name: "weight", Type: shared.Number, Default: 1.0}, nil, ""},
	} {
		err := New().Register("plugin p", shared.TypeInfo{Name: "x", Kind: tc.kind, New: newComp, Params: []shared.ParamSpec{tc.param}})
		if tc.is == nil {
			if err != nil {
				t.Errorf("%v parameter %q: %v, want it registered", tc.kind, tc.param.Name, err)
			}
			continue
		}
		if !errors.Is(err, tc.is) || err.Error() != tc.want {
			t.Errorf("%v parameter %q: %v, want %q (%v)", tc.kind, tc.param.Name, err, tc.want, tc.is)
		}
	}
}
