package shared

import (
	"fmt"
	"math"
	"time"

	"github.com/switchyard-router/switchyard/shared/pluginwire"
)

// ParamType is the type of one component parameter.
type ParamType uint8

// Parameter types. Values arrive in Params as float64 (Number), int64 (Int),
// bool (Bool), string (String), time.Duration (Duration, written as a Go
// duration string such as "20ms"), []string (StringList, written as an HCL
// list `["a", "b"]`) or []float64 (NumberList, `[0.5, 2]`, every entry
// finite).
const (
	Number ParamType = iota + 1
	Int
	Bool
	String
	Duration
	StringList
	NumberList
)

// String returns the type's schema name: "number", "int", "bool",
// "string", "duration", "list(string)", "list(number)", or "unknown".
func (t ParamType) String() string { return pluginwire.ParamTypeName(paramTypeToProto(t)) }

// ParamSpec declares one parameter of a component type: the schema the policy
// loader decodes HCL attributes against, and what `router plugins describe`
// prints.
type ParamSpec struct {
	Name     string
	Type     ParamType
	Required bool
	// Default is used when the attribute is absent; nil means no default.
	// Its Go type matches Type (float64, int64, bool, string, time.Duration,
	// []string, []float64).
	Default any
	// Doc states meaning, units and default for users.
	Doc string
}

// Params holds decoded parameter values by name, typed as ParamType says.
// Absent optional parameters without a default are missing from the map.
type Params map[string]any

// Float returns a Number (or Int) parameter, or def when absent.
func (p Params) Float(name string, def float64) float64 {
	switch v := p[name].(type) {
	case float64:
		return v
	case int64:
		return float64(v)
	}
	return def
}

// Int returns an Int parameter, or def when absent.
func (p Params) Int(name string, def int64) int64 {
	switch v := p[name].(type) {
	case int64:
		return v
	case float64:
		return int64(v)
	}
	return def
}

// Bool returns a Bool parameter, or def when absent.
func (p Params) Bool(name string, def bool) bool {
	if v, ok := p[name].(bool); ok {
		return v
	}
	return def
}

// String returns a String parameter, or def when absent.
func (p Params) String(name string, def string) string {
	if v, ok := p[name].(string); ok {
		return v
	}
	return def
}

// Duration returns a Duration parameter, or def when absent.
func (p Params) Duration(name string, def time.Duration) time.Duration {
	if v, ok := p[name].(time.Duration); ok {
		return v
	}
	return def
}

// Strings returns a StringList parameter, or def when absent. The slice is
// the Params' own: do not modify it.
func (p Params) Strings(name string, def []string) []string {
	if v, ok := p[name].([]string); ok {
		return v
	}
	return def
}

// Floats returns a NumberList parameter, or def when absent. The slice is
// the Params' own: do not modify it.
func (p Params) Floats(name string, def []float64) []float64 {
	if v, ok := p[name].([]float64); ok {
		return v
	}
	return def
}

// Has reports whether the parameter was given or defaulted.
func (p Params) Has(name string) bool { _, ok := p[name]; return ok }

// NonNegative returns a *ParamError unless v is finite and >= 0.
func NonNegative(name string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return &ParamError{Param: name, Err: fmt.Errorf("must be a finite number >= 0, got %v", v)}
	}
	return nil
}
