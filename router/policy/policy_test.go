package policy

import (
	"context"
	"testing"

	"github.com/switchyard-router/switchyard/shared"
)

// comp is a filter, scorer and picker declaring fixed inputs.
type comp shared.Inputs

func (c comp) Inputs() shared.Inputs { return shared.Inputs(c) }
func (comp) Filter(context.Context, *shared.Request, *shared.Candidates, []bool) error {
	return nil
}
func (comp) Score(context.Context, *shared.Request, *shared.Candidates, []float64) error {
	return nil
}
func (comp) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) { return 0, nil }

func TestPolicyInputs(t *testing.T) {
	tests := []struct {
		name       string
		p          Policy
		want       shared.Inputs
		pickerOnly bool
	}{
		{"empty", Policy{}, 0, true},
		{"picker only", Policy{Picker: comp(shared.InputActiveRequests)}, shared.InputActiveRequests, true},
		{"occupancy folded", Policy{Picker: comp(shared.InputOccupancy)}, shared.InputActiveRequests, true},
		{"union of every stage", Policy{
			Filters: []NamedFilter{{Name: "f", Filter: comp(shared.InputCapacity)}},
			Scorers: []WeightedScorer{{Name: "a", Weight: 1, Scorer: comp(shared.InputCache)}, {Name: "b", Weight: 2, Scorer: comp(shared.InputLoad | shared.InputOccupancy)}},
			Picker:  comp(0),
		}, shared.InputCapacity | shared.InputCache | shared.InputLoad | shared.InputActiveRequests, false},
		{"fallback not included", Policy{
			Scorers:  []WeightedScorer{{Name: "s", Weight: 1, Scorer: comp(shared.InputCache)}},
			Picker:   comp(0),
			Fallback: &Policy{Picker: comp(shared.InputLoad)},
		}, shared.InputCache, false},
		{"unknown bits dropped", Policy{Filters: []NamedFilter{{Name: "f", Filter: comp(1 << 30)}}, Picker: comp(0)}, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.Inputs(); got != tt.want {
				t.Errorf("Inputs() = %v, want %v", got, tt.want)
			}
			if got := tt.p.PickerOnly(); got != tt.pickerOnly {
				t.Errorf("PickerOnly() = %v, want %v", got, tt.pickerOnly)
			}
		})
	}
}
