package config

import (
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hcldec"
	"github.com/zclconf/go-cty/cty"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/shared"
)

// Attributes every component block takes besides its type's parameters
// (catalog.ValidParam refuses parameters of these names).
const (
	attrType   = catalog.AttrType
	attrWeight = catalog.AttrWeight
)

// compDecl is one decoded component block, instantiated later once per
// role its policy serves.
type compDecl struct {
	kind    shared.Kind
	name    string // block label; "" for the request classifier
	typ     string
	where   string // names the block in diagnostics; also its seed key
	entry   *catalog.Entry
	gone    []string // the failed plugins an unavailable type may come from
	params  shared.Params
	attrs   map[string]*hcl.Attribute
	weight  float64
	rng     hcl.Range
	builtin bool // a component of the built-in default policy
}

// decodeComponent decodes one filter, scorer, picker or request_classifier
// block: its type is looked up and its parameters are decoded against the
// type's schema. where names the block in diagnostics ("scorer "cost" of
// policy "kv""). It returns nil after reporting any error.
func (l *loader) decodeComponent(kind shared.Kind, blk *hcl.Block, name, where string) *compDecl {
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
		l.unresolved++
		return nil // "Missing required argument", reported by PartialContent
	}
	typ, ok := l.stringAttr(attr)
	if !ok {
		l.unresolved++
		return nil
	}
	entry, gone := l.lookup(typ, kind, attr, where)
	if entry == nil && gone == nil {
		l.unresolved++
		return nil
	}
	if entry != nil {
		l.usedSources[entry.Source] = true
	}
	c := &compDecl{kind: kind, name: name, typ: typ, where: where, entry: entry, gone: gone,
		weight: weight, rng: blk.DefRange}
	if entry != nil {
		// An unavailable type's parameters are not checked: its schema is
		// unknown.
		c.params, c.attrs, ok = l.decodeParams(&entry.TypeInfo, remain, where)
		if !ok {
			return nil
		}
	}
	if weight < 0 {
		return nil
	}
	return c
}

// seedKey is the key a derived seed hashes: where, prefixed with the role
// when there is one, so two roles' instances draw independently.
func seedKey(role shared.Role, where string) string {
	if role == "" {
		return where
	}
	return string(role) + " " + where
}

// instantiate builds c for role as instance instName. When configure is
// false (an out-of-process type in a policy no role reaches) the parameters
// are resolved but the type's constructor is not called, so the result has
// no Instance. It returns nil after reporting an error.
func (l *loader) instantiate(c *compDecl, role shared.Role, instName string, configure bool) *Component {
	out := &Component{
		Kind:         c.kind,
		Name:         c.name,
		Type:         c.typ,
		Weight:       c.weight,
		Range:        c.rng,
		InstanceName: instName,
	}
	if c.entry == nil {
		out.Source = "plugin " + c.gone[0]
		if len(c.gone) > 1 {
			out.Source = "plugins " + strings.Join(c.gone, ", ")
		}
		out.OutOfProcess, out.Unavailable = true, true
		out.Instance = newUnavailable(c.gone, c.typ)
		return out
	}
	t := &c.entry.TypeInfo
	out.Source, out.OutOfProcess = c.entry.Source, c.entry.OutOfProcess
	out.Params = c.entry.WithDefaults(l.withSeed(t, c.params, seedKey(role, c.where)))
	if !configure {
		return out
	}
	info := shared.InstanceInfo{Name: instName, Role: role, BlockSize: l.file.BlockSize}
	inst, err := newInstance(t, info, out.Params)
	if err != nil {
		l.reportNew(c, err)
		return nil
	}
	if c.builtin {
		l.checkDeprecated(inst, hcl.Range{Filename: l.filename, Start: hcl.InitialPos, End: hcl.InitialPos}, c.where)
	} else {
		l.checkDeprecated(inst, c.rng, c.where)
	}
	out.Instance = inst
	return out
}

