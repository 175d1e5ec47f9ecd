package shared

import "context"

// Kind is the role a component type plays in a policy.
type Kind uint8

// The component kinds.
const (
	KindFilter Kind = iota + 1
	KindScorer
	KindPicker
	KindClassifier
)

// String returns "filter", "scorer", "picker" or "classifier".
func (k Kind) String() string {
	switch k {
	case KindFilter:
		return "filter"
	case KindScorer:
		return "scorer"
	case KindPicker:
		return "picker"
	case KindClassifier:
		return "classifier"
	}
	return "unknown"
}

// Component is what every filter, scorer and picker instance provides: the
// inputs it reads. The set may depend on the instance's parameters.
type Component interface {
	Inputs() Inputs
}

// Filter keeps a subset of the candidates. On entry keep has c.Len() entries,
// all true; Filter sets keep[i] = false for each row it drops. The pipeline
// compacts the candidates after each filter; when no row survives the
// selection fails with ErrAllFiltered.
type Filter interface {
	Component
	Filter(ctx context.Context, req *Request, c *Candidates, keep []bool) error
}

// Scorer writes one finite, lower-is-better cost per candidate row into
// costs (len(costs) == c.Len()), in one batched call. The pipeline sums the
// costs of all scorers with their weights; a NaN or infinite cost fails the
// selection with a *NonFiniteCostError.
type Scorer interface {
	Component
	Score(ctx context.Context, req *Request, c *Candidates, costs []float64) error
}

// Picker chooses one row of c, which is never empty. c.Costs holds the
// summed scorer costs, or is nil when the policy has no scorer. A row outside
// [0, c.Len()) fails the selection with a *RowOutOfRangeError.
type Picker interface {
	Component
	Pick(ctx context.Context, req *Request, c *Candidates) (row int, err error)
}

// Closer is implemented by components holding resources; the router calls
// Close once when the policy is discarded.
type Closer interface {
	Close() error
}
