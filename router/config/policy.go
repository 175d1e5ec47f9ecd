package config

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

var policySchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "fallback"},
		{Name: "shadow"},
	},
	Blocks: []hcl.BlockHeaderSchema{
		{Type: "filter", LabelNames: []string{"name"}},
		{Type: "scorer", LabelNames: []string{"name"}},
		{Type: "picker", LabelNames: []string{"name"}},
		{Type: "canary"},
	},
}

// policyDecl is one policy while the loader resolves it.
type policyDecl struct {
	name    string
	builtin bool
	rng     hcl.Range
	comps   []*compDecl // filters, scorers, then the picker

	fallbackAttr  *hcl.Attribute // nil when the fallback is implicit
	fallbackName  string         // as written, or DefaultFallback
	fallback      *policyDecl    // a policy fallback
	fallbackPick  string         // a picker-type fallback
	fallbackEntry *catalog.Entry // its type; nil when unavailable
	fallbackGone  []string       // the failed plugins it may come from
	shadowAttr    *hcl.Attribute // nil without a shadow
	shadow        *policyDecl    // the policy asked beside this one, never acted on
	canary        *canaryDecl    // the canary block; nil without one
	reach         []shared.Role  // the roles reaching the policy, in Roles order
	used          bool

	instances map[shared.Role]*policy.Policy // by role; "" for an unused policy
	policy    *policy.Policy                 // the instance PolicyFile.Policies holds
	repComps  []*Component                   // the components of the first instance
}

func (d *policyDecl) export() *PolicyDecl {
	out := &PolicyDecl{
		Name:       d.name,
		Builtin:    d.builtin,
		Range:      d.rng,
		Components: d.repComps,
		Used:       d.used,
		Roles:      d.reach,
		Policy:     d.policy,
		Instances:  d.instances,
	}
	switch {
	case d.fallback != nil:
		out.Fallback = d.fallback.name
	case d.fallbackPick != "":
		out.Fallback, out.FallbackPicker = d.fallbackPick, true
	}
	if d.shadow != nil {
		out.Shadow = d.shadow.name
	}
	if c := d.canary; c != nil && c.cand != nil {
		out.Canary = c.cand.name
	}
	return out
}

// policyBlock decodes one policy block and its components; instantiation
// waits until the roles reaching the policy are known.
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
		fallbackName: DefaultFallback,
	}
	content, diags := blk.Body.Content(policySchema)
	l.diags = append(l.diags, diags...)

	seen := make(map[string]*hcl.Block)
	var picker *hcl.Block
	var filters, scorers []*compDecl
	var pick *compDecl
	for _, cb := range content.Blocks {
		if cb.Type == "canary" {
			l.canaryBlock(d, cb)
			continue
		}
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
			if c := l.decodeComponent(shared.KindFilter, cb, cname, where); c != nil {
				filters = append(filters, c)
			}
		case "scorer":
			if c := l.decodeComponent(shared.KindScorer, cb, cname, where); c != nil {
				scorers = append(scorers, c)
			}
		case "picker":
			if picker != nil {
				l.errorf(cb.DefRange, "Duplicate picker",
					"Policy %q already has picker %q at %s; a policy has exactly one picker.",
					name, picker.Labels[0], pos(picker.DefRange))
				continue
			}
			picker = cb
			pick = l.decodeComponent(shared.KindPicker, cb, cname, where)
		}
	}
	// A policy body with an unexpected block or argument (a misspelled
	// `pickr` block, `picker = ...`) has its own error, and that may be
	// the picker: "Missing picker" would only precede the real error. So
	// may a syntax error anywhere (it may have dropped the picker block).
	if picker == nil && !diags.HasErrors() && !l.syntaxErrors {
		l.errorf(blk.DefRange, "Missing picker",
			"Policy %q has no picker; add exactly one, for example: picker \"pick\" { type = %q }.", name, DefaultPickerType)
	}
	d.comps = append(filters, scorers...)
	if pick != nil {
		d.comps = append(d.comps, pick)
	}

	if attr, ok := content.Attributes["fallback"]; ok {
		d.fallbackAttr = attr
		d.fallbackName = ""
		if s, ok := l.stringAttr(attr); ok && s == "" {
			l.attrErrorf(attr, "Empty fallback",
				"Policy %q names no fallback: name a policy, %q or a picker type (without the attribute it is %q).", name, DefaultPolicyName, DefaultFallback)
		} else if ok {
			d.fallbackName = s
		}
	}
	if attr, ok := content.Attributes["shadow"]; ok {
		d.shadowAttr = attr
	}
	if nameOK {
		l.decls = append(l.decls, d)
		l.byName[name] = d
	}
}

