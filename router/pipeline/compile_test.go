package pipeline

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// remote stands in for an out-of-process component: it fuses with its
// neighbours of the same process and its run answers through a function.
type remote struct {
	process string
	name    string
	fused   *[][]string // names of every fused run, in Compile order
	answer  func(members []Member, c *shared.Candidates) (RunResult, error)
	calls   *int
}

func (r *remote) Inputs() shared.Inputs { return shared.InputActiveRequests }
func (r *remote) FuseKey() any          { return r.process }
func (r *remote) Fuse(ms []Member) (Run, error) {
	var got []string
	for _, m := range ms {
		got = append(got, m.Name)
	}
	*r.fused = append(*r.fused, got)
	return runFunc(func(c *shared.Candidates) (RunResult, error) {
		*r.calls++
		return r.answer(ms, c)
	}), nil
}

// The three interfaces, so a remote fits any slot of a policy.
func (r *remote) Filter(context.Context, *shared.Request, *shared.Candidates, []bool) error {
	return errors.New("a fused component must not be called alone")
}
func (r *remote) Score(context.Context, *shared.Request, *shared.Candidates, []float64) error {
	return errors.New("a fused component must not be called alone")
}
func (r *remote) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	return 0, errors.New("a fused component must not be called alone")
}

type runFunc func(c *shared.Candidates) (RunResult, error)

func (f runFunc) Run(_ context.Context, _ *shared.Request, c *shared.Candidates) (RunResult, error) {
	return f(c)
}

func TestCompileFusesConsecutiveMembersOfOneProcess(t *testing.T) {
	var fused [][]string
	calls := 0
	// Plugin A: drops row 0 of what it gets and costs each kept row its id;
	// its picker (in a second run, after a local scorer) picks the last row.
	a := func(name string) *remote {
		return &remote{process: "A", name: name, fused: &fused, calls: &calls,
			answer: func(ms []Member, c *shared.Candidates) (RunResult, error) {
				if ms[0].Kind == shared.KindPicker {
					return RunResult{Picked: c.Len() - 1}, nil
				}
				var kept []uint32
				var costs []float64
				for i := 1; i < c.Len(); i++ {
					kept = append(kept, uint32(i))
					costs = append(costs, float64(c.IDs[i]))
				}
				return RunResult{Kept: kept, Costs: costs, Picked: -1}, nil
			}}
	}
	local := scorerFunc(func(c *shared.Candidates, costs []float64) error {
		for i := range costs {
			costs[i] = 100
		}
		return nil
	})
	var seenCosts []float64
	pick := a("pick")
	pick.answer = func(ms []Member, c *shared.Candidates) (RunResult, error) {
		seenCosts = append([]float64(nil), c.Costs...)
		return RunResult{Picked: 1}, nil // row 1 of the 3 it is given
	}
	p := &policy.Policy{
		Name:    "mixed",
		Filters: []policy.NamedFilter{{Name: "overlap", Filter: a("overlap")}},
		Scorers: []policy.WeightedScorer{
			{Name: "prefill", Weight: 1, Scorer: a("prefill")},
			{Name: "local", Weight: 0.5, Scorer: local},
		},
		PickerName: "pick",
		Picker:     pick,
	}
	cp, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([][]string{{"overlap", "prefill"}, {"pick"}}, fused); diff != "" {
		t.Fatalf("fused runs (-want +got):\n%s", diff)
	}
	var s Scratch
	c := candidates(&s, 0, 0, 0, 0) // ids 10..13
	row, err := Execute(context.Background(), cp, &shared.Request{}, c, &s)
	if err != nil {
		t.Fatal(err)
	}
	if calls != 2 {
		t.Fatalf("runs called %d times, want 2 (one per fused run)", calls)
	}
	// Row 0 (id 10) dropped; costs id + 0.5*100.
	if diff := cmp.Diff([]float64{61, 62, 63}, seenCosts); diff != "" {
		t.Fatalf("costs the picker saw (-want +got):\n%s", diff)
	}
	if row != 1 || c.IDs[row] != 12 {
		t.Fatalf("picked row %d (id %d), want row 1 (id 12)", row, c.IDs[row])
	}
}

func TestFusedRunResultsAreChecked(t *testing.T) {
	tests := []struct {
		name string
		res  RunResult
		want string
	}{
		{"filtered out", RunResult{FilteredBy: "overlap", Picked: -1}, `filter "overlap": all candidates filtered out`},
		{"kept out of order", RunResult{Kept: []uint32{2, 1}, Picked: 1}, "kept rows not ascending"},
		{"picked a dropped row", RunResult{Kept: []uint32{0, 2}, Picked: 1}, "row 1 out of range"},
		{"picked out of range", RunResult{Picked: 7}, "row 7 out of range [0, 3)"},
		{"no pick from a picker run", RunResult{Picked: -1}, "row -1 out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var fused [][]string
			calls := 0
			pk := &remote{process: "A", fused: &fused, calls: &calls,
				answer: func([]Member, *shared.Candidates) (RunResult, error) { return tt.res, nil }}
			var s Scratch
			_, err := run(t, &policy.Policy{Name: "p", PickerName: "pk", Picker: pk}, candidates(&s, 0, 0, 0), &s)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestFusedRunMapsPickThroughKeptRows(t *testing.T) {
	var fused [][]string
	calls := 0
	// One run (fused by its first member): the filter keeps rows 1 and 3,
	// the picker picks row 3 (as sent).
	f := &remote{process: "A", fused: &fused, calls: &calls,
		answer: func([]Member, *shared.Candidates) (RunResult, error) {
			return RunResult{Kept: []uint32{1, 3}, Picked: 3}, nil
		}}
	pk := &remote{process: "A", fused: &fused, calls: &calls}
	var s Scratch
	c := candidates(&s, 0, 0, 0, 0)
	row, err := run(t, &policy.Policy{Name: "p", Filters: []policy.NamedFilter{{Name: "f", Filter: f}}, PickerName: "pk", Picker: pk}, c, &s)
	if err != nil {
		t.Fatal(err)
	}
	if len(fused) != 1 || row != 1 || c.IDs[row] != 13 {
		t.Fatalf("fused %v, row %d id %d; want one run, row 1 id 13", fused, row, c.IDs[row])
	}
}
