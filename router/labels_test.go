package router

import (
	"context"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// labelled is a scorer that records the LABELS columns it was given; it
// declares them only when declare is set.
type labelled struct {
	declare bool
	names   []string
	labels  []shared.Labels
	calls   int
}

func (s *labelled) Inputs() shared.Inputs {
	if s.declare {
		return shared.InputLabels
	}
	return 0
}

func (s *labelled) Score(_ context.Context, _ *shared.Request, c *shared.Candidates, _ []float64) error {
	s.calls++
	s.names, s.labels = slices.Clone(c.Names), slices.Clone(c.Labels)
	return nil
}

// TestLabelsOnlyWhenDeclared: a policy that declares LABELS gets each
// row's worker name and labels (the worker's own plus the router-set
// role, model and rank keys), also over a narrowed partition; one that
// does not gets neither column.
func TestLabelsOnlyWhenDeclared(t *testing.T) {
	for _, declare := range []bool{true, false} {
		s := &labelled{declare: declare}
		p := mustPolicy(t, "labels", []policy.WeightedScorer{{Name: "l", Weight: 1, Scorer: s}}, builtin.NewRoundRobin())
		r, err := New(Options{BlockSize: 4, Roles: map[shared.Role]*policy.Policy{shared.RoleAggregated: p}, BookingsAreLoad: true})
		if err != nil {
			t.Fatal(err)
		}
		specs := []fleet.Spec{
			{ID: shared.WorkerIDOf("gpu-0"), Name: "gpu-0", Role: shared.RoleAggregated, Models: []string{"llama"}, Labels: map[string]string{"zone": "eu"}},
			{ID: shared.WorkerIDOf("gpu-1"), Name: "gpu-1", Role: shared.RoleAggregated, DPRank: 0, DataParallel: true},
			{ID: shared.WorkerIDOf("gpu-1"), Name: "gpu-1", Role: shared.RoleAggregated, DPRank: 1, DataParallel: true},
		}
		if _, err := r.AddWorkers(specs...); err != nil {
			t.Fatal(err)
		}
		// Rows are in ascending id order, ranks of one worker by rank.
		names := []string{"gpu-0", "gpu-1", "gpu-1"}
		if shared.WorkerIDOf("gpu-1") < shared.WorkerIDOf("gpu-0") {
			names = []string{"gpu-1", "gpu-1", "gpu-0"}
		}
		want := map[string][]shared.Labels{
			"gpu-0": {{{Key: shared.LabelModel, Value: "llama"}, {Key: shared.LabelRole, Value: "aggregated"}, {Key: "zone", Value: "eu"}}},
			"gpu-1": {
				{{Key: shared.LabelDPRank, Value: "0"}, {Key: shared.LabelRole, Value: "aggregated"}},
				{{Key: shared.LabelDPRank, Value: "1"}, {Key: shared.LabelRole, Value: "aggregated"}},
			},
		}
		var wantLabels []shared.Labels
		seen := map[string]int{}
		for _, n := range names {
			wantLabels = append(wantLabels, want[n][seen[n]])
			seen[n]++
		}
		for _, pl := range []Placement{{}, {Exclude: []shared.WorkerID{shared.WorkerIDOf("gpu-0")}}} {
			d, err := r.Place(context.Background(), request(8, 1, 2), pl)
			if err != nil {
				t.Fatal(err)
			}
			d.Booking.Release()
			wantNames, wantL := names, wantLabels
			if pl.Exclude != nil {
				i := slices.Index(names, "gpu-0")
				wantNames = slices.Delete(slices.Clone(names), i, i+1)
				wantL = slices.Delete(slices.Clone(wantLabels), i, i+1)
			}
			if !declare {
				wantNames, wantL = nil, nil
			}
			if diff := cmp.Diff(wantNames, s.names); diff != "" {
				t.Errorf("declared %v, exclude %v: names (-want +got):\n%s", declare, pl.Exclude, diff)
			}
			if diff := cmp.Diff(wantL, s.labels); diff != "" {
				t.Errorf("declared %v, exclude %v: labels (-want +got):\n%s", declare, pl.Exclude, diff)
			}
		}
		if s.calls != 2 {
			t.Fatalf("scorer called %d times, want 2", s.calls)
		}
	}
}
