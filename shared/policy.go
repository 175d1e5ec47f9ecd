package shared

// NamedFilter is one filter of a policy with its block name.
type NamedFilter struct {
	Name   string
	Type   string
	Filter Filter
}

// WeightedScorer is one scorer of a policy with its block name and weight
// (finite, >= 0; default 1).
type WeightedScorer struct {
	Name   string
	Type   string
	Weight float64
	Scorer Scorer
}

// Policy is an ordered list of filters, ordered weighted scorers, exactly
// one picker, and an optional fallback policy that answers when this one
// fails (an out-of-process component errs, times out or is restarting).
type Policy struct {
	Name       string
	Filters    []NamedFilter
	Scorers    []WeightedScorer
	PickerName string
	PickerType string
	Picker     Picker
	Fallback   *Policy
}

// Inputs is the union of the inputs every component declares, normalised
// (OCCUPANCY folded into ACTIVE_REQUESTS). The fallback is not included.
func (p *Policy) Inputs() Inputs {
	var in Inputs
	for _, f := range p.Filters {
		in |= f.Filter.Inputs()
	}
	for _, s := range p.Scorers {
		in |= s.Scorer.Inputs()
	}
	if p.Picker != nil {
		in |= p.Picker.Inputs()
	}
	return in.Normalize()
}

// PickerOnly reports whether the policy has no filter and no scorer.
func (p *Policy) PickerOnly() bool { return len(p.Filters) == 0 && len(p.Scorers) == 0 }
