package config

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hcldec"
	"github.com/zclconf/go-cty/cty"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/shared"
)

// Attributes every component block takes besides its type's parameters.
const (
	attrType   = "type"
	attrWeight = "weight"
)

// component decodes one filter, scorer, picker or request_classifier block
// and instantiates it. where names the block in diagnostics ("scorer "cost"
// of policy "kv""). It returns nil after reporting any error.
func (l *loader) component(kind shared.Kind, blk *hcl.Block, name, where string) *Component {
	schema := &hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: attrType, Required: true}}}
	if kind == shared.KindScorer {
		schema.Attributes = append(schema.Attributes, hcl.AttributeSchema{Name: attrWeight})
	}
	content, remain, diags := blk.Body.PartialContent(schema)
	l.diags = append(l.diags, diags...)

	weight := 0.0
	if kind == shared.KindScorer {
		weight = 1
		if attr, ok := content.Attributes[attrWeight]; ok {
			weight = l.weight(attr, where)
		}
	}
	attr, ok := content.Attributes[attrType]
	if !ok {
		return nil // "Missing required argument", reported by PartialContent
	}
	typ, ok := l.stringAttr(attr)
	if !ok {
		return nil
	}
	entry := l.lookup(typ, kind, attr, where)
	if entry == nil {
		return nil
	}
	params, attrs, ok := l.decodeParams(&entry.TypeInfo, remain, where)
	if !ok || weight < 0 {
		return nil
	}
	params = entry.WithDefaults(l.withSeed(&entry.TypeInfo, params, where))
	inst, err := l.instantiate(&entry.TypeInfo, params)
	if err != nil {
		var pe *shared.ParamError
		if errors.As(err, &pe) {
			if a := attrs[pe.Param]; a != nil {
				l.attrErrorf(a, "Invalid parameter value", "%s (type %q) refused %s = %s: %v.%s",
					capitalize(where), typ, pe.Param, exprText(a), pe.Err, paramDoc(&entry.TypeInfo, pe.Param))
			} else {
				l.errorf(blk.DefRange, "Invalid parameter value", "%s (type %q) refused parameter %q: %v.%s",
					capitalize(where), typ, pe.Param, pe.Err, paramDoc(&entry.TypeInfo, pe.Param))
			}
		} else {
			l.errorf(blk.DefRange, "Invalid "+kind.String()+" configuration", "%s (type %q): %v.", capitalize(where), typ, err)
		}
		return nil
	}
	l.checkDeprecated(inst, blk.DefRange, where)
	return &Component{
		Kind:     kind,
		Name:     name,
		Type:     typ,
		Source:   entry.Source,
		Weight:   weight,
		Params:   params,
		Instance: inst,
		Range:    blk.DefRange,
	}
}

// weight decodes a scorer weight; it returns -1 after reporting an error.
func (l *loader) weight(attr *hcl.Attribute, where string) float64 {
	v, ok := l.nonNull(attr, cty.Number)
	if !ok {
		return -1
	}
	w, err := toFloat(v)
	if err == nil && w < 0 {
		err = fmt.Errorf("must be >= 0, got %v", w)
	}
	if err != nil {
		l.attrErrorf(attr, "Invalid weight", "The weight of %s %s; weights are finite numbers >= 0 (default 1).", where, err)
		return -1
	}
	return w
}

