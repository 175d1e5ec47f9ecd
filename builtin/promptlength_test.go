package builtin

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/shared"
)

func TestPromptLengthClassBoundaries(t *testing.T) {
	c, err := NewPromptLengthClass(shared.Params{ParamBuckets: "short:1024,medium:8192,long"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		tokens int
		want   string
	}{
		{0, "short"}, {1, "short"}, {1024, "short"}, {1025, "medium"},
		{8192, "medium"}, {8193, "long"}, {1 << 30, "long"},
	}
	for _, tt := range tests {
		got, err := c.Classify(context.Background(), &shared.Request{PromptTokens: tt.tokens})
		if err != nil {
			t.Fatal(err)
		}
		if want := (shared.Classification{PolicyClass: tt.want}); got != want {
			t.Errorf("%d tokens: %+v, want %+v", tt.tokens, got, want)
		}
	}
	if got, _ := c.Classify(context.Background(), nil); got.PolicyClass != "short" {
		t.Errorf("nil request: class %q, want short", got.PolicyClass)
	}
	classes, bounds := c.Buckets()
	if diff := cmp.Diff([]string{"short", "medium", "long"}, classes); diff != "" {
		t.Errorf("classes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{1024, 8192}, bounds); diff != "" {
		t.Errorf("bounds (-want +got):\n%s", diff)
	}
	if pc, err := c.NewClassifier(shared.PartitionContext{}); err != nil || pc != shared.Classifier(c) {
		t.Errorf("NewClassifier = %v, %v; want the instance itself", pc, err)
	}
}

func TestPromptLengthClassParams(t *testing.T) {
	tests := []struct {
		name    string
		buckets any // nil: parameter absent
		wantErr string
	}{
		{"three", "short:1024,medium:8192,long", ""},
		{"one class", "all", ""},
		{"spaces", " short : 1024 , long ", ""},
		{"dotted names", "a.1:10,b_2:20,c-3", ""},
		{"absent", nil, `must list buckets`},
		{"empty", "  ", `must list buckets`},
		{"last bounded", "short:1024", `bucket 1 ("short:1024"): the last bucket takes every longer prompt and has no bound`},
		{"middle unbounded", "short,long", `bucket 1 ("short"): only the last bucket may omit its bound; write "short:TOKENS"`},
		{"not ascending", "a:100,b:100,c", `bucket 2 ("b:100"): bound 100 is not above the previous bound 100`},
		{"descending", "a:200,b:100,c", `bound 100 is not above the previous bound 200`},
		{"zero bound", "a:0,b", `bucket 1 ("a:0"): bound "0" is not an integer >= 1`},
		{"word bound", "a:lots,b", `bound "lots" is not an integer >= 1`},
		{"float bound", "a:1.5k,b", `bound "1.5k" is not an integer >= 1`},
		{"duplicate class", "a:100,a", `bucket 2 ("a"): class "a" is used twice`},
		{"bad name", "gold class:100,b", `class "gold class" is not a class name`},
		{"empty name", "a:100,,c", `bucket 2 (""): class "" is not a class name`},
		{"trailing comma", "a:100,", `bucket 2 (""): class "" is not a class name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := shared.Params{}
			if tt.buckets != nil {
				p[ParamBuckets] = tt.buckets
			}
			_, err := PromptLengthClassType().New(shared.InstanceInfo{}, p)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("New(%q): %v", tt.buckets, err)
				}
				return
			}
			var pe *shared.ParamError
			if !errors.As(err, &pe) || pe.Param != ParamBuckets {
				t.Fatalf("New(%q) error = %v, want *ParamError for buckets", tt.buckets, err)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error = %q, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestPromptLengthClassNoAllocs(t *testing.T) {
	c, _ := NewPromptLengthClass(shared.Params{ParamBuckets: "short:1024,medium:8192,long"})
	req := &shared.Request{PromptTokens: 5000}
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() { _, _ = c.Classify(ctx, req) }); n != 0 {
		t.Errorf("Classify allocates %v per call, want 0", n)
	}
}

// The bucket is chosen by the uncached part of the prompt.
func TestPromptLengthClassUsesUncachedTokens(t *testing.T) {
	c, err := NewPromptLengthClass(shared.Params{ParamBuckets: "short:1024,long"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		prompt, cached int
		want           string
	}{{2000, 0, "long"}, {2000, 976, "short"}, {2000, 975, "long"}, {100, 500, "short"}} {
		cl, err := c.Classify(context.Background(), &shared.Request{PromptTokens: tt.prompt, CachedPromptTokens: tt.cached})
		if err != nil || cl.PolicyClass != tt.want {
			t.Errorf("prompt %d cached %d: class %q (%v), want %q", tt.prompt, tt.cached, cl.PolicyClass, err, tt.want)
		}
	}
}
