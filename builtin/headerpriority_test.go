package builtin

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/shared"
)

func TestHeaderPriorityClassify(t *testing.T) {
	defaults, err := NewHeaderPriority(nil)
	if err != nil {
		t.Fatal(err)
	}
	custom, err := NewHeaderPriority(shared.Params{
		ParamPriorityKey:     "Priority",
		ParamClassKey:        "tier",
		ParamDefaultClass:    "standard",
		ParamDefaultPriority: int64(-1),
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		h    *HeaderPriority
		md   map[string]string
		want shared.Classification
	}{
		{"nil metadata", defaults, nil, shared.Classification{}},
		{"lower-case keys", defaults, map[string]string{"x-priority": "5", "x-policy-class": "gold"},
			shared.Classification{Priority: 5, PolicyClass: "gold"}},
		{"canonical keys (net/http)", defaults, map[string]string{"X-Priority": "7", "X-Policy-Class": "batch"},
			shared.Classification{Priority: 7, PolicyClass: "batch"}},
		{"odd case", defaults, map[string]string{"x-PRIORITY": "-3", "X-POLICY-class": "bronze"},
			shared.Classification{Priority: -3, PolicyClass: "bronze"}},
		{"spaces trimmed", defaults, map[string]string{"x-priority": " 12 ", "x-policy-class": " gold "},
			shared.Classification{Priority: 12, PolicyClass: "gold"}},
		{"plus sign", defaults, map[string]string{"x-priority": "+2"}, shared.Classification{Priority: 2}},
		{"other headers only", defaults, map[string]string{"Content-Type": "application/json", "X-Prio": "9"},
			shared.Classification{}},
		{"custom defaults", custom, map[string]string{"x-priority": "5"},
			shared.Classification{Priority: -1, PolicyClass: "standard"}},
		{"custom keys (trace fields)", custom, map[string]string{"priority": "3", "tier": "premium"},
			shared.Classification{Priority: 3, PolicyClass: "premium"}},
		{"empty values take defaults", custom, map[string]string{"priority": "", "tier": "  "},
			shared.Classification{Priority: -1, PolicyClass: "standard"}},
		{"lower-case wins over canonical", defaults, map[string]string{"x-priority": "1", "X-Priority": "2"},
			shared.Classification{Priority: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.h.Classify(context.Background(), &shared.Request{ID: "r", Metadata: tt.md})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Classify (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHeaderPriorityInvalid(t *testing.T) {
	h, err := NewHeaderPriority(nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, value, wantErr string
	}{
		{"word", "high", `header-priority: invalid priority: metadata "x-priority" = "high" is not an integer`},
		{"float", "1.5", `header-priority: invalid priority: metadata "x-priority" = "1.5" is not an integer`},
		{"overflow", "99999999999999999999", `header-priority: invalid priority: metadata "x-priority" = "99999999999999999999" is out of range`},
		{"long value quoted short", strings.Repeat("z", 100),
			`header-priority: invalid priority: metadata "x-priority" = "` + strings.Repeat("z", 64) + `..." is not an integer`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &shared.Request{Metadata: map[string]string{"X-Priority": tt.value, "x-policy-class": "gold"}}
			got, err := h.Classify(context.Background(), req)
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
			if !errors.Is(err, ErrInvalidPriority) {
				t.Errorf("err does not wrap ErrInvalidPriority")
			}
			if got != (shared.Classification{}) {
				t.Errorf("classification on error = %+v, want zero", got)
			}
		})
	}
	// The classifier keeps serving after a bad request.
	got, err := h.Classify(context.Background(), &shared.Request{Metadata: map[string]string{"x-priority": "4"}})
	if err != nil || got.Priority != 4 {
		t.Errorf("after an error: %+v, %v", got, err)
	}
}

func TestHeaderPriorityParams(t *testing.T) {
	tests := []struct {
		name      string
		params    shared.Params
		wantParam string
	}{
		{"defaults", nil, ""},
		{"schema defaults", ptr(HeaderPriorityType()).WithDefaults(nil), ""},
		{"all set", shared.Params{ParamPriorityKey: "p", ParamClassKey: "c", ParamDefaultClass: "std.v1",
			ParamDefaultPriority: int64(10)}, ""},
		{"empty priority key", shared.Params{ParamPriorityKey: " "}, ParamPriorityKey},
		{"empty class key", shared.Params{ParamClassKey: ""}, ParamClassKey},
		{"bad default class", shared.Params{ParamDefaultClass: "gold class"}, ParamDefaultClass},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkNew(t, HeaderPriorityType(), tt.params, tt.wantParam) })
	}
}

func TestHeaderPriorityFactory(t *testing.T) {
	h, _ := NewHeaderPriority(nil)
	c, err := h.NewClassifier(shared.PartitionContext{Model: "m", Role: shared.RoleAggregated, BlockSize: 16})
	if err != nil || c != shared.Classifier(h) {
		t.Fatalf("NewClassifier = %v, %v; want the instance itself", c, err)
	}
	if h.Inputs() != 0 {
		t.Errorf("Inputs() = %v, want 0", h.Inputs())
	}
}

func TestHeaderPriorityNoAllocs(t *testing.T) {
	h, _ := NewHeaderPriority(nil)
	req := &shared.Request{Metadata: httpHeaders()}
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() { _, _ = h.Classify(ctx, req) }); n != 0 {
		t.Errorf("Classify allocates %v per call, want 0", n)
	}
}

// httpHeaders returns a realistic request's headers as serve passes them:
// canonical keys, with a priority and a class.
func httpHeaders() map[string]string {
	return map[string]string{
		"Accept":          "text/event-stream",
		"Authorization":   "Bearer sk-xxxxxxxx",
		"Content-Length":  "1834",
		"Content-Type":    "application/json",
		"Host":            "router.internal:8080",
		"User-Agent":      "openai-python/1.54.0",
		"X-Request-Id":    "9f1c2e7a-7d1b-4bb4-9a57-2d0c1f6a9e11",
		"X-Session-Id":    "conv-1234",
		"X-Priority":      "5",
		"X-Policy-Class":  "interactive",
		"Accept-Encoding": "gzip, deflate",
	}
}

func ptr[T any](v T) *T { return &v }
