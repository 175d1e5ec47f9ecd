package hosted

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// fakePicker is a HostedWorkerPicker whose behaviour is set by function
// fields, in the style of Nomad's plugin mocks.
type fakePicker struct {
	inputs shared.Inputs
	pick   func(v *WorkerInputView) (int, error)
}

func (f *fakePicker) Inputs() shared.Inputs { return f.inputs }

func (f *fakePicker) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	return 0, nil
}

func (f *fakePicker) PickHosted(v *WorkerInputView) (int, error) { return f.pick(v) }

// plainPicker is a picker without PickHosted, like a plugin's client side.
type plainPicker struct{}

func (plainPicker) Inputs() shared.Inputs { return 0 }

func (plainPicker) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	return 0, nil
}

// inputsComponent is a filter or scorer declaring the given inputs.
type inputsComponent shared.Inputs

func (c inputsComponent) Inputs() shared.Inputs { return shared.Inputs(c) }

func (inputsComponent) Filter(context.Context, *shared.Request, *shared.Candidates, []bool) error {
	return nil
}

func (inputsComponent) Score(context.Context, *shared.Request, *shared.Candidates, []float64) error {
	return nil
}

var ids4 = []shared.WorkerID{3, 7, 11, 20}

func activeOf(counts ...int64) func(int) int64 { return func(row int) int64 { return counts[row] } }

func TestSelect(t *testing.T) {
	fixed := func(row int) func(*WorkerInputView) (int, error) {
		return func(*WorkerInputView) (int, error) { return row, nil }
	}
	pickErr := errors.New("picker failed")
	tests := []struct {
		name    string
		ids     []shared.WorkerID
		active  func(int) int64
		bs      int
		picker  *fakePicker
		wantRow int
		wantErr error
		wantOOR *shared.RowOutOfRangeError
	}{
		{name: "ok", ids: ids4, bs: 16, picker: &fakePicker{pick: fixed(2)}, wantRow: 2},
		{name: "ok with accessor", ids: ids4, active: activeOf(1, 2, 3, 4), bs: 16,
			picker: &fakePicker{inputs: shared.InputActiveRequests, pick: fixed(3)}, wantRow: 3},
		{name: "no workers", ids: nil, bs: 16, picker: &fakePicker{pick: fixed(0)}, wantErr: shared.ErrNoWorkers},
		{name: "block size 0", ids: ids4, bs: 0, picker: &fakePicker{pick: fixed(0)}, wantErr: ErrZeroBlockSize},
		{name: "negative block size", ids: ids4, bs: -1, picker: &fakePicker{pick: fixed(0)}, wantErr: ErrZeroBlockSize},
		{name: "active declared, no accessor", ids: ids4, bs: 16,
			picker: &fakePicker{inputs: shared.InputActiveRequests, pick: fixed(0)}, wantErr: ErrNoActiveRequests},
		{name: "occupancy declared, no accessor", ids: ids4, bs: 16,
			picker: &fakePicker{inputs: shared.InputOccupancy, pick: fixed(0)}, wantErr: ErrNoActiveRequests},
		{name: "picker error passes through", ids: ids4, bs: 16,
			picker: &fakePicker{pick: func(*WorkerInputView) (int, error) { return 0, pickErr }}, wantErr: pickErr},
		{name: "row too large", ids: ids4, bs: 16, picker: &fakePicker{pick: fixed(4)},
			wantOOR: &shared.RowOutOfRangeError{Row: 4, Count: 4}},
		{name: "negative row", ids: ids4, bs: 16, picker: &fakePicker{pick: fixed(-1)},
			wantOOR: &shared.RowOutOfRangeError{Row: -1, Count: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := NewWorkerInputView(tt.ids, 0, tt.active, tt.bs)
			row, err := Select(tt.picker, &v)
			switch {
			case tt.wantOOR != nil:
				var oor *shared.RowOutOfRangeError
				if !errors.As(err, &oor) {
					t.Fatalf("Select error = %v, want *RowOutOfRangeError", err)
				}
				if diff := cmp.Diff(tt.wantOOR, oor); diff != "" {
					t.Errorf("RowOutOfRangeError (-want +got):\n%s", diff)
				}
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Select error = %v, want %v", err, tt.wantErr)
				}
			default:
				if err != nil || row != tt.wantRow {
					t.Fatalf("Select = %d, %v; want %d, nil", row, err, tt.wantRow)
				}
			}
			if err != nil && row != -1 {
				t.Errorf("Select returned row %d with error %v, want -1", row, err)
			}
		})
	}
}

