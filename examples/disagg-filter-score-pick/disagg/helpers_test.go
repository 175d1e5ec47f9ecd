package disagg

import (
	"errors"
	"testing"

	"github.com/switchyard-router/switchyard/shared"
)

// prefill and decode are instance infos for the two allowed roles.
var (
	prefill = shared.InstanceInfo{Name: "prefill/pd/x", Role: shared.RolePrefill, BlockSize: 16}
	decode  = shared.InstanceInfo{Name: "decode/pd/x", Role: shared.RoleDecode, BlockSize: 16}
)

// idsN returns n ascending worker ids 10, 20, ...
func idsN(n int) []shared.WorkerID {
	ids := make([]shared.WorkerID, n)
	for i := range ids {
		ids[i] = shared.WorkerID(10 * (i + 1))
	}
	return ids
}

// permutations returns every ordering of 0..n-1 (n <= 6 in these tests).
func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for at := 0; at <= len(p); at++ {
			q := make([]int, 0, n)
			q = append(q, p[:at]...)
			q = append(q, n-1)
			q = append(q, p[at:]...)
			out = append(out, q)
		}
	}
	return out
}

// checkParamError builds typ for info from params and checks the outcome:
// success when wantParam is "", else a *shared.ParamError naming wantParam.
func checkParamError(t *testing.T, typ shared.TypeInfo, info shared.InstanceInfo, params shared.Params, wantParam string) {
	t.Helper()
	_, err := typ.New(info, typ.WithDefaults(params))
	if wantParam == "" {
		if err != nil {
			t.Fatalf("New(%v): %v", params, err)
		}
		return
	}
	var pe *shared.ParamError
	if !errors.As(err, &pe) || pe.Param != wantParam {
		t.Fatalf("New(%v) error = %v, want *ParamError for %q", params, err, wantParam)
	}
}
