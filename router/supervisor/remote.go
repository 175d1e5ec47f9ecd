package supervisor

import (
	"context"
	"errors"
	"fmt"

	"github.com/switchyard-router/switchyard/router/pipeline"
	"github.com/switchyard-router/switchyard/shared"
)

// configure asks the plugin for a new instance of type typ: the New of
// the types Start returns. A diagnostic naming a parameter becomes a
// *shared.ParamError; one about the whole block, a plain error.
func (p *proc) configure(typ string, kind shared.Kind, info shared.InstanceInfo, params shared.Params) (shared.Component, error) {
	switch kind {
	case shared.KindFilter, shared.KindScorer, shared.KindPicker:
	default:
		return nil, fmt.Errorf("plugin %q: type %q: out-of-process %s components are not supported", p.name, typ, kind)
	}
	if !p.enter() {
		return nil, p.closedErr(nil)
	}
	defer p.leave()
	ctx, cancel := context.WithTimeout(context.Background(), p.startTimeout)
	defer cancel()
	defer context.AfterFunc(p.ctx, cancel)()

	inputs, diags, err := p.rc.Configure(ctx, shared.ConfigureRequest{Info: info, Type: typ, Params: params})
	if err != nil {
		if p.ctx.Err() != nil {
			return nil, p.closedErr(err)
		}
		return nil, fmt.Errorf("plugin %q: configuring %s %q: %w", p.name, typ, info.Name, err)
	}
	if err := diagErrors(diags); err != nil {
		return nil, err
	}
	return &component{p: p, name: info.Name, typ: typ, kind: kind, inputs: inputs}, nil
}

// diagErrors joins a plugin's Configure diagnostics into one error.
func diagErrors(diags []shared.Diagnostic) error {
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
			errs = append(errs, &shared.ParamError{Param: d.Param, Err: errors.New(msg)})
		} else {
			errs = append(errs, errors.New(msg))
		}
	}
	return errors.Join(errs...)
}

// decide sends one task under call_timeout and counts it. The call's
// context is also cancelled when the plugin process exits or stops.
func (p *proc) decide(ctx context.Context, task *shared.Task) (shared.TaskResult, error) {
	p.stats.calls.Add(1)
	if !p.enter() {
		p.stats.errors.Add(1)
		p.stats.fallbacks.Add(1)
		return shared.TaskResult{Picked: -1}, p.closedErr(nil)
	}
	defer p.leave()
	cctx, cancel := context.WithTimeout(ctx, p.callTimeout)
	defer cancel()
	defer context.AfterFunc(p.ctx, cancel)()

	res, err := p.rc.Decide(cctx, task)
	if err == nil {
		return res, nil
	}
	p.stats.fallbacks.Add(1)
	switch {
	case p.ctx.Err() != nil || errors.Is(err, shared.ErrPluginClosed):
		p.stats.errors.Add(1)
		return shared.TaskResult{Picked: -1}, p.closedErr(err)
	case ctx.Err() != nil:
		p.stats.errors.Add(1)
		return shared.TaskResult{Picked: -1}, fmt.Errorf("plugin %q: %w", p.name, ctx.Err())
	case errors.Is(cctx.Err(), context.DeadlineExceeded):
		p.stats.timeouts.Add(1)
		return shared.TaskResult{Picked: -1}, fmt.Errorf("plugin %q: no answer within call_timeout %v: %w",
			p.name, p.callTimeout, context.DeadlineExceeded)
	}
	p.stats.errors.Add(1)
	return shared.TaskResult{Picked: -1}, fmt.Errorf("plugin %q: %w", p.name, err)
}

// component is one instance living in a plugin. Its kind decides which of
// Filter, Score and Pick is valid; inside a policy the pipeline fuses it
// with its neighbours from the same plugin into one Run.
type component struct {
	p      *proc
	name   string // the instance name tasks address it by
	typ    string
	kind   shared.Kind
	inputs shared.Inputs
}

// Inputs returns the inputs the plugin declared for this instance.
func (c *component) Inputs() shared.Inputs { return c.inputs }

// FuseKey is the plugin process: its consecutive members share one task.
func (c *component) FuseKey() any { return c.p }

