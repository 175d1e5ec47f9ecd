package builtin

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/switchyard-router/switchyard/hosted"
	"github.com/switchyard-router/switchyard/shared"
)

// seeded returns params holding only a seed.
func seeded(seed int64) shared.Params { return shared.Params{ParamSeed: seed} }

// idsN returns n ascending worker ids 10, 20, ...
func idsN(n int) []shared.WorkerID {
	ids := make([]shared.WorkerID, n)
	for i := range ids {
		ids[i] = shared.WorkerID(10 * (i + 1))
	}
	return ids
}

// pickHosted runs one hosted selection over ids and counts.
func pickHosted(p hosted.HostedWorkerPicker, ids []shared.WorkerID, counts []int64) (int, error) {
	var active func(int) int64
	if counts != nil {
		active = func(row int) int64 { return counts[row] }
	}
	v := hosted.NewWorkerInputView(ids, 0, active, 16)
	return hosted.Select(p, &v)
}

// cmpSorted compares int slices as sets.
var cmpSorted = cmpopts.SortSlices(func(a, b int) bool { return a < b })

// cmpApprox compares float64s within an absolute tolerance.
func cmpApprox(tol float64) cmp.Option { return cmpopts.EquateApprox(0, tol) }

// checkNew builds t's type from params and checks the outcome: success when
// wantParam is "", else a *shared.ParamError naming wantParam.
func checkNew(t *testing.T, typ shared.TypeInfo, params shared.Params, wantParam string) {
	t.Helper()
	_, err := typ.New(shared.InstanceInfo{}, params)
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
