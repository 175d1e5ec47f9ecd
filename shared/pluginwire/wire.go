// Package pluginwire holds what both ends of the switchyard.plugin.v1
// connection must agree on beyond the generated code: parameter values on
// the wire, the narrowing of ints for the wire, and the wording of the task
// errors the SDK answers a panic or an over-size result with, which the
// router's client recognises. The SDK (package shared, the plugin side) and
// the router's client (package internal/pluginclient, in the router module)
// both import it; it imports only the generated protocol
// (shared/pluginproto), so neither end can drift from the other.
//
// It is a package of the SDK module (shared/go.mod) rather than an internal
// one because the router, another module, imports it. Plugin authors have
// no use for it: package shared converts for them. Its exported API follows
// the module's compatibility rule (docs/sdk.md).
package pluginwire

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
)

// ParamTypeName returns the schema name of a parameter type ("number",
// "int", "bool", "string", "duration", "list(string)", "list(number)"),
// or "unknown". The SDK's
// ParamType.String returns it: the numbering is the wire's.
func ParamTypeName(t pluginv1.ParamType) string {
	switch t {
	case pluginv1.ParamType_PARAM_TYPE_NUMBER:
		return "number"
	case pluginv1.ParamType_PARAM_TYPE_INT:
		return "int"
	case pluginv1.ParamType_PARAM_TYPE_BOOL:
		return "bool"
	case pluginv1.ParamType_PARAM_TYPE_STRING:
		return "string"
	case pluginv1.ParamType_PARAM_TYPE_DURATION:
		return "duration"
	case pluginv1.ParamType_PARAM_TYPE_STRING_LIST:
		return "list(string)"
	case pluginv1.ParamType_PARAM_TYPE_NUMBER_LIST:
		return "list(number)"
	}
	return "unknown"
}

// ValueToProto converts one parameter value. It accepts the Go types the
// SDK's Params documents (float64, int64, bool, string, time.Duration,
// []string, []float64) and, for convenience, int; any other type is an
// error naming it. A []float64 with a NaN or infinite entry is an error.
func ValueToProto(v any) (*pluginv1.Value, error) {
	switch v := v.(type) {
	case float64:
		return &pluginv1.Value{Kind: &pluginv1.Value_Number{Number: v}}, nil
	case int64:
		return &pluginv1.Value{Kind: &pluginv1.Value_Int{Int: v}}, nil
	case int:
		return &pluginv1.Value{Kind: &pluginv1.Value_Int{Int: int64(v)}}, nil
	case bool:
		return &pluginv1.Value{Kind: &pluginv1.Value_Bool{Bool: v}}, nil
	case string:
		return &pluginv1.Value{Kind: &pluginv1.Value_String_{String_: v}}, nil
	case time.Duration:
		return &pluginv1.Value{Kind: &pluginv1.Value_DurationNs{DurationNs: int64(v)}}, nil
	case []string:
		return &pluginv1.Value{Kind: &pluginv1.Value_StringList{StringList: &pluginv1.StringList{Values: slices.Clone(v)}}}, nil
	case []float64:
		if err := finiteList(v); err != nil {
			return nil, err
		}
		return &pluginv1.Value{Kind: &pluginv1.Value_NumberList{NumberList: &pluginv1.NumberList{Values: slices.Clone(v)}}}, nil
	}
	return nil, fmt.Errorf("unsupported parameter value type %T", v)
}