// reportNew reports the error of c's constructor: each *shared.ParamError
// (several may be joined with errors.Join) at its attribute, or at the
// block when the parameter was not given, and anything else at the block.
func (l *loader) reportNew(c *compDecl, err error) {
	if c.builtin {
		l.errorf(hcl.Range{Filename: l.filename, Start: hcl.InitialPos, End: hcl.InitialPos}, "Default policy unavailable",
			"Building the default policy's %s %s failed: %v.", c.typ, c.kind, err)
		return
	}
	t := &c.entry.TypeInfo
	typ := fmt.Sprintf("type %q", c.typ)
	if c.entry.OutOfProcess {
		typ += " from " + sourceText(c.entry.Source)
	}
	var other []error
	for _, e := range flatten(err) {
		var pe *shared.ParamError
		if !errors.As(e, &pe) {
			other = append(other, e)
			continue
		}
		if a := c.attrs[pe.Param]; a != nil {
			l.attrErrorf(a, "Invalid parameter value", "%s (%s) refused %s = %s: %v.%s",
				capitalize(c.where), typ, pe.Param, exprText(a), pe.Err, paramDoc(t, pe.Param))
		} else {
			l.errorf(c.rng, "Invalid parameter value", "%s (%s) refused parameter %q: %v.%s",
				capitalize(c.where), typ, pe.Param, pe.Err, paramDoc(t, pe.Param))
		}
	}
	if len(other) > 0 {
		l.errorf(c.rng, "Invalid "+c.kind.String()+" configuration", "%s (%s): %v.",
			capitalize(c.where), typ, errors.Join(other...))
	}
}

// flatten splits an errors.Join tree into its leaves.
func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			if e != nil {
				out = append(out, flatten(e)...)
			}
		}
		return out
	}
	return []error{err}
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
// type that may come from a declared plugin. While a plugin with
// on_start_failure = "fallback" failed to start, an unknown type is not an
// error: lookup returns the names of those plugins instead of an entry.
func (l *loader) lookup(typ string, kind shared.Kind, attr *hcl.Attribute, where string) (*catalog.Entry, []string) {
	e, err := l.cat.LookupKind(typ, kind)
	if err == nil {
		return e, nil
	}
	var unknown *catalog.UnknownTypeError
	var wrong *catalog.WrongKindError
	isUnknown := errors.As(err, &unknown)
	if failed := l.failedFallback(); isUnknown && len(failed) > 0 {
		return nil, failed
	}
	switch {
	case isUnknown && len(l.plugins) > 0 && !l.started:
		l.attrErrorf(attr, "Plugin types not available",
			"%s uses type %q, which is not a built-in %s type. It may come from %s, but this load was not given a plugin host to start plugins with (config.Options.Plugins; the router command always passes one, tests may not). Built-in %s types: %s.",
			capitalize(where), typ, kind, l.pluginPlaces(l.plugins), kind, available(unknown.Available))
	case isUnknown && len(l.notStarted()) > 0:
		l.attrErrorf(attr, "Unknown "+kind.String()+" type",
			"%s uses type %q, which is not registered. It may come from %s, which did not start. Available %s types: %s.",
			capitalize(where), typ, l.pluginPlaces(l.notStarted()), kind, available(unknown.Available))
	case isUnknown:
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
	return nil, nil
}

// pluginPlaces renders plugins as `plugin "a" (f.hcl:2:1), plugin "b" (...)`.
func (l *loader) pluginPlaces(ps []*pluginDecl) string {
	var names []string
	for _, p := range ps {
		names = append(names, fmt.Sprintf("plugin %q (%s)", p.Name, pos(p.Range)))
	}
	return strings.Join(names, ", ")
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
	case shared.StringList, shared.NumberList:
		// Taken as written and checked entry by entry (paramValue):
		// cty's conversion of a tuple to a list is quadratic in its
		// length, and would turn numbers into strings.
		ty = cty.DynamicPseudoType
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

// MaxListEntries is the most entries a list(string) or list(number)
// parameter may hold (65,536): a policy file is at most 4 MiB, and a list
// longer than a fleet's workers many times over is a mistake; the bound
// keeps a component's Configure message and its decoding small.
const MaxListEntries = 1 << 16

// listValue converts a list(string) or list(number) attribute's value, a
// tuple or list as written, in one pass: each entry must be of the list's
// element type exactly (a number in a list(string) is an error, not
// converted), not null; at most MaxListEntries entries.
func listValue(t shared.ParamType, v cty.Value) (any, error) {
	elem, what := cty.String, "list(string)"
	if t == shared.NumberList {
		elem, what = cty.Number, "list(number)"
	}
	ty := v.Type()
	if !ty.IsTupleType() && !ty.IsListType() && !ty.IsSetType() {
		return nil, fmt.Errorf("must be a %s such as %s, got a %s", what, map[bool]string{true: `["a", "b"]`, false: "[1, 2.5]"}[t == shared.StringList], ty.FriendlyName())
	}
	n := v.LengthInt()
	if n > MaxListEntries {
		return nil, fmt.Errorf("has %d entries; a %s holds at most %d", n, what, MaxListEntries)
	}
	var strs []string
	var nums []float64
	if t == shared.StringList {
		strs = make([]string, 0, n)
	} else {
		nums = make([]float64, 0, n)
	}
	i := 0
	for it := v.ElementIterator(); it.Next(); i++ {
		_, e := it.Element()
		switch {
		case e.IsNull():
			return nil, fmt.Errorf("has a null entry %d; a %s holds %ss", i, what, elem.FriendlyName())
		case !e.Type().Equals(elem):
			return nil, fmt.Errorf("entry %d is a %s; a %s holds %ss", i, e.Type().FriendlyName(), what, elem.FriendlyName())
		case t == shared.StringList:
			strs = append(strs, e.AsString())
		default:
			f, err := toFloat(e)
			if err != nil {
				return nil, fmt.Errorf("entry %d %w", i, err)
			}
			nums = append(nums, f)
		}
	}
	if t == shared.StringList {
		return strs, nil
	}
	return nums, nil
}

// paramValue converts a decoded, known, non-null value to the Go type
// Params documents for t: a list(string) or list(number) attribute
// (`prefer = ["a", "b"]`) becomes a []string or []float64 in the order
// written (never nil; an empty list is empty), a null or out-of-range
// entry an error naming its index.
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
	case shared.StringList, shared.NumberList:
		return listValue(t, v)
	}
	return nil, fmt.Errorf("has unknown parameter type %d", t)
}

