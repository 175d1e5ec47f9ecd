// Package policy holds the resolved policy the router runs for one role:
// its filters in order, its weighted scorers in order, its picker and its
// fallback, each component an instance of a shared interface (built in or
// served out of process). The policy loader (router/config) builds them;
// the pipeline (router/pipeline), the hosted fast path (hosted), the Router
// and replay run them. It is the router's side, no part of the plugin SDK:
// it imports only shared.
package policy

import "github.com/switchyard-router/switchyard/shared"

// NamedFilter is one filter of a policy with its block name.
type NamedFilter struct {
	Name   string
	Type   string
	Filter shared.Filter
}

// WeightedScorer is one scorer of a policy with its block name and weight
// (finite, >= 0; default 1).
type WeightedScorer struct {
	Name   string
	Type   string
	Weight float64
	Scorer shared.Scorer
}

// Policy is an ordered list of filters, ordered weighted scorers, exactly
// one picker, an optional fallback policy that answers when this one
// fails (an out-of-process component errs, times out or is restarting),
// and an optional shadow policy.
type Policy struct {
	Name       string
	Filters    []NamedFilter
	Scorers    []WeightedScorer
	PickerName string
	PickerType string
	Picker     shared.Picker
	Fallback   *Policy
	// Shadow, when not nil, is asked beside this policy on every decision
	// and never acted on: the router counts whether it agrees (its
	// filters, scorers and picker only; its own fallback and shadow are
	// not run). Its components are instances of their own.
	Shadow *Policy
}

// Inputs is the union of the inputs every component declares, normalised
// (OCCUPANCY folded into ACTIVE_REQUESTS). The fallback is not included.
func (p *Policy) Inputs() shared.Inputs {
	var in shared.Inputs
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
