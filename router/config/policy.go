package config

import (
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2"

	"github.com/switchyard-router/switchyard/shared"
)

var policySchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "fallback"},
	},
	Blocks: []hcl.BlockHeaderSchema{
		{Type: "filter", LabelNames: []string{"name"}},
		{Type: "scorer", LabelNames: []string{"name"}},
		{Type: "picker", LabelNames: []string{"name"}},
	},
}

// policyDecl is one policy while the loader resolves it.
type policyDecl struct {
	name       string
	builtin    bool
	rng        hcl.Range
	components []*Component
	policy     *shared.Policy

	fallbackAttr *hcl.Attribute // nil when the fallback is implicit
	fallbackName string         // as written, or DefaultFallback
	fallback     *policyDecl    // a policy fallback
	fallbackPick string         // a picker-type fallback
	roles        []shared.Role
	used         bool
}

func (d *policyDecl) export() *PolicyDecl {
	out := &PolicyDecl{
		Name:       d.name,
		Builtin:    d.builtin,
		Range:      d.rng,
		Components: d.components,
		Used:       d.used,
		Policy:     d.policy,
	}
	switch {
	case d.fallback != nil:
		out.Fallback = d.fallback.name
	case d.fallbackPick != "":
		out.Fallback, out.FallbackPicker = d.fallbackPick, true
	}
	return out
}

// policyBlock decodes one policy block and instantiates its components.
func (l *loader) policyBlock(blk *hcl.Block) {
	name := blk.Labels[0]
	nameOK := l.checkName("policy", name, blk.LabelRanges[0])
	if first := l.byName[name]; nameOK && first != nil {
		l.errorf(blk.LabelRanges[0], "Duplicate policy",
			"Policy %q is already declared at %s; rename or remove one of them.", name, pos(first.rng))
		nameOK = false
	}
	d := &policyDecl{
		name:         name,
		rng:          blk.DefRange,
		policy:       &shared.Policy{Name: name},
		fallbackName: DefaultFallback,
	}
	content, diags := blk.Body.Content(policySchema)
	l.diags = append(l.diags, diags...)

	seen := make(map[string]*hcl.Block)
	var picker *hcl.Block
	var filters, scorers []*Component
	var pick *Component
	for _, cb := range content.Blocks {
		cname := cb.Labels[0]
		cnameOK := l.checkName(cb.Type, cname, cb.LabelRanges[0])
		if first := seen[cname]; cnameOK && first != nil {
			l.errorf(cb.LabelRanges[0], "Duplicate component name",
				"Policy %q already has a component named %q (%s at %s); component names must be unique within a policy.",
				name, cname, first.Type, pos(first.DefRange))
		} else if cnameOK {
			seen[cname] = cb
		}
		where := fmt.Sprintf("%s %q of policy %q", cb.Type, cname, name)
		switch cb.Type {
		case "filter":
			if c := l.component(shared.KindFilter, cb, cname, where); c != nil {
				filters = append(filters, c)
				d.policy.Filters = append(d.policy.Filters, shared.NamedFilter{
					Name: cname, Type: c.Type, Filter: c.Instance.(shared.Filter),
				})
			}
		case "scorer":
			if c := l.component(shared.KindScorer, cb, cname, where); c != nil {
				scorers = append(scorers, c)
				d.policy.Scorers = append(d.policy.Scorers, shared.WeightedScorer{
					Name: cname, Type: c.Type, Weight: c.Weight, Scorer: c.Instance.(shared.Scorer),
				})
			}
		case "picker":
			if picker != nil {
				l.errorf(cb.DefRange, "Duplicate picker",
					"Policy %q already has picker %q at %s; a policy has exactly one picker.",
					name, picker.Labels[0], pos(picker.DefRange))
				continue
			}
			picker = cb
			if c := l.component(shared.KindPicker, cb, cname, where); c != nil {
				pick = c
				d.policy.PickerName, d.policy.PickerType = cname, c.Type
				d.policy.Picker = c.Instance.(shared.Picker)
			}
		}
	}
	if picker == nil {
		l.errorf(blk.DefRange, "Missing picker",
			"Policy %q has no picker; add exactly one, for example: picker \"pick\" { type = %q }.", name, DefaultPickerType)
	}
	d.components = append(append(filters, scorers...), []*Component{pick}...)
	if pick == nil {
		d.components = d.components[:len(d.components)-1]
	}

	if attr, ok := content.Attributes["fallback"]; ok {
		d.fallbackAttr = attr
		d.fallbackName = ""
		if s, ok := l.stringAttr(attr); ok {
			d.fallbackName = s
		}
	}
	if nameOK {
		l.decls = append(l.decls, d)
		l.byName[name] = d
	}
}

