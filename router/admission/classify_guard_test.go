package admission

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/shared"
)

// classifyFunc adapts a function to Classifier.
type classifyFunc func(context.Context, *shared.Request) (shared.Classification, error)

func (f classifyFunc) Classify(ctx context.Context, req *shared.Request) (shared.Classification, error) {
	return f(ctx, req)
}

func TestSafeClassify(t *testing.T) {
	errBad := errors.New("bad header")
	req := &shared.Request{ID: "r1"}
	tests := []struct {
		name    string
		c       classifyFunc
		want    shared.Classification
		wantErr string
		wantIs  error
		panics  bool
	}{
		{"ok", func(context.Context, *shared.Request) (shared.Classification, error) {
			return shared.Classification{Priority: 3, PolicyClass: "gold", Target: 7, HasTarget: true}, nil
		}, shared.Classification{Priority: 3, PolicyClass: "gold", Target: 7, HasTarget: true}, "", nil, false},
		{"error", func(context.Context, *shared.Request) (shared.Classification, error) {
			return shared.Classification{Priority: 9}, errBad
		}, shared.Classification{}, `classifier hp: bad header`, errBad, false},
		{"panic", func(context.Context, *shared.Request) (shared.Classification, error) {
			panic("boom")
		}, shared.Classification{}, `classifier hp: panic: boom`, nil, true},
		{"runtime error", func(_ context.Context, r *shared.Request) (shared.Classification, error) {
			var prio []int
			return shared.Classification{Priority: prio[len(r.ID)]}, nil
		}, shared.Classification{}, `classifier hp: panic: runtime error: index out of range [2] with length 0`, nil, true},
		{"negative cost", func(context.Context, *shared.Request) (shared.Classification, error) {
			return shared.Classification{SchedulingCostTokens: -1}, nil
		}, shared.Classification{}, `classifier hp: scheduling cost -1 tokens is negative`, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := SafeClassify(context.Background(), "hp", tt.c, req)
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
			var ce *ClassifyError
			if !errors.As(err, &ce) {
				t.Fatalf("err is %T, want *ClassifyError", err)
			}
			if ce.RequestID != "r1" || ce.Classifier != "hp" {
				t.Errorf("ClassifyError = %+v", ce)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("errors.Is(err, %v) = false", tt.wantIs)
			}
			if tt.panics && (ce.Panic == nil || !strings.Contains(string(ce.Stack), "classify_guard_test.go")) {
				t.Errorf("panic %v with stack %q, want value and stack through the classifier", ce.Panic, ce.Stack)
			}
		})
	}
}

// TestSafeClassifyKeepsServing checks a classifier that panicked on one
// request still classifies the next.
func TestSafeClassifyKeepsServing(t *testing.T) {
	c := classifyFunc(func(_ context.Context, r *shared.Request) (shared.Classification, error) {
		if r.ID == "bad" {
			panic("bad request")
		}
		return shared.Classification{Priority: len(r.ID)}, nil
	})
	ctx := context.Background()
	if _, err := SafeClassify(ctx, "c", c, &shared.Request{ID: "bad"}); err == nil {
		t.Fatal("panic not reported")
	}
	got, err := SafeClassify(ctx, "c", c, &shared.Request{ID: "good"})
	if err != nil || got.Priority != 4 {
		t.Fatalf("after a panic: %+v, %v; want priority 4", got, err)
	}
	if _, err := SafeClassify(ctx, "c", c, nil); err == nil {
		t.Error("nil request: a nil-pointer panic should be reported")
	}
}

func TestSafeClassifyNoAllocs(t *testing.T) {
	c := classifyFunc(func(context.Context, *shared.Request) (shared.Classification, error) {
		return shared.Classification{Priority: 1}, nil
	})
	req := &shared.Request{ID: "r"}
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() { _, _ = SafeClassify(ctx, "c", c, req) }); n != 0 {
		t.Errorf("SafeClassify allocates %v per call, want 0", n)
	}
}
