package supervisor

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/switchyard-router/switchyard/internal/pluginclient"
	"github.com/switchyard-router/switchyard/router/pipeline"
	"github.com/switchyard-router/switchyard/shared"
)

// diagErrors joins a plugin's Configure diagnostics into one error.
func diagErrors(diags []pluginclient.Diagnostic) error {
	var errs []error
	for _, d := range diags {
		msg := d.Summary
		if d.Detail != "" {
			if msg != "" {
				msg += ": "
			}
			msg += d.Detail
		}
		if d.Param != "" {
			// The SDK's summary of a *shared.ParamError names the
			// parameter already: say it once.
			msg = strings.TrimPrefix(msg, fmt.Sprintf("parameter %q: ", d.Param))
			errs = append(errs, &shared.ParamError{Param: d.Param, Err: errors.New(msg)})
		} else {
			errs = append(errs, errors.New(msg))
		}
	}
	return errors.Join(errs...)
}

// component is one instance living in a plugin. Its kind decides which of
// Filter, Score and Pick is valid; inside a policy the pipeline fuses it
// with its neighbours from the same plugin into one Run.
type component struct {
	m      *managed
	name   string // the instance name tasks address it by
	typ    string
	kind   shared.Kind
	inputs shared.Inputs
}

// Inputs returns the inputs the plugin declared for this instance.
func (c *component) Inputs() shared.Inputs { return c.inputs }

// FuseKey is the plugin: its consecutive members share one task.
func (c *component) FuseKey() any { return c.m }

// Fuse returns a Run sending members as the stages of one task.
func (c *component) Fuse(members []pipeline.Member) (pipeline.Run, error) {
	r := &run{m: c.m, stages: make([]pluginclient.Stage, len(members)), blocks: make(map[string]string, len(members))}
	var last shared.Kind
	for i, m := range members {
		mc, ok := asComponent(m.Component)
		if !ok || mc.m != c.m {
			return nil, fmt.Errorf("%s %q is not a component of plugin %q", m.Kind, m.Name, c.m.name)
		}
		if m.Kind != mc.kind {
			return nil, fmt.Errorf("%s %q: type %q of plugin %q is a %s", m.Kind, m.Name, mc.typ, c.m.name, mc.kind)
		}
		switch {
		case m.Kind < shared.KindFilter || m.Kind > shared.KindPicker:
			return nil, fmt.Errorf("%s %q cannot be part of a decision", m.Kind, m.Name)
		case m.Kind < last, last == shared.KindPicker:
			return nil, fmt.Errorf("%s %q is out of order: filters, then scorers, then one picker", m.Kind, m.Name)
		}
		last = m.Kind
		st := pluginclient.Stage{Instance: mc.name, Kind: m.Kind}
		if m.Kind == shared.KindScorer {
			st.Weight = m.Weight
		}
		r.stages[i] = st
		r.blocks[mc.name] = m.Name
	}
	r.picks = last == shared.KindPicker
	r.filters = members[0].Kind == shared.KindFilter
	return r, nil
}

// Filter runs the filter alone as a one-stage task. Its answer was
// checked (managed.decide): kept rows ascending within the rows sent.
func (c *component) Filter(ctx context.Context, req *shared.Request, cands *shared.Candidates, keep []bool) error {
	res, err := c.alone(ctx, shared.KindFilter, req, cands)
	if err != nil {
		return err
	}
	if res.FilteredBy != "" {
		clear(keep)
		return nil
	}
	if res.Kept == nil {
		return nil
	}
	clear(keep)
	for _, r := range res.Kept {
		keep[r] = true
	}
	return nil
}

// Score runs the scorer alone (weight 1) as a one-stage task. Its answer
// was checked (managed.decide): one finite cost per row.
func (c *component) Score(ctx context.Context, req *shared.Request, cands *shared.Candidates, costs []float64) error {
	res, err := c.alone(ctx, shared.KindScorer, req, cands)
	if err != nil {
		return err
	}
	copy(costs, res.Costs)
	return nil
}

// Pick runs the picker alone as a one-stage task. Its answer was checked
// (managed.decide): a row within the rows sent.
func (c *component) Pick(ctx context.Context, req *shared.Request, cands *shared.Candidates) (int, error) {
	res, err := c.alone(ctx, shared.KindPicker, req, cands)
	if err != nil {
		return -1, err
	}
	return res.Picked, nil
}

func (c *component) alone(ctx context.Context, want shared.Kind, req *shared.Request, cands *shared.Candidates) (pluginclient.TaskResult, error) {
	if c.kind != want {
		return pluginclient.TaskResult{Picked: -1}, fmt.Errorf("plugin %q: %q (type %q) is a %s, not a %s", c.m.name, c.name, c.typ, c.kind, want)
	}
	st := pluginclient.Stage{Instance: c.name, Kind: c.kind}
	if want == shared.KindScorer {
		st.Weight = 1
	}
	return c.m.decide(ctx, &pluginclient.Task{Request: req, Candidates: cands, Stages: []pluginclient.Stage{st}})
}

// run is a fused run of consecutive members living in one plugin.
type run struct {
	m       *managed
	stages  []pluginclient.Stage
	blocks  map[string]string // instance name -> block name, for FilteredBy
	picks   bool
	filters bool // the run starts with a filter
}

// Run sends the members as one task and returns its answer, checked
// (managed.decide): a filtered_by names one of the run's filters, and is
// returned as that filter's block name.
func (r *run) Run(ctx context.Context, req *shared.Request, c *shared.Candidates) (pipeline.RunResult, error) {
	res, err := r.m.decide(ctx, &pluginclient.Task{Request: req, Candidates: c, Stages: r.stages})
	if err != nil {
		return pipeline.RunResult{Picked: -1}, err
	}
	out := pipeline.RunResult{Kept: res.Kept, Costs: res.Costs, Picked: res.Picked, FilteredBy: res.FilteredBy}
	if !r.picks {
		out.Picked = -1
	}
	if !r.filters {
		out.Kept = nil // a run without a filter keeps every row
	}
	if name, ok := r.blocks[res.FilteredBy]; ok {
		out.FilteredBy = name
	}
	return out, nil
}

// Interface guards.
var (
	_ shared.Filter    = (*component)(nil)
	_ shared.Scorer    = (*component)(nil)
	_ shared.Picker    = (*component)(nil)
	_ pipeline.Fusable = (*component)(nil)
	_ pipeline.Run     = (*run)(nil)
)
