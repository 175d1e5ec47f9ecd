// Package policy holds the resolved policy the router runs for one role:
// its filters in order, its weighted scorers in order, its picker and its
// fallback, each component an instance of a shared interface (built in or
// served out of process). The policy loader (router/config) builds them;
// the pipeline (router/pipeline), the hosted fast path (hosted), the Router
// and replay run them. It is the router's side, no part of the plugin SDK:
// it imports only shared.
package policy

import (
	"time"

	"github.com/switchyard-router/switchyard/shared"
)

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
	// Canary, when not nil, sends a share of the role's decisions to a
	// candidate policy instead of this one (the policy's `canary` block,
	// docs/policy-file.md "Canary"), and rolls the candidate back when it
	// misbehaves. Like Shadow it acts only for the role's own policy, not
	// when this policy is another's fallback.
	Canary *Canary
}

// CanaryKey is what a canary hashes to choose a request's side.
type CanaryKey string

// The canary keys.
const (
	// CanaryKeySession hashes the request's session id
	// (shared.Request.SessionID: serve's x-session-id header, a trace's
	// session_id), so every turn of a conversation stays on one side;
	// a request without one hashes its request id.
	CanaryKeySession CanaryKey = "session"
	// CanaryKeyRequest hashes the request id alone.
	CanaryKeyRequest CanaryKey = "request"
)

// Canary is a policy's canary: the candidate policy that decides a share
// of the role's requests, and when it is rolled back.
type Canary struct {
	// Policy is the candidate, with instances of its own and its own
	// fallback chain (its shadow and canary are not run as a candidate).
	Policy *Policy
	// Weight is the share of requests (keys) sent to the candidate, in
	// [0, 1]; 0 sends none (the canary is declared but off).
	Weight float64
	// Key is what is hashed to choose a side.
	Key CanaryKey
	// Rollback sets when the candidate is switched off.
	Rollback CanaryRollback
}

// CanaryRollback are the thresholds that switch a canary off (weight 0
// until the policy file is loaded again), each judged over a sliding
// Window of the candidate's decisions.
type CanaryRollback struct {
	// MaxFallbackShare is the largest share (0 to 1) of the candidate's
	// decisions its fallback may decide; more rolls back. 1 never rolls
	// back on fallbacks.
	MaxFallbackShare float64
	// MaxTTFTP90 is the largest 90th percentile (nearest rank) of the
	// candidate's time to first token; more rolls back. 0 never rolls
	// back on latency.
	MaxTTFTP90 time.Duration
	// Window is the sliding window the share and the percentile are
	// taken over (> 0).
	Window time.Duration
	// MinRequests is how many decisions (for the fallback share) or first
	// tokens (for TTFT) the window must hold before either is judged
	// (>= 1).
	MinRequests int
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