// buildDefault builds the built-in default policy from the catalog's
// kv-cost scorer and min-cost picker, when both are registered.
func (l *loader) buildDefault() {
	scorer, err1 := l.cat.LookupKind(DefaultScorerType, shared.KindScorer)
	picker, err2 := l.cat.LookupKind(DefaultPickerType, shared.KindPicker)
	if err1 != nil || err2 != nil {
		return
	}
	sParams := scorer.WithDefaults(l.withSeed(&scorer.TypeInfo, nil, "default policy scorer"))
	pParams := picker.WithDefaults(l.withSeed(&picker.TypeInfo, nil, "default policy picker"))
	s, err := l.instantiate(&scorer.TypeInfo, sParams)
	if err != nil {
		l.errorf(hcl.Range{Filename: l.filename, Start: hcl.InitialPos, End: hcl.InitialPos}, "Default policy unavailable",
			"Building the default policy's %s scorer failed: %v.", DefaultScorerType, err)
		return
	}
	p, err := l.instantiate(&picker.TypeInfo, pParams)
	if err != nil {
		l.errorf(hcl.Range{Filename: l.filename, Start: hcl.InitialPos, End: hcl.InitialPos}, "Default policy unavailable",
			"Building the default policy's %s picker failed: %v.", DefaultPickerType, err)
		return
	}
	sc := &Component{Kind: shared.KindScorer, Name: "cost", Type: DefaultScorerType, Source: scorer.Source,
		Weight: 1, Params: sParams, Instance: s}
	pc := &Component{Kind: shared.KindPicker, Name: "pick", Type: DefaultPickerType, Source: picker.Source,
		Params: pParams, Instance: p}
	l.def = &policyDecl{
		name:       DefaultPolicyName,
		builtin:    true,
		components: []*Component{sc, pc},
		policy: &shared.Policy{
			Name:       DefaultPolicyName,
			Scorers:    []shared.WeightedScorer{{Name: sc.Name, Type: sc.Type, Weight: 1, Scorer: s.(shared.Scorer)}},
			PickerName: pc.Name,
			PickerType: pc.Type,
			Picker:     p.(shared.Picker),
		},
		fallbackName: DefaultFallback,
	}
	l.resolveFallback(l.def)
}

// resolveFallback links d to its fallback: a declared policy, the default
// policy, or a picker type run as a picker-only policy. An implicit
// fallback always means the least-loaded picker type, and is dropped when
// the catalog has no such type.
func (l *loader) resolveFallback(d *policyDecl) {
	name, attr := d.fallbackName, d.fallbackAttr
	if name == "" {
		return // a bad value, already reported
	}
	if attr != nil {
		if name == DefaultPolicyName {
			if l.def == nil {
				l.attrErrorf(attr, "Default policy unavailable",
					"Policy %q falls back to the default policy (%s scorer + %s picker), but the catalog does not register both types; name another fallback.",
					d.name, DefaultScorerType, DefaultPickerType)
				return
			}
			d.fallback = l.def
			d.policy.Fallback = l.def.policy
			return
		}
		if f := l.byName[name]; f != nil {
			d.fallback = f
			d.policy.Fallback = f.policy
			return
		}
	}
	e, err := l.cat.LookupKind(name, shared.KindPicker)
	if err != nil {
		if attr != nil {
			l.attrErrorf(attr, "Unknown fallback",
				"Policy %q falls back to %q, which is neither a policy nor a picker type. %s Picker types: %s.",
				d.name, name, l.policyChoices(), strings.Join(l.cat.Names(shared.KindPicker), ", "))
		}
		return
	}
	d.fallbackPick = name
	if p := l.pickerFallbacks[name]; p != nil {
		d.policy.Fallback = p
		return
	}
	inst, err := l.instantiate(&e.TypeInfo, e.WithDefaults(l.withSeed(&e.TypeInfo, nil, "fallback picker "+name)))
	if err != nil {
		subject := hcl.Range{Filename: l.filename, Start: hcl.InitialPos, End: hcl.InitialPos}
		if attr != nil {
			subject = attr.Expr.Range()
		} else if !d.builtin {
			subject = d.rng
		}
		l.errorf(subject, "Invalid fallback",
			"Picker type %q cannot run with its default parameters as the fallback of policy %q: %v.", name, d.name, err)
		return
	}
	if attr != nil {
		l.checkDeprecated(inst, attr.Expr.Range(), fmt.Sprintf("fallback picker %q of policy %q", name, d.name))
	}
	p := &shared.Policy{Name: name, PickerName: name, PickerType: name, Picker: inst.(shared.Picker)}
	l.pickerFallbacks[name] = p
	d.policy.Fallback = p
}

// checkCycles reports each cycle of policy fallbacks once, at the fallback
// attribute of its first policy in file order.
func (l *loader) checkCycles() {
	const (
		unvisited = iota
		active
		done
	)
	state := make(map[*policyDecl]int)
	for _, start := range l.decls {
		if state[start] != unvisited {
			continue
		}
		var path []*policyDecl
		d := start
		for d != nil && state[d] == unvisited {
			state[d] = active
			path = append(path, d)
			d = d.fallback
		}
		if d != nil && state[d] == active {
			// The cycle is the tail of path starting at d.
			i := 0
			for path[i] != d {
				i++
			}
			cycle := path[i:]
			first := cycle[0]
			for _, c := range cycle {
				if c.rng.Start.Byte < first.rng.Start.Byte {
					first = c
				}
			}
			var names []string
			for k := range cycle {
				names = append(names, fmt.Sprintf("%q", cycle[(indexOf(cycle, first)+k)%len(cycle)].name))
			}
			names = append(names, fmt.Sprintf("%q", first.name))
			l.attrErrorf(first.fallbackAttr, "Fallback cycle",
				"Policy fallbacks form a cycle: %s. End the chain with a picker type such as %q.",
				strings.Join(names, " -> "), DefaultFallback)
		}
		for _, p := range path {
			state[p] = done
		}
	}
}

func indexOf(ds []*policyDecl, d *policyDecl) int {
	for i, x := range ds {
		if x == d {
			return i
		}
	}
	return -1
}

// markUsed marks every policy reachable from a role and warns about the
// declared policies nothing reaches.
func (l *loader) markUsed() {
	all := append([]*policyDecl{}, l.decls...)
	if l.def != nil {
		all = append(all, l.def)
	}
	for _, d := range all {
		if len(d.roles) == 0 {
			continue
		}
		for f := d; f != nil && !f.used; f = f.fallback {
			f.used = true
		}
	}
	for _, d := range l.decls {
		if !d.used {
			l.warnf(d.rng, "Unused policy",
				"Policy %q is declared but unused: no role selects it in worker_selection, directly or as a fallback of a policy in use. Select it for a role or remove it.",
				d.name)
		}
	}
}
