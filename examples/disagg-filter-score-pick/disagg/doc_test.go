package disagg

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/shared"
)

// validParams are parameters every type accepts.
var validParams = shared.Params{ParamMinDeviceOverlapBlocks: 2.0}

func TestTypes(t *testing.T) {
	type desc struct {
		Name   string
		Kind   shared.Kind
		Inputs shared.Inputs
		Params []string
	}
	var got []desc
	for _, ti := range Types() {
		d := desc{Name: ti.Name, Kind: ti.Kind, Inputs: ti.Inputs}
		for _, p := range ti.Params {
			d.Params = append(d.Params, p.Name)
			if p.Doc == "" {
				t.Errorf("%s.%s has no Doc", ti.Name, p.Name)
			}
		}
		if ti.Doc == "" || ti.New == nil {
			t.Errorf("%s: Doc or New missing", ti.Name)
		}
		got = append(got, d)
		// Each instance declares what its type says.
		inst, err := ti.New(prefill, ti.WithDefaults(validParams))
		if err != nil {
			t.Fatalf("%s: New: %v", ti.Name, err)
		}
		if inst.Inputs() != ti.Inputs {
			t.Errorf("%s: instance Inputs %v, type Inputs %v", ti.Name, inst.Inputs(), ti.Inputs)
		}
	}
	want := []desc{
		{TypeMinOverlap, shared.KindFilter, shared.InputCache, []string{ParamMinDeviceOverlapBlocks}},
		{TypePrefillCost, shared.KindScorer, shared.InputLoad | shared.InputCache, nil},
		{TypeDecodeCost, shared.KindScorer, shared.InputLoad, nil},
		{TypeLowestCost, shared.KindPicker, 0, nil},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Types() (-want +got):\n%s", diff)
	}
}

func TestRoleRefused(t *testing.T) {
	for _, ti := range Types() {
		for _, role := range []shared.Role{shared.RolePrefill, shared.RoleDecode, shared.RoleAggregated, "", "both"} {
			t.Run(ti.Name+"/"+string(role), func(t *testing.T) {
				info := shared.InstanceInfo{Name: "x", Role: role, BlockSize: 16}
				inst, err := ti.New(info, ti.WithDefaults(validParams))
				if role == shared.RolePrefill || role == shared.RoleDecode {
					if err != nil || inst == nil {
						t.Fatalf("New in role %q: %v", role, err)
					}
					return
				}
				if err == nil {
					t.Fatalf("New in role %q accepted", role)
				}
				if !errors.Is(err, ErrRole) {
					t.Errorf("error %v does not wrap ErrRole", err)
				}
				var pe *shared.ParamError
				if errors.As(err, &pe) {
					t.Errorf("role refusal is a *ParamError (%v); it must refuse the whole block", err)
				}
				msg := err.Error()
				for _, s := range []string{ti.Name, "allowed roles: prefill, decode"} {
					if !strings.Contains(msg, s) {
						t.Errorf("error %q does not mention %q", msg, s)
					}
				}
				if role != "" && !strings.Contains(msg, `"`+string(role)+`"`) {
					t.Errorf("error %q does not name the role %q", msg, role)
				}
			})
		}
	}
}