func TestViewAccessors(t *testing.T) {
	v := NewWorkerInputView(ids4, 42, activeOf(5, 0, 9, 1), 512)
	if v.Len() != 4 || v.IsEmpty() || v.BlockSize() != 512 || v.SetKey() != 42 || !v.HasActiveRequests() {
		t.Fatalf("view = Len %d IsEmpty %v BlockSize %d SetKey %d HasActive %v; want 4 false 512 42 true",
			v.Len(), v.IsEmpty(), v.BlockSize(), v.SetKey(), v.HasActiveRequests())
	}
	var got []int64
	for row := range v.Len() {
		a, err := v.ActiveRequests(row)
		if err != nil {
			t.Fatalf("ActiveRequests(%d): %v", row, err)
		}
		got = append(got, a)
	}
	if diff := cmp.Diff([]int64{5, 0, 9, 1}, got); diff != "" {
		t.Errorf("ActiveRequests (-want +got):\n%s", diff)
	}
	if v.ID(2) != 11 {
		t.Errorf("ID(2) = %d, want 11", v.ID(2))
	}
	for _, row := range []int{-1, 4, 100} {
		_, err := v.ActiveRequests(row)
		var oor *shared.RowOutOfRangeError
		if !errors.As(err, &oor) || oor.Row != row || oor.Count != 4 {
			t.Errorf("ActiveRequests(%d) error = %v, want row %d out of range [0, 4)", row, err, row)
		}
	}
	empty := NewWorkerInputView(nil, 0, nil, 1)
	if !empty.IsEmpty() || empty.Len() != 0 {
		t.Errorf("empty view: IsEmpty %v Len %d", empty.IsEmpty(), empty.Len())
	}
	noAcc := NewWorkerInputView(ids4, 0, nil, 1)
	if _, err := noAcc.ActiveRequests(0); !errors.Is(err, ErrNoActiveRequests) {
		t.Errorf("ActiveRequests without accessor: error = %v, want ErrNoActiveRequests", err)
	}
}

func TestViewSetKey(t *testing.T) {
	v := NewWorkerInputView(ids4, 0, nil, 1)
	want := CandidateSetKey("", "", ids4)
	if got := v.SetKey(); got != want || got == 0 {
		t.Errorf("SetKey() = %d, want CandidateSetKey = %d (non-zero)", got, want)
	}
	keys := map[uint64]string{}
	for _, c := range []struct {
		name  string
		model string
		role  shared.Role
		ids   []shared.WorkerID
	}{
		{"empty", "", "", nil},
		{"ids", "", "", ids4},
		{"fewer ids", "", "", ids4[:3]},
		{"other ids", "", "", []shared.WorkerID{3, 7, 11, 21}},
		{"model", "llama", "", ids4},
		{"model+prefill", "llama", shared.RolePrefill, ids4},
		{"model+decode", "llama", shared.RoleDecode, ids4},
		{"other model", "mistral-7b-instruct", shared.RoleDecode, ids4},
		{"shifted boundary", "llam", "aprefill", ids4},
	} {
		k := CandidateSetKey(c.model, c.role, c.ids)
		if k == 0 {
			t.Errorf("%s: key 0", c.name)
		}
		if prev, dup := keys[k]; dup {
			t.Errorf("%s and %s share key %#x", prev, c.name, k)
		}
		keys[k] = c.name
		if again := CandidateSetKey(c.model, c.role, c.ids); again != k {
			t.Errorf("%s: key not stable: %#x then %#x", c.name, k, again)
		}
	}
}

func TestViewCandidates(t *testing.T) {
	calls := 0
	v := NewWorkerInputView(ids4, 0, func(row int) int64 { calls++; return int64(10 * row) }, 16)
	c := v.Candidates()
	want := &shared.Candidates{IDs: ids4, ActiveRequests: []int64{0, 10, 20, 30}}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("Candidates() (-want +got):\n%s", diff)
	}
	if c2 := v.Candidates(); c2 != c || calls != 4 {
		t.Errorf("second Candidates(): same pointer %v, accessor calls %d; want true, 4", c2 == c, calls)
	}
	noAcc := NewWorkerInputView(ids4, 0, nil, 16)
	if diff := cmp.Diff(&shared.Candidates{IDs: ids4}, noAcc.Candidates()); diff != "" {
		t.Errorf("Candidates() without accessor (-want +got):\n%s", diff)
	}
}