// buildDefault declares the built-in default policy from the catalog's
// kv-affinity scorer and min-cost picker, when both are registered.
func (l *loader) buildDefault() {
	scorer, err1 := l.cat.LookupKind(DefaultScorerType, shared.KindScorer)
	picker, err2 := l.cat.LookupKind(DefaultPickerType, shared.KindPicker)
	if err1 != nil || err2 != nil {
		return
	}
	l.def = &policyDecl{
		name:    DefaultPolicyName,
		builtin: true,
		comps: []*compDecl{
			{kind: shared.KindScorer, name: "cost", typ: DefaultScorerType, where: "default policy scorer",
				entry: scorer, weight: 1, builtin: true},
			{kind: shared.KindPicker, name: "pick", typ: DefaultPickerType, where: "default policy picker",
				entry: picker, builtin: true},
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
			return
		}
		if f := l.byName[name]; f != nil {
			d.fallback = f
			return
		}
	}
	e, err := l.cat.LookupKind(name, shared.KindPicker)
	if err != nil {
		var unknown *catalog.UnknownTypeError
		if failed := l.failedFallback(); attr != nil && errors.As(err, &unknown) && len(failed) > 0 {
			d.fallbackPick, d.fallbackGone = name, failed
			return
		}
		if attr != nil {
			l.attrErrorf(attr, "Unknown fallback",
				"Policy %q falls back to %q, which is neither a policy nor a picker type. %s Picker types: %s.",
				d.name, name, l.policyChoices(), strings.Join(l.cat.Names(shared.KindPicker), ", "))
		}
		return
	}
	d.fallbackPick, d.fallbackEntry = name, e
	l.usedSources[e.Source] = true
}

// resolveShadow links d to its shadow policy: a declared policy or the
// default policy. Unlike a fallback it cannot be a picker type (declare a
// one-picker policy for that), and it must not be d itself, have a shadow
// of its own (shadows do not chain), or be in d's fallback chain (the
// role's instance would be shared by the live path and the shadow).
// Resolve every fallback first.
func (l *loader) resolveShadow(d *policyDecl) {
	attr := d.shadowAttr
	if attr == nil {
		return
	}
	name, ok := l.stringAttr(attr)
	if !ok {
		return
	}
	s := l.byName[name]
	if name == DefaultPolicyName && s == nil {
		s = l.def
	}
	// A shadow in error may have meant any policy: no "Unused policy"
	// beside the error (restored when it resolves).
	prev := l.badSelection
	l.badSelection = true
	switch {
	case s == nil && name == DefaultPolicyName:
		l.attrErrorf(attr, "Default policy unavailable",
			"Policy %q is shadowed by the default policy (%s scorer + %s picker), but the catalog does not register both types; name another shadow.",
			d.name, DefaultScorerType, DefaultPickerType)
	case s == nil:
		l.attrErrorf(attr, "Unknown shadow",
			"Policy %q is shadowed by %q, which is not a policy. %s A shadow is a policy; to shadow with a picker type, declare a policy with just that picker.",
			d.name, name, l.policyChoices())
	case s == d:
		l.attrErrorf(attr, "Policy shadows itself",
			"Policy %q names itself as its shadow; a shadow is another policy, tried beside this one.", d.name)
	case s.shadowAttr != nil:
		l.attrErrorf(attr, "Shadow chain",
			"Policy %q is shadowed by %q, which has a shadow of its own (at %s); shadows do not chain: remove one of the two.",
			d.name, s.name, pos(s.shadowAttr.Range))
	default:
		for f, n := d.fallback, 0; f != nil && n <= len(l.decls); f, n = f.fallback, n+1 {
			if f == s {
				l.attrErrorf(attr, "Shadow in the fallback chain",
					"Policy %q is shadowed by %q, which is also in its fallback chain; the shadow would share the live path's instance. Shadow with another policy.",
					d.name, s.name)
				return
			}
		}
		d.shadow = s
		l.badSelection = prev
	}
}

// instantiateAll builds every policy once per role that reaches it (once
// with the empty role when none does), then links each instance to its
// fallback's instance for the same role.
func (l *loader) instantiateAll() {
	all := l.allDecls()
	for _, d := range all {
		d.instances = make(map[shared.Role]*policy.Policy)
		roles := d.reach
		if len(roles) == 0 {
			roles = []shared.Role{""}
		}
		for i, role := range roles {
			p, comps, complete := l.instantiatePolicy(d, role)
			if complete {
				d.instances[role] = p
			}
			if i == 0 {
				d.repComps = comps
				if complete {
					d.policy = p
				}
			}
		}
	}
	for _, d := range all {
		for role, p := range d.instances {
			if d.fallback != nil {
				p.Fallback = d.fallback.instances[role]
				if p.Fallback == nil {
					p.Fallback = d.fallback.policy
				}
			}
			if d.shadow != nil {
				p.Shadow = d.shadow.instances[role]
				if p.Shadow == nil {
					p.Shadow = d.shadow.policy
				}
			}
			p.Canary = canaryOf(d, role)
		}
	}
}

