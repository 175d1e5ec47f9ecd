package config

import (
	"fmt"
	"math"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

// FormatDiagnostics renders diags for the command line, one per line, sorted
// by position (file, line, column; diagnostics without a position last):
//
//	policy.hcl:12:5: error: Unsupported argument; An argument named "x" is not expected here.
//
// Newlines inside a detail are folded into spaces so each diagnostic stays
// on one line. The result ends with a newline unless diags is empty.
func FormatDiagnostics(diags hcl.Diagnostics) string {
	sorted := slices.Clone(diags)
	slices.SortStableFunc(sorted, compareDiagnostics)
	var b strings.Builder
	for _, d := range sorted {
		if d == nil {
			continue
		}
		if d.Subject != nil {
			b.WriteString(pos(*d.Subject))
			b.WriteString(": ")
		}
		if d.Severity == hcl.DiagWarning {
			b.WriteString("warning: ")
		} else {
			b.WriteString("error: ")
		}
		b.WriteString(oneLine(d.Summary))
		if d.Detail != "" {
			b.WriteString("; ")
			b.WriteString(oneLine(d.Detail))
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func compareDiagnostics(a, b *hcl.Diagnostic) int {
	switch {
	case a == nil || b == nil:
		return 0
	case a.Subject == nil && b.Subject == nil:
		return 0
	case a.Subject == nil:
		return 1
	case b.Subject == nil:
		return -1
	}
	ra, rb := a.Subject, b.Subject
	if c := strings.Compare(ra.Filename, rb.Filename); c != 0 {
		return c
	}
	if c := ra.Start.Line - rb.Start.Line; c != 0 {
		return c
	}
	return ra.Start.Column - rb.Start.Column
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// pos renders the start of r as file:line:col.
func pos(r hcl.Range) string {
	return fmt.Sprintf("%s:%d:%d", r.Filename, r.Start.Line, r.Start.Column)
}

func (l *loader) errorf(subject hcl.Range, summary, format string, args ...any) {
	l.diags = append(l.diags, &hcl.Diagnostic{
		Severity: hcl.DiagError,
		Summary:  summary,
		Detail:   fmt.Sprintf(format, args...),
		Subject:  subject.Ptr(),
	})
}

func (l *loader) warnf(subject hcl.Range, summary, format string, args ...any) {
	l.diags = append(l.diags, &hcl.Diagnostic{
		Severity: hcl.DiagWarning,
		Summary:  summary,
		Detail:   fmt.Sprintf(format, args...),
		Subject:  subject.Ptr(),
	})
}

// attrErrorf reports an error about an attribute's value: the subject is
// the value, the context the whole attribute.
func (l *loader) attrErrorf(attr *hcl.Attribute, summary, format string, args ...any) {
	l.diags = append(l.diags, &hcl.Diagnostic{
		Severity: hcl.DiagError,
		Summary:  summary,
		Detail:   fmt.Sprintf(format, args...),
		Subject:  attr.Expr.Range().Ptr(),
		Context:  attr.Range.Ptr(),
	})
}

// decodeAttr evaluates attr without variables or functions and converts it
// to ty. It reports why on failure. A null result is returned as is.
func (l *loader) decodeAttr(attr *hcl.Attribute, ty cty.Type) (cty.Value, bool) {
	v, diags := attr.Expr.Value(nil)
	l.diags = append(l.diags, diags...)
	if diags.HasErrors() {
		return cty.NilVal, false
	}
	v, err := convert.Convert(v, ty)
	if err != nil {
		l.attrErrorf(attr, "Incorrect attribute value type",
			"Inappropriate value for attribute %q: %s.", attr.Name, err)
		return cty.NilVal, false
	}
	if !v.IsWhollyKnown() {
		l.attrErrorf(attr, "Invalid attribute value", "The value of %q must be known when the file loads.", attr.Name)
		return cty.NilVal, false
	}
	return v, true
}

// nonNull decodes attr as ty and reports a null value.
func (l *loader) nonNull(attr *hcl.Attribute, ty cty.Type) (cty.Value, bool) {
	v, ok := l.decodeAttr(attr, ty)
	if !ok {
		return v, false
	}
	if v.IsNull() {
		l.attrErrorf(attr, "Invalid attribute value", "The value of %q must not be null; remove the attribute to use its default.", attr.Name)
		return v, false
	}
	return v, true
}

func (l *loader) stringAttr(attr *hcl.Attribute) (string, bool) {
	v, ok := l.nonNull(attr, cty.String)
	if !ok {
		return "", false
	}
	return v.AsString(), true
}

func (l *loader) intAttr(attr *hcl.Attribute) (int64, bool) {
	v, ok := l.nonNull(attr, cty.Number)
	if !ok {
		return 0, false
	}
	n, err := toInt(v)
	if err != nil {
		l.attrErrorf(attr, "Invalid integer", "The value of %q %s.", attr.Name, err)
		return 0, false
	}
	return n, true
}

func (l *loader) durationAttr(attr *hcl.Attribute) (time.Duration, bool) {
	v, ok := l.nonNull(attr, cty.String)
	if !ok {
		return 0, false
	}
	d, err := toDuration(v)
	if err != nil {
		l.attrErrorf(attr, "Invalid duration", "The value of %q %s.", attr.Name, err)
		return 0, false
	}
	return d, true
}

// toInt converts a known, non-null cty.Number to int64; the error reads
// after "The value of X".
func toInt(v cty.Value) (int64, error) {
	bf := v.AsBigFloat()
	if !bf.IsInt() {
		return 0, fmt.Errorf("must be a whole number, got %s", bf.Text('g', -1))
	}
	n, acc := bf.Int64()
	if acc != big.Exact {
		return 0, fmt.Errorf("is out of range: %s does not fit in 64 bits", bf.Text('g', -1))
	}
	return n, nil
}

// toFloat converts a known, non-null cty.Number to a finite float64.
func toFloat(v cty.Value) (float64, error) {
	f, _ := v.AsBigFloat().Float64()
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("is out of range: %s", v.AsBigFloat().Text('g', 10))
	}
	return f, nil
}

// toDuration parses a known, non-null cty.String as a Go duration.
func toDuration(v cty.Value) (time.Duration, error) {
	d, err := time.ParseDuration(v.AsString())
	if err != nil {
		return 0, fmt.Errorf("must be a duration such as \"20ms\", \"5s\" or \"1m30s\" (units ns, us, ms, s, m, h), got %q", v.AsString())
	}
	return d, nil
}

// duplicateKeys reports each key an object attribute (`env = { A = "x",
// A = "y" }`) writes more than once, at the later key, naming the first:
// HCL keeps the last silently. what names the map in the summary
// ("environment variable", "label"). It reads the expression as written,
// once (linear in its entries), and reports nothing for an expression
// that is not an object constructor (decoding reports that).
func (l *loader) duplicateKeys(attr *hcl.Attribute, what string) {
	pairs, diags := hcl.ExprMap(attr.Expr)
	if diags.HasErrors() {
		return
	}
	seen := make(map[string]hcl.Range, len(pairs))
	for _, kv := range pairs {
		k, d := kv.Key.Value(nil)
		if d.HasErrors() || !k.IsKnown() || k.IsNull() || k.Type() != cty.String {
			continue
		}
		key := k.AsString()
		if first, dup := seen[key]; dup {
			l.errorf(kv.Key.Range(), "Duplicate "+what,
				"%q is set twice in %s, first at %s; keep one of them.", key, attr.Name, pos(first))
			continue
		}
		seen[key] = kv.Key.Range()
	}
}
