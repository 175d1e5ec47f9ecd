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

// ExecuteTrace records, per stage, the candidates left out and the
// weighted costs added, for local members and fused runs alike, and picks
// what Execute picks: by hand, of workers 10..14 (active 1 9 3 2 7) the
// local filter drops 11 and 14 (active >= 5); plugin A's fused filter and
// scorer drop the first row left (10) and cost 12 and 13 their ids; the
// local scorer (weight 2) adds 2 × active (6, 4); the lowest sum is 13's
// (13 + 4 = 17 against 12 + 6 = 18). A run's filter that leaves no row
// is recorded under its name.
func TestExecuteTrace(t *testing.T) {
	var fused [][]string
	calls := 0
	a := func(name string) *remote {
		return &remote{process: "A", name: name, fused: &fused, calls: &calls,
			answer: func(ms []Member, c *shared.Candidates) (RunResult, error) {
				var kept []uint32
				var costs []float64
				for i := 1; i < c.Len(); i++ {
					kept = append(kept, uint32(i))
					costs = append(costs, float64(c.IDs[i]))
				}
				return RunResult{Kept: kept, Costs: costs, Picked: -1}, nil
			}}
	}
	p := &policy.Policy{
		Name: "p",
		Filters: []policy.NamedFilter{
			{Name: "busy", Filter: filterFunc(func(c *shared.Candidates, keep []bool) error {
				for i, n := range c.ActiveRequests {
					keep[i] = n < 5
				}
				return nil
			})},
			{Name: "a-filter", Filter: a("a-filter")},
		},
		Scorers: []policy.WeightedScorer{
			{Name: "a-score", Weight: 1, Scorer: a("a-score")},
			{Name: "active", Weight: 2, Scorer: scorerFunc(func(c *shared.Candidates, costs []float64) error {
				for i, n := range c.ActiveRequests {
					costs[i] = float64(n)
				}
				return nil
			})},
		},
		PickerName: "lowest", Picker: lowest,
	}
	cp, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	var s Scratch
	c := candidates(&s, 1, 9, 3, 2, 7)
	var tr Trace
	row, err := ExecuteTrace(context.Background(), cp, &shared.Request{}, c, &s, &tr)
	if err != nil || c.IDs[row] != 13 {
		t.Fatalf("picked row %d (%v), want worker 13", row, err)
	}
	k := func(ids ...shared.WorkerID) []Candidate {
		var out []Candidate
		for _, id := range ids {
			out = append(out, Candidate{ID: id})
		}
		return out
	}
	want := []TraceStage{
		{Kind: shared.KindFilter, Name: "busy", Dropped: k(11, 14)},
		{Name: `filter "a-filter"+scorer "a-score"`, Dropped: k(10), Scored: k(12, 13), Costs: []float64{12, 13}},
		{Kind: shared.KindScorer, Name: "active", Scored: k(12, 13), Costs: []float64{6, 4}},
	}
	if diff := cmp.Diff(want, tr.Stages); diff != "" {
		t.Fatalf("trace (-want +got):\n%s", diff)
	}

	// A run's filter leaving nothing: its name, every row dropped.
	p.Filters[1].Filter = &remote{process: "A", fused: &fused, calls: &calls,
		answer: func([]Member, *shared.Candidates) (RunResult, error) {
			return RunResult{FilteredBy: "a-filter", Picked: -1}, nil
		}}
	p.Scorers = p.Scorers[1:]
	if cp, err = Compile(p); err != nil {
		t.Fatal(err)
	}
	c = candidates(&s, 1, 9, 3)
	if _, err := ExecuteTrace(context.Background(), cp, &shared.Request{}, c, &s, &tr); !errors.Is(err, shared.ErrAllFiltered) {
		t.Fatalf("err %v, want ErrAllFiltered", err)
	}
	if n := len(tr.Stages); n != 2 || tr.Stages[1].Name != "a-filter" || !cmp.Equal(tr.Stages[1].Dropped, k(10, 12)) {
		t.Fatalf("trace %+v, want busy then a-filter dropping 10 and 12", tr.Stages)
	}
}
