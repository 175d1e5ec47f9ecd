package pluginwire

import (
	"math"
	"slices"
	"testing"
	"time"

	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
)

// Every value type the SDK documents survives the wire, an Int is accepted
// for a Number, and a mismatch names both types.
func TestValueRoundTrip(t *testing.T) {
	for _, c := range []struct {
		in   any
		want pluginv1.ParamType
		out  any
	}{
		{2.5, pluginv1.ParamType_PARAM_TYPE_NUMBER, 2.5},
		{int64(-3), pluginv1.ParamType_PARAM_TYPE_INT, int64(-3)},
		{7, pluginv1.ParamType_PARAM_TYPE_INT, int64(7)},
		{int64(4), pluginv1.ParamType_PARAM_TYPE_NUMBER, 4.0},
		{true, pluginv1.ParamType_PARAM_TYPE_BOOL, true},
		{"x", pluginv1.ParamType_PARAM_TYPE_STRING, "x"},
		{20 * time.Millisecond, pluginv1.ParamType_PARAM_TYPE_DURATION, 20 * time.Millisecond},
	} {
		v, err := ValueToProto(c.in)
		if err != nil {
			t.Fatalf("ValueToProto(%v): %v", c.in, err)
		}
		got, err := ValueFromProto(v, c.want)
		if err != nil || got != c.out {
			t.Errorf("%T %v as %s: got %T %v, %v; want %T %v", c.in, c.in, ParamTypeName(c.want), got, got, err, c.out, c.out)
		}
	}
	if _, err := ValueToProto([]int{1}); err == nil || err.Error() != "unsupported parameter value type []int" {
		t.Errorf("ValueToProto([]int): %v", err)
	}
	v, _ := ValueToProto("high")
	if _, err := ValueFromProto(v, pluginv1.ParamType_PARAM_TYPE_NUMBER); err == nil || err.Error() != "got a string value, want number" {
		t.Errorf("a string for a number: %v", err)
	}
	if _, err := ValueFromProto(&pluginv1.Value{}, pluginv1.ParamType_PARAM_TYPE_BOOL); err == nil || err.Error() != "empty value, want bool" {
		t.Errorf("an empty value: %v", err)
	}
	if got := ParamTypeName(99); got != "unknown" {
		t.Errorf("ParamTypeName(99) = %q", got)
	}
}

func TestClamp(t *testing.T) {
	if ClampU32(-1) != 0 || ClampU32(math.MaxInt) != math.MaxUint32 || ClampU32(42) != 42 {
		t.Errorf("ClampU32: %d %d %d", ClampU32(-1), ClampU32(math.MaxInt), ClampU32(42))
	}
	if ClampI32(math.MinInt) != math.MinInt32 || ClampI32(math.MaxInt) != math.MaxInt32 || ClampI32(-42) != -42 {
		t.Errorf("ClampI32: %d %d %d", ClampI32(math.MinInt), ClampI32(math.MaxInt), ClampI32(-42))
	}
}

// IsPanicMessage tells PanicMessage's answer from a component's own error,
// whatever the error says.
func TestPanicMessage(t *testing.T) {
	stages := []string{"filter", "scorer", "picker"}
	if msg := PanicMessage("scorer", `a "b"`, "boom"); msg != `scorer "a \"b\"" panicked: boom` || !IsPanicMessage(msg, stages...) {
		t.Errorf("PanicMessage = %q", msg)
	}
	for _, c := range []struct {
		msg  string
		want bool
	}{
		{`scorer "boom" panicked: boom`, true},
		{`filter "a b" panicked: runtime error: index out of range [3] with length 3`, true},
		{`picker "q\"x" panicked: nil`, true},
		{`scorer "boom": boom`, false},                   // a returned error
		{`scorer "boom": scorer "x" panicked: y`, false}, // one that quotes a panic
		{`classifier "c" panicked: x`, false},            // not one of the kinds
		{`scorer boom panicked: x`, false},               // the name unquoted
		{`scorer "unterminated panicked: x`, false},
		{`deadline passed before the task ran`, false},
	} {
		if got := IsPanicMessage(c.msg, stages...); got != c.want {
			t.Errorf("IsPanicMessage(%q) = %v, want %v", c.msg, got, c.want)
		}
	}
}

func TestTooLargeMessage(t *testing.T) {
	msg := TooLargeMessage(5000, 4096)
	if msg != "result of 5000 bytes exceeds the 4096-byte limit" || !IsTooLargeMessage(msg) {
		t.Errorf("TooLargeMessage = %q", msg)
	}
	for _, other := range []string{`scorer "s": result of 5000 bytes`, "result of a kind", "no workers"} {
		if IsTooLargeMessage(other) {
			t.Errorf("IsTooLargeMessage(%q) = true", other)
		}
	}
}

// Lists travel in their own Value cases, copied both ways; an empty list
// decodes as an empty, non-nil slice; a list of the other element type or
// a scalar is refused naming both; a non-finite number list is refused
// either way.
func TestListValues(t *testing.T) {
	in := []string{"a", "b"}
	v, err := ValueToProto(in)
	if err != nil {
		t.Fatal(err)
	}
	in[0] = "changed"
	got, err := ValueFromProto(v, pluginv1.ParamType_PARAM_TYPE_STRING_LIST)
	if err != nil || !slices.Equal(got.([]string), []string{"a", "b"}) {
		t.Fatalf("string list = %v, %v; want [a b]", got, err)
	}
	nv, err := ValueToProto([]float64{0.5, -2})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ValueFromProto(nv, pluginv1.ParamType_PARAM_TYPE_NUMBER_LIST); err != nil || !slices.Equal(got.([]float64), []float64{0.5, -2}) {
		t.Fatalf("number list = %v, %v", got, err)
	}
	empty := &pluginv1.Value{Kind: &pluginv1.Value_StringList{}}
	if got, err := ValueFromProto(empty, pluginv1.ParamType_PARAM_TYPE_STRING_LIST); err != nil || got.([]string) == nil || len(got.([]string)) != 0 {
		t.Fatalf("empty list = %#v, %v; want []string{}", got, err)
	}
	if _, err := ValueFromProto(nv, pluginv1.ParamType_PARAM_TYPE_STRING_LIST); err == nil || err.Error() != "got a list(number) value, want list(string)" {
		t.Errorf("mismatch: %v", err)
	}
	if _, err := ValueFromProto(v, pluginv1.ParamType_PARAM_TYPE_STRING); err == nil || err.Error() != "got a list(string) value, want string" {
		t.Errorf("list for a string: %v", err)
	}
	if _, err := ValueToProto([]float64{1, math.Inf(1)}); err == nil || err.Error() != "entry 1 of the number list is +Inf, want a finite number" {
		t.Errorf("Inf to the wire: %v", err)
	}
	bad := &pluginv1.Value{Kind: &pluginv1.Value_NumberList{NumberList: &pluginv1.NumberList{Values: []float64{math.NaN()}}}}
	if _, err := ValueFromProto(bad, pluginv1.ParamType_PARAM_TYPE_NUMBER_LIST); err == nil || err.Error() != "entry 0 of the number list is NaN, want a finite number" {
		t.Errorf("NaN from the wire: %v", err)
	}
}
