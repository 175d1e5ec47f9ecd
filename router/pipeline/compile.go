package pipeline

import (
	"context"
	"fmt"

	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// Member is one component of a policy as the policy declares it.
type Member struct {
	Kind      shared.Kind
	Name      string
	Weight    float64 // scorers only
	Component shared.Component
}

// Fusable is implemented by components that run elsewhere (out-of-process
// plugins). Consecutive members of a policy whose FuseKeys are equal and
// non-nil run as one Run, in one call: a filter+scorer+picker policy served
// by one plugin costs one round trip per decision, not three.
type Fusable interface {
	shared.Component
	// FuseKey identifies the process (or connection) the component lives
	// in.
	FuseKey() any
	// Fuse returns the Run of members, a consecutive slice of the policy
	// (filters, then scorers, then at most the picker, in declared order),
	// every one of them Fusable with this FuseKey.
	Fuse(members []Member) (Run, error)
}

// Run executes a fused run of members over one request's candidates.
type Run interface {
	Run(ctx context.Context, req *shared.Request, c *shared.Candidates) (RunResult, error)
}

// RunResult is a Run's answer in terms of the rows it was given.
type RunResult struct {
	// Kept are the rows that survived the run's filters, ascending; nil
	// means every row.
	Kept []uint32
	// Costs, one per kept row, are the run's weighted scorer costs, added to
	// the costs of earlier scorers; nil when the run has no scorer.
	Costs []float64
	// Picked is the chosen row (an index into the rows given) when the run
	// ends with the picker; -1 otherwise.
	Picked int
	// FilteredBy names the filter that left no row, when one did.
	FilteredBy string
}

// stage is one step of a compiled policy: a local component or a fused run.
type stage struct {
	kind   shared.Kind // of a local component; 0 for a run
	member Member
	run    Run
	names  string // the run's members, for errors
	picks  bool   // the run ends with the picker
	scores bool   // the run has a scorer
}

// Compiled is a policy prepared for Execute: its components in order, with
// consecutive fusable members fused into runs. Immutable; safe to share.
type Compiled struct {
	Policy *policy.Policy
	stages []stage
}

// Compile prepares p. It fails when a Fusable refuses to fuse.
func Compile(p *policy.Policy) (*Compiled, error) {
	var members []Member
	for _, f := range p.Filters {
		members = append(members, Member{Kind: shared.KindFilter, Name: f.Name, Component: f.Filter})
	}
	for _, s := range p.Scorers {
		members = append(members, Member{Kind: shared.KindScorer, Name: s.Name, Weight: s.Weight, Component: s.Scorer})
	}
	members = append(members, Member{Kind: shared.KindPicker, Name: p.PickerName, Component: p.Picker})

	c := &Compiled{Policy: p}
	for i := 0; i < len(members); {
		f, ok := members[i].Component.(Fusable)
		if !ok || f.FuseKey() == nil {
			c.stages = append(c.stages, stage{kind: members[i].Kind, member: members[i]})
			i++
			continue
		}
		key := f.FuseKey()
		j := i + 1
		for j < len(members) {
			g, ok := members[j].Component.(Fusable)
			if !ok || g.FuseKey() != key {
				break
			}
			j++
		}
		run, err := f.Fuse(members[i:j])
		if err != nil {
			return nil, fmt.Errorf("policy %q: fusing %s: %w", p.Name, names(members[i:j]), err)
		}
		st := stage{run: run, names: names(members[i:j]), picks: members[j-1].Kind == shared.KindPicker}
		for _, m := range members[i:j] {
			st.scores = st.scores || m.Kind == shared.KindScorer
		}
		c.stages = append(c.stages, st)
		i = j
	}
	return c, nil
}

func names(ms []Member) string {
	s := ""
	for i, m := range ms {
		if i > 0 {
			s += "+"
		}
		s += fmt.Sprintf("%s %q", m.Kind, m.Name)
	}
	return s
}
