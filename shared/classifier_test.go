package shared

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
)

// classifyFunc adapts a function to Classifier.
type classifyFunc func(context.Context, *Request) (Classification, error)

func (f classifyFunc) Classify(ctx context.Context, req *Request) (Classification, error) {
	return f(ctx, req)
}

// The plugin side's guard around Classify: an error, a panic (logged with
// its stack) and a negative scheduling cost fail only that request, with
// the router's own message, and the classifier keeps serving.
func TestServerClassifyGuard(t *testing.T) {
	errBad := errors.New("bad header")
	tests := []struct {
		name    string
		c       classifyFunc
		want    Classification
		wantErr string
		wantIs  error
		panics  bool
	}{
		{"ok", func(context.Context, *Request) (Classification, error) {
			return Classification{Priority: 3, PolicyClass: "gold", Target: 7, HasTarget: true}, nil
		}, Classification{Priority: 3, PolicyClass: "gold", Target: 7, HasTarget: true}, "", nil, false},
		{"error", func(context.Context, *Request) (Classification, error) {
			return Classification{Priority: 9}, errBad
		}, Classification{}, `classifier hp: request "r1": bad header`, errBad, false},
		{"panic", func(context.Context, *Request) (Classification, error) {
			panic("boom")
		}, Classification{}, `classifier hp: request "r1": panic: boom`, nil, true},
		{"runtime error", func(_ context.Context, r *Request) (Classification, error) {
			var prio []int
			return Classification{Priority: prio[len(r.ID)]}, nil
		}, Classification{}, `classifier hp: request "r1": panic: runtime error: index out of range [2] with length 0`, nil, true},
		{"negative cost", func(context.Context, *Request) (Classification, error) {
			return Classification{SchedulingCostTokens: -1}, nil
		}, Classification{}, `classifier hp: request "r1": scheduling cost -1 tokens is negative`, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs strings.Builder
			s := newServer("v", nil, hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Error}))
			inst := &instance{name: "hp", kind: KindClassifier}
			got, err := s.classify(context.Background(), inst, tt.c, &Request{ID: "r1"})
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("classification (-want +got):\n%s", diff)
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("err = %v, want nil", err)
				}
				return
			}
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("errors.Is(err, %v) = false", tt.wantIs)
			}
			logged := strings.Contains(logs.String(), "classifier panicked") && strings.Contains(logs.String(), "classifier_test.go")
			if logged != tt.panics {
				t.Errorf("logged a panic with its stack: %v, want %v; logs:\n%s", logged, tt.panics, logs.String())
			}
			if tt.panics && !strings.Contains(logs.String(), `request=r1`) {
				t.Errorf("panic log does not name the request:\n%s", logs.String())
			}
		})
	}
}

// A classifier that panicked on one request still classifies the next.
func TestServerClassifyKeepsServing(t *testing.T) {
	c := classifyFunc(func(_ context.Context, r *Request) (Classification, error) {
		if r.ID == "bad" {
			panic("bad request")
		}
		return Classification{Priority: len(r.ID)}, nil
	})
	s := newServer("v", nil, nil)
	inst := &instance{name: "c", kind: KindClassifier}
	ctx := context.Background()
	if _, err := s.classify(ctx, inst, c, &Request{ID: "bad"}); err == nil {
		t.Fatal("panic not reported")
	}
	got, err := s.classify(ctx, inst, c, &Request{ID: "good"})
	if err != nil || got.Priority != 4 {
		t.Fatalf("after a panic: %+v, %v; want priority 4", got, err)
	}
}