// lookup finds the type of a component block, reporting an unknown type
// (with the available types of that kind), a type of another kind, or a
// type that may come from a declared plugin.
func (l *loader) lookup(typ string, kind shared.Kind, attr *hcl.Attribute, where string) *catalog.Entry {
	e, err := l.cat.LookupKind(typ, kind)
	if err == nil {
		return e
	}
	var unknown *catalog.UnknownTypeError
	var wrong *catalog.WrongKindError
	switch {
	case errors.As(err, &unknown) && kind == shared.KindClassifier && len(unknown.Available) == 0 && len(l.plugins) == 0:
		l.attrErrorf(attr, "Request classifiers not supported yet",
			"%s uses type %q, but this router has no request classifier types yet (header-priority, session-affinity and prompt-length-class are planned). Remove the request_classifier block.",
			capitalize(where), typ)
	case errors.As(err, &unknown) && len(l.plugins) > 0:
		l.pluginTypes++
		var names []string
		for _, p := range l.plugins {
			names = append(names, fmt.Sprintf("plugin %q (%s)", p.Name, pos(p.Range)))
		}
		l.attrErrorf(attr, "Plugin types not supported yet",
			"%s uses type %q, which is not a built-in %s type. It may come from %s, but types from plugin binaries are not supported yet. Built-in %s types: %s.",
			capitalize(where), typ, kind, strings.Join(names, ", "), kind, available(unknown.Available))
	case errors.As(err, &unknown):
		l.attrErrorf(attr, "Unknown "+kind.String()+" type",
			"%s uses type %q, which is not registered. Available %s types: %s.",
			capitalize(where), typ, kind, available(unknown.Available))
	case errors.As(err, &wrong):
		l.attrErrorf(attr, "Wrong component kind",
			"%s uses type %q, which is a %s, not a %s. Available %s types: %s.",
			capitalize(where), typ, wrong.Got, wrong.Want, kind, available(l.cat.Names(kind)))
	default:
		l.attrErrorf(attr, "Unknown "+kind.String()+" type", "%s: %v.", capitalize(where), err)
	}
	return nil
}