// Fuse returns a Run sending members as the stages of one task.
func (c *component) Fuse(members []pipeline.Member) (pipeline.Run, error) {
	r := &run{p: c.p, stages: make([]shared.Stage, len(members)), blocks: make(map[string]string, len(members))}
	var last shared.Kind
	for i, m := range members {
		mc, ok := m.Component.(*component)
		if !ok || mc.p != c.p {
			return nil, fmt.Errorf("%s %q is not a component of plugin %q", m.Kind, m.Name, c.p.name)
		}
		if m.Kind != mc.kind {
			return nil, fmt.Errorf("%s %q: type %q of plugin %q is a %s", m.Kind, m.Name, mc.typ, c.p.name, mc.kind)
		}
		switch {
		case m.Kind < shared.KindFilter || m.Kind > shared.KindPicker:
			return nil, fmt.Errorf("%s %q cannot be part of a decision", m.Kind, m.Name)
		case m.Kind < last, last == shared.KindPicker:
			return nil, fmt.Errorf("%s %q is out of order: filters, then scorers, then one picker", m.Kind, m.Name)
		}
		last = m.Kind
		st := shared.Stage{Instance: mc.name, Kind: m.Kind}
		if m.Kind == shared.KindScorer {
			st.Weight = m.Weight
		}
		r.stages[i] = st
		r.blocks[mc.name] = m.Name
	}
	r.picks = last == shared.KindPicker
	return r, nil
}

// Filter runs the filter alone as a one-stage task.
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
	prev := -1
	for _, r := range res.Kept {
		if int(r) >= len(keep) || int(r) <= prev {
			return fmt.Errorf("plugin %q: filter %q: kept rows not ascending within [0, %d)", c.p.name, c.name, len(keep))
		}
		keep[r] = true
		prev = int(r)
	}
	return nil
}

// Score runs the scorer alone (weight 1) as a one-stage task.
func (c *component) Score(ctx context.Context, req *shared.Request, cands *shared.Candidates, costs []float64) error {
	res, err := c.alone(ctx, shared.KindScorer, req, cands)
	if err != nil {
		return err
	}
	if len(res.Costs) != len(costs) {
		return fmt.Errorf("plugin %q: scorer %q: %d costs for %d rows", c.p.name, c.name, len(res.Costs), len(costs))
	}
	copy(costs, res.Costs)
	return nil
}

// Pick runs the picker alone as a one-stage task.
func (c *component) Pick(ctx context.Context, req *shared.Request, cands *shared.Candidates) (int, error) {
	res, err := c.alone(ctx, shared.KindPicker, req, cands)
	if err != nil {
		return -1, err
	}
	return res.Picked, nil
}

func (c *component) alone(ctx context.Context, want shared.Kind, req *shared.Request, cands *shared.Candidates) (shared.TaskResult, error) {
	if c.kind != want {
		return shared.TaskResult{Picked: -1}, fmt.Errorf("plugin %q: %q (type %q) is a %s, not a %s", c.p.name, c.name, c.typ, c.kind, want)
	}
	st := shared.Stage{Instance: c.name, Kind: c.kind}
	if want == shared.KindScorer {
		st.Weight = 1
	}
	return c.p.decide(ctx, &shared.Task{Request: req, Candidates: cands, Stages: []shared.Stage{st}})
}

// run is a fused run of consecutive members living in one plugin.
type run struct {
	p      *proc
	stages []shared.Stage
	blocks map[string]string // instance name -> block name, for FilteredBy
	picks  bool
}

// Run sends the members as one task and returns its answer.
func (r *run) Run(ctx context.Context, req *shared.Request, c *shared.Candidates) (pipeline.RunResult, error) {
	res, err := r.p.decide(ctx, &shared.Task{Request: req, Candidates: c, Stages: r.stages})
	if err != nil {
		return pipeline.RunResult{Picked: -1}, err
	}
	out := pipeline.RunResult{Kept: res.Kept, Costs: res.Costs, Picked: res.Picked, FilteredBy: res.FilteredBy}
	if !r.picks {
		out.Picked = -1
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