// SeedParam is the parameter through which seeded component types take
// their random seed. When the router block sets seed, every component whose
// type declares an int parameter of this name, and whose block leaves it
// out, gets a seed derived from the router seed, the role the instance
// serves and the component's place in the file, so instances (also two
// roles' instances of one policy) draw independent but reproducible
// sequences.
const SeedParam = "seed"

// withSeed returns p with a derived seed added when SeedParam applies; key
// identifies the instance ("decode picker "p" of policy "kv"", see seedKey).
//
// With Options.SeedOffset, a seed the block sets itself is moved by the
// offset too, so that every seeded component of the file draws a new
// sequence in each of `router replay --seeds`' runs.
func (l *loader) withSeed(t *shared.TypeInfo, p shared.Params, key string) shared.Params {
	if spec, ok := t.Param(SeedParam); !ok || spec.Type != shared.Int {
		return p
	}
	if p.Has(SeedParam) {
		own, ok := p[SeedParam].(int64)
		if !ok || l.opts.SeedOffset == 0 {
			return p
		}
		out := maps.Clone(p)
		out[SeedParam] = own + l.opts.SeedOffset
		return out
	}
	if l.file.Seed == nil {
		return p
	}
	out := make(shared.Params, len(p)+1)
	for k, v := range p {
		out[k] = v
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	out[SeedParam] = *l.file.Seed ^ int64(h.Sum64())
	return out
}

// newInstance calls the type's constructor and checks that the instance
// implements the interface of its kind.
func newInstance(t *shared.TypeInfo, info shared.InstanceInfo, params shared.Params) (shared.Component, error) {
	if params == nil {
		params = t.WithDefaults(nil)
	}
	inst, err := t.New(info, params)
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