// TestViewZeroAlloc checks a stack view passed through Select allocates
// nothing while Candidates is not called, and allocates once it is.
func TestViewZeroAlloc(t *testing.T) {
	active := activeOf(4, 3, 2, 1)
	p := &fakePicker{inputs: shared.InputActiveRequests, pick: func(v *WorkerInputView) (int, error) {
		best, low := 0, int64(1<<62)
		for row := range v.Len() {
			if a, _ := v.ActiveRequests(row); a < low {
				best, low = row, a
			}
		}
		_ = v.SetKey()
		return best, nil
	}}
	var hp HostedWorkerPicker = p
	if n := testing.AllocsPerRun(1000, func() {
		v := NewWorkerInputView(ids4, 0, active, 16)
		if row, err := Select(hp, &v); err != nil || row != 3 {
			t.Fatalf("Select = %d, %v; want 3, nil", row, err)
		}
	}); n != 0 {
		t.Errorf("Select without Candidates: %v allocs/run, want 0", n)
	}
	withCands := &fakePicker{pick: func(v *WorkerInputView) (int, error) { return v.Candidates().Len() - 1, nil }}
	hp = withCands
	if n := testing.AllocsPerRun(100, func() {
		v := NewWorkerInputView(ids4, 0, active, 16)
		_, _ = Select(hp, &v)
	}); n == 0 {
		t.Error("Select calling Candidates allocated nothing; the test does not measure what it claims")
	}
}

func TestIntoHosted(t *testing.T) {
	noInputsP := &fakePicker{}
	hostedP := &fakePicker{inputs: shared.InputActiveRequests}
	occupancyP := &fakePicker{inputs: shared.InputOccupancy}
	loadP := &fakePicker{inputs: shared.InputActiveRequests | shared.InputLoad}
	tests := []struct {
		name   string
		policy *policy.Policy
		want   HostedWorkerPicker
	}{
		{"picker only, no inputs", &policy.Policy{Picker: noInputsP}, noInputsP},
		{"picker only, ACTIVE_REQUESTS", &policy.Policy{Picker: hostedP}, hostedP},
		{"picker only, OCCUPANCY", &policy.Policy{Picker: occupancyP}, occupancyP},
		{"nil policy", nil, nil},
		{"no picker", &policy.Policy{}, nil},
		{"picker declares LOAD", &policy.Policy{Picker: loadP}, nil},
		{"not hosted (out of process)", &policy.Policy{Picker: plainPicker{}}, nil},
		{"with filter", &policy.Policy{Picker: hostedP,
			Filters: []policy.NamedFilter{{Name: "f", Filter: inputsComponent(0)}}}, nil},
		{"with scorer", &policy.Policy{Picker: hostedP,
			Scorers: []policy.WeightedScorer{{Name: "s", Weight: 1, Scorer: inputsComponent(0)}}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := IntoHosted(tt.policy)
			if ok != (tt.want != nil) || got != tt.want {
				t.Errorf("IntoHosted = %v, %v; want %v, %v", got, ok, tt.want, tt.want != nil)
			}
		})
	}
}

// TestCheckAscending pins the ordering contract: candidate ids strictly
// ascending, no duplicates.
func TestCheckAscending(t *testing.T) {
	tests := []struct {
		name string
		ids  []shared.WorkerID
		ok   bool
	}{
		{"empty", nil, true},
		{"one", []shared.WorkerID{5}, true},
		{"ascending", []shared.WorkerID{0, 1, 9, 1 << 63}, true},
		{"duplicate", []shared.WorkerID{1, 2, 2, 3}, false},
		{"descending", []shared.WorkerID{3, 2}, false},
		{"late inversion", []shared.WorkerID{1, 2, 3, 10, 4}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckAscending(tt.ids)
			if (err == nil) != tt.ok {
				t.Fatalf("CheckAscending(%v) = %v, want ok=%v", tt.ids, err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrUnsorted) {
				t.Errorf("error %v does not wrap ErrUnsorted", err)
			}
		})
	}
}