// instantiatePolicy builds d's components for role. complete is false when
// a component failed (already reported) or, for the empty role, when an
// out-of-process component was decoded but not configured.
func (l *loader) instantiatePolicy(d *policyDecl, role shared.Role) (*policy.Policy, []*Component, bool) {
	p := &policy.Policy{Name: d.name}
	complete := true
	var comps []*Component
	for _, c := range d.comps {
		configure := role != "" || c.entry == nil || !c.entry.OutOfProcess
		comp := l.instantiate(c, role, instanceName(role, d.name, c.name), configure)
		if comp == nil {
			complete = false
			continue
		}
		comps = append(comps, comp)
		if comp.Instance == nil {
			complete = false
			continue
		}
		switch c.kind {
		case shared.KindFilter:
			p.Filters = append(p.Filters, policy.NamedFilter{
				Name: c.name, Type: c.typ, Filter: comp.Instance.(shared.Filter),
			})
		case shared.KindScorer:
			p.Scorers = append(p.Scorers, policy.WeightedScorer{
				Name: c.name, Type: c.typ, Weight: c.weight, Scorer: comp.Instance.(shared.Scorer),
			})
		case shared.KindPicker:
			p.PickerName, p.PickerType = c.name, c.typ
			p.Picker = comp.Instance.(shared.Picker)
		}
	}
	if d.fallbackPick != "" {
		f, ok := l.fallbackPicker(d, role)
		p.Fallback = f
		complete = complete && ok
	}
	return p, comps, complete
}

// fallbackPicker builds d's picker-type fallback for role as a
// picker-only policy with default parameters, instance
// "ROLE/POLICY/fallback". For the empty role an out-of-process type is not
// configured: it returns nil, false.
func (l *loader) fallbackPicker(d *policyDecl, role shared.Role) (*policy.Policy, bool) {
	name, attr := d.fallbackPick, d.fallbackAttr
	if d.fallbackGone != nil {
		return &policy.Policy{Name: name, PickerName: name, PickerType: name,
			Picker: newUnavailable(d.fallbackGone, name)}, true
	}
	e := d.fallbackEntry
	if role == "" && e.OutOfProcess {
		return nil, false
	}
	key := seedKey(role, fmt.Sprintf("fallback picker %s of policy %s", name, d.name))
	info := shared.InstanceInfo{Name: instanceName(role, d.name, "fallback"), Role: role, BlockSize: l.file.BlockSize}
	inst, err := newInstance(&e.TypeInfo, info, e.WithDefaults(l.withSeed(&e.TypeInfo, nil, key)))
	if err != nil {
		subject := hcl.Range{Filename: l.filename, Start: hcl.InitialPos, End: hcl.InitialPos}
		if attr != nil {
			subject = attr.Expr.Range()
		} else if !d.builtin {
			subject = d.rng
		}
		l.errorf(subject, "Invalid fallback",
			"Picker type %q cannot run with its default parameters as the fallback of policy %q: %v.", name, d.name, err)
		return nil, false
	}
	if attr != nil {
		l.checkDeprecated(inst, attr.Expr.Range(), fmt.Sprintf("fallback picker %q of policy %q", name, d.name))
	}
	return &policy.Policy{Name: name, PickerName: name, PickerType: name, Picker: inst.(shared.Picker)}, true
}

// instanceName is "ROLE/POLICY/BLOCK", or "POLICY/BLOCK" for the empty
// role.
func instanceName(role shared.Role, policy, block string) string {
	if role == "" {
		return policy + "/" + block
	}
	return string(role) + "/" + policy + "/" + block
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

// markUsed records the roles reaching each policy, directly, through
// fallbacks, as the shadow of a role's policy or as its canary's candidate
// (and the candidate's fallbacks), and warns about the declared policies
// nothing reaches.
func (l *loader) markUsed() {
	for _, role := range Roles {
		name, ok := l.file.RolePolicies[role]
		if !ok {
			continue
		}
		d := l.def
		if name != DefaultPolicyName {
			d = l.byName[name]
		}
		seen := make(map[*policyDecl]bool)
		for f := d; f != nil && !seen[f]; f = f.fallback {
			seen[f] = true
			f.used = true
			f.reach = append(f.reach, role)
		}
		// The role's own policy's shadow runs for the role (not its
		// fallbacks' shadows, nor the shadow's fallback).
		if s := d.shadow; s != nil && !seen[s] {
			s.used = true
			s.reach = append(s.reach, role)
		}
		// So does its canary's candidate, with the candidate's fallbacks
		// (they answer when the candidate fails).
		if c := d.canary; c != nil && c.cand != nil {
			for f := c.cand; f != nil && !seen[f]; f = f.fallback {
				seen[f] = true
				if f == d.shadow {
					continue // reached already, as the shadow
				}
				f.used = true
				f.reach = append(f.reach, role)
			}
		}
	}
	for _, d := range l.decls {
		// A role whose selection has an error may have meant any policy.
		if !d.used && !l.badSelection {
			l.warnf(d.rng, "Unused policy",
				"Policy %q is declared but unused: no role selects it in worker_selection, directly, as a fallback of a policy in use, as the shadow of a role's policy or as its canary. Select it for a role or remove it.",
				d.name)
		}
	}
}
