package admission

import "github.com/switchyard-router/switchyard/shared"

// Path is how a request crosses the fleet: in one hop (Aggregated) or in
// two (Disaggregated: prefill, then decode). serve and replay both walk a
// path's hops in order, admitting each hop like a request of its own
// (classifier, queue, capacity) with the request Hop.Request makes, and
// ending its handle when its worker is done with it: Completed with
// Hop.ContextTokens. The last hop's completion is the request's.
type Path uint8

// The paths.
const (
	// Aggregated: one hop on an aggregated worker, which computes the
	// prompt and generates the whole answer.
	Aggregated Path = iota
	// Disaggregated: a prefill hop, which computes the prompt and the
	// first token and keeps the prompt's KV for a decode worker, then a
	// decode hop, which receives that KV by transfer and generates the
	// rest.
	Disaggregated
)

// Hop is one admitted leg of a request's path.
type Hop struct {
	// Role is the role of the workers the hop is placed on.
	Role shared.Role
	// PrefixHashes is whether the hop's request carries the prompt's
	// block hashes. A decode hop's does not: its KV arrives by transfer,
	// is not in the decode worker's prefix cache, and so must not be
	// recorded in the router's prefix index as if it were.
	PrefixHashes bool
	// FirstTokenOnly is whether the hop's worker generates the first
	// token only (prefill); otherwise it generates the whole output.
	FirstTokenOnly bool
	// Final is whether the hop's completion is the request's completion
	// (the last hop of the path).
	Final bool
}

var paths = [...][]Hop{
	Aggregated:    {{Role: shared.RoleAggregated, PrefixHashes: true, Final: true}},
	Disaggregated: {{Role: shared.RolePrefill, PrefixHashes: true, FirstTokenOnly: true}, {Role: shared.RoleDecode, Final: true}},
}

// Len is the number of hops of p: 1 or 2.
func (p Path) Len() int { return len(paths[p]) }

// Hop is the i-th hop of p (0 <= i < Len()).
func (p Path) Hop(i int) Hop { return paths[p][i] }

// Request returns the request hop h admits for the client's request base
// (id, model, prompt tokens, block hashes, session, metadata): a copy of
// base with h's Role, without BlockHashes unless h.PrefixHashes. The copy
// shares base's slices and map; the caller sets its ID.
func (h Hop) Request(base *shared.Request) *shared.Request {
	r := *base
	r.Role = h.Role
	if !h.PrefixHashes {
		r.BlockHashes, r.Prompt = nil, nil
	}
	return &r
}

// OutputTokens is how many of the request's outputTokens the hop's
// worker generates: 1 on a FirstTokenOnly hop, else all of them (at
// least 1).
func (h Hop) OutputTokens(outputTokens int) int {
	if h.FirstTokenOnly {
		return 1
	}
	return max(outputTokens, 1)
}

// ContextTokens is the prompt plus generated tokens when the hop
// completes (Completed's argument): promptTokens plus OutputTokens.
func (h Hop) ContextTokens(promptTokens, outputTokens int) int64 {
	return int64(promptTokens) + int64(h.OutputTokens(outputTokens))
}

// Ends reports whether the request is over when h completes: h is Final,
// or it generated every token the request asked for (a prefill hop of a
// request of at most one output token, which then needs no decode hop).
func (h Hop) Ends(outputTokens int) bool {
	return h.Final || h.OutputTokens(outputTokens) >= outputTokens
}