// ValueFromProto converts a wire value to the Go type of want (float64,
// int64, bool, string, time.Duration, []string or []float64; a list is a
// copy, never nil). A value of another kind is an error naming both (`got
// a string value, want number`); an Int is accepted for a Number. A
// number list with a NaN or infinite entry is an error naming its index.
func ValueFromProto(v *pluginv1.Value, want pluginv1.ParamType) (any, error) {
	switch k := v.GetKind().(type) {
	case *pluginv1.Value_Number:
		if want == pluginv1.ParamType_PARAM_TYPE_NUMBER {
			return k.Number, nil
		}
	case *pluginv1.Value_Int:
		switch want {
		case pluginv1.ParamType_PARAM_TYPE_INT:
			return k.Int, nil
		case pluginv1.ParamType_PARAM_TYPE_NUMBER:
			return float64(k.Int), nil
		}
	case *pluginv1.Value_Bool:
		if want == pluginv1.ParamType_PARAM_TYPE_BOOL {
			return k.Bool, nil
		}
	case *pluginv1.Value_String_:
		if want == pluginv1.ParamType_PARAM_TYPE_STRING {
			return k.String_, nil
		}
	case *pluginv1.Value_DurationNs:
		if want == pluginv1.ParamType_PARAM_TYPE_DURATION {
			return time.Duration(k.DurationNs), nil
		}
	case *pluginv1.Value_StringList:
		if want == pluginv1.ParamType_PARAM_TYPE_STRING_LIST {
			return append([]string{}, k.StringList.GetValues()...), nil
		}
	case *pluginv1.Value_NumberList:
		if want == pluginv1.ParamType_PARAM_TYPE_NUMBER_LIST {
			vs := append([]float64{}, k.NumberList.GetValues()...)
			if err := finiteList(vs); err != nil {
				return nil, err
			}
			return vs, nil
		}
	case nil:
		return nil, fmt.Errorf("empty value, want %s", ParamTypeName(want))
	}
	return nil, fmt.Errorf("got a %s value, want %s", valueKindName(v), ParamTypeName(want))
}

func valueKindName(v *pluginv1.Value) string {
	switch v.GetKind().(type) {
	case *pluginv1.Value_Number:
		return ParamTypeName(pluginv1.ParamType_PARAM_TYPE_NUMBER)
	case *pluginv1.Value_Int:
		return ParamTypeName(pluginv1.ParamType_PARAM_TYPE_INT)
	case *pluginv1.Value_Bool:
		return ParamTypeName(pluginv1.ParamType_PARAM_TYPE_BOOL)
	case *pluginv1.Value_String_:
		return ParamTypeName(pluginv1.ParamType_PARAM_TYPE_STRING)
	case *pluginv1.Value_DurationNs:
		return ParamTypeName(pluginv1.ParamType_PARAM_TYPE_DURATION)
	case *pluginv1.Value_StringList:
		return ParamTypeName(pluginv1.ParamType_PARAM_TYPE_STRING_LIST)
	case *pluginv1.Value_NumberList:
		return ParamTypeName(pluginv1.ParamType_PARAM_TYPE_NUMBER_LIST)
	}
	return "empty"
}

// finiteList reports the first NaN or infinite entry of vs.
func finiteList(vs []float64) error {
	for i, v := range vs {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("entry %d of the number list is %v, want a finite number", i, v)
		}
	}
	return nil
}

// ClampU32 narrows v to [0, MaxUint32] for the wire.
func ClampU32(v int) uint32 {
	switch {
	case v < 0:
		return 0
	case uint64(v) > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(v)
}

// ClampI32 narrows v to [MinInt32, MaxInt32] for the wire.
func ClampI32(v int) int32 {
	switch {
	case v < math.MinInt32:
		return math.MinInt32
	case v > math.MaxInt32:
		return math.MaxInt32
	}
	return int32(v)
}

// GrowTo returns b with length n, reallocating only when its capacity is
// too small (the contents are then zero).
func GrowTo[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// panicMark follows the kind and the quoted instance name in PanicMessage.
const panicMark = " panicked: "

// PanicMessage is the task error the SDK answers a component's panic with:
// `KIND "NAME" panicked: VALUE`. A component's own error is wrapped as
// `KIND "NAME": ...`, so IsPanicMessage never mistakes one for the other.
func PanicMessage(kind, name string, v any) string {
	return fmt.Sprintf("%s %q"+panicMark+"%v", kind, name, v)
}

// IsPanicMessage reports whether msg is a PanicMessage for one of kinds
// (the kind names a Decide stage can have).
func IsPanicMessage(msg string, kinds ...string) bool {
	kind, rest, ok := strings.Cut(msg, " ")
	if !ok || !slices.Contains(kinds, kind) {
		return false
	}
	name, err := strconv.QuotedPrefix(rest)
	return err == nil && strings.HasPrefix(rest[len(name):], panicMark)
}

// TooLargeMessage is the task error the SDK answers a result of size
// bytes with when it is over limit bytes, the most one message may carry.
func TooLargeMessage(size, limit int) string {
	return fmt.Sprintf("result of %d bytes exceeds the %d-byte limit", size, limit)
}

// IsTooLargeMessage reports whether msg is a TooLargeMessage.
func IsTooLargeMessage(msg string) bool {
	return strings.HasPrefix(msg, "result of ") && strings.HasSuffix(msg, "-byte limit")
}