func available(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// paramSpec returns the hcldec spec of one parameter.
func paramSpec(p shared.ParamSpec) (hcldec.Spec, bool) {
	var ty cty.Type
	switch p.Type {
	case shared.Number, shared.Int:
		ty = cty.Number
	case shared.Bool:
		ty = cty.Bool
	case shared.String, shared.Duration:
		ty = cty.String
	default:
		return nil, false
	}
	return &hcldec.AttrSpec{Name: p.Name, Type: ty, Required: p.Required}, true
}

// decodeParams decodes the body left after type and weight against the
// type's parameter schema. It returns the parameters given (without
// defaults) and the attribute of each, by name.
func (l *loader) decodeParams(t *shared.TypeInfo, body hcl.Body, where string) (shared.Params, map[string]*hcl.Attribute, bool) {
	spec := make(hcldec.ObjectSpec, len(t.Params))
	for _, p := range t.Params {
		s, ok := paramSpec(p)
		if !ok {
			l.errorf(body.MissingItemRange(), "Invalid parameter schema",
				"Type %q declares parameter %q with unknown type %d; this is a bug in the type, report it to its author.", t.Name, p.Name, p.Type)
			return nil, nil, false
		}
		spec[p.Name] = s
	}
	obj, diags := hcldec.Decode(body, spec, nil)
	l.diags = append(l.diags, diags...)
	// The attributes' ranges, for this and later diagnostics; Decode has
	// already reported anything wrong with the body itself.
	content, _, _ := body.PartialContent(hcldec.ImpliedSchema(spec))
	attrs := make(map[string]*hcl.Attribute)
	if content != nil {
		attrs = content.Attributes
	}
	if obj.IsNull() || !obj.IsKnown() || !obj.Type().IsObjectType() {
		return nil, attrs, false
	}

	// Convert every value hcldec could decode, so one run reports all bad
	// values; those it could not are unknown and already reported.
	params := make(shared.Params)
	ok := !diags.HasErrors()
	for _, p := range t.Params {
		attr := attrs[p.Name]
		if attr == nil || !obj.Type().HasAttribute(p.Name) {
			continue
		}
		v := obj.GetAttr(p.Name)
		if !v.IsWhollyKnown() && diags.HasErrors() {
			continue
		}
		if !v.IsWhollyKnown() {
			l.attrErrorf(attr, "Invalid attribute value", "The value of %q must be known when the file loads.", p.Name)
			ok = false
			continue
		}
		if v.IsNull() {
			if p.Required {
				l.attrErrorf(attr, "Missing required argument",
					"Parameter %q of %s is required and must not be null.%s", p.Name, where, paramDoc(t, p.Name))
				ok = false
			}
			continue // null means absent: the default applies
		}
		val, err := paramValue(p.Type, v)
		if err != nil {
			l.attrErrorf(attr, "Invalid "+p.Type.String(), "The value of %q %s.%s", p.Name, err, paramDoc(t, p.Name))
			ok = false
			continue
		}
		params[p.Name] = val
	}
	return params, attrs, ok
}

// paramValue converts a decoded, known, non-null value to the Go type
// Params documents for t.
func paramValue(t shared.ParamType, v cty.Value) (any, error) {
	switch t {
	case shared.Number:
		return toFloat(v)
	case shared.Int:
		return toInt(v)
	case shared.Bool:
		return v.True(), nil
	case shared.String:
		return v.AsString(), nil
	case shared.Duration:
		return toDuration(v)
	}
	return nil, fmt.Errorf("has unknown parameter type %d", t)
}

// SeedParam is the parameter through which seeded component types take
// their random seed. When the router block sets seed, every component whose
// type declares an int parameter of this name, and whose block leaves it
// out, gets a seed derived from the router seed and the component's place in
// the file, so instances draw independent but reproducible sequences.
const SeedParam = "seed"

// withSeed returns p with a derived seed added when SeedParam applies; key
// identifies the component ("picker "p" of policy "kv"").
func (l *loader) withSeed(t *shared.TypeInfo, p shared.Params, key string) shared.Params {
	if l.bundle.Seed == nil || p.Has(SeedParam) {
		return p
	}
	if spec, ok := t.Param(SeedParam); !ok || spec.Type != shared.Int {
		return p
	}
	out := make(shared.Params, len(p)+1)
	for k, v := range p {
		out[k] = v
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	out[SeedParam] = *l.bundle.Seed ^ int64(h.Sum64())
	return out
}

// instantiate calls the type's constructor and checks that the instance
// implements the interface of its kind.
func (l *loader) instantiate(t *shared.TypeInfo, params shared.Params) (shared.Component, error) {
	if params == nil {
		params = t.WithDefaults(nil)
	}
	inst, err := t.New(shared.InstanceInfo{BlockSize: l.bundle.BlockSize}, params)
	if err != nil {
		return nil, err
	}
	if inst == nil {
		return nil, fmt.Errorf("type %q returned no instance; this is a bug in the type", t.Name)
	}
	var ok bool
	switch t.Kind {
	case shared.KindFilter:
		_, ok = inst.(shared.Filter)
	case shared.KindScorer:
		_, ok = inst.(shared.Scorer)
	case shared.KindPicker:
		_, ok = inst.(shared.Picker)
	case shared.KindClassifier:
		ok = true
	}
	if !ok {
		return nil, fmt.Errorf("type %q returned a %T, which does not implement %s; this is a bug in the type", t.Name, inst, t.Kind)
	}
	return inst, nil
}

// checkDeprecated warns when an instance declares the OCCUPANCY input.
func (l *loader) checkDeprecated(inst shared.Component, rng hcl.Range, where string) {
	if inst.Inputs()&shared.InputOccupancy == 0 {
		return
	}
	l.warnf(rng, "Deprecated input OCCUPANCY",
		"%s declares input OCCUPANCY, a deprecated alias of ACTIVE_REQUESTS that is removed in v2.0. It still works; update the component type to declare ACTIVE_REQUESTS.",
		capitalize(where))
}

// paramDoc is " NAME: DOC" for a documented parameter, or "".
func paramDoc(t *shared.TypeInfo, name string) string {
	p, ok := t.Param(name)
	if !ok || p.Doc == "" {
		return ""
	}
	return fmt.Sprintf(" %s (%s): %s", name, p.Type, p.Doc)
}

// exprText renders a literal attribute value for a diagnostic, or "the
// given value" for anything else.
func exprText(attr *hcl.Attribute) string {
	v, diags := attr.Expr.Value(nil)
	if diags.HasErrors() || !v.IsWhollyKnown() || v.IsNull() {
		return "the given value"
	}
	switch v.Type() {
	case cty.Number:
		f, _ := v.AsBigFloat().Float64()
		if !math.IsInf(f, 0) {
			return fmt.Sprint(f)
		}
		return v.AsBigFloat().Text('g', 10)
	case cty.String:
		return fmt.Sprintf("%q", v.AsString())
	case cty.Bool:
		return fmt.Sprint(v.True())
	}
	return "the given value"
}
