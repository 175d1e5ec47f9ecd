package catalog

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/shared"
)

func TestDefaultNames(t *testing.T) {
	want := []string{
		builtin.TypeBusy,
		builtin.TypeCacheAware,
		builtin.TypeHeaderPriority,
		builtin.TypeKVAffinity,
		builtin.TypeKVCost,
		builtin.TypeLeastLoaded,
		builtin.TypeMinCost,
		builtin.TypeNormalizedScore,
		builtin.TypePowerOfTwo,
		builtin.TypePromptLengthClass,
		builtin.TypeRandom,
		builtin.TypeRoundRobin,
		builtin.TypeSessionAffinity,
		builtin.TypeSLO,
	}
	if diff := cmp.Diff(want, Default().Names(0)); diff != "" {
		t.Errorf("Default().Names(0) (-want +got):\n%s", diff)
	}
}

func TestDefaultKinds(t *testing.T) {
	want := map[string]shared.Kind{
		"busy":                shared.KindFilter,
		"cache-aware":         shared.KindPicker,
		"header-priority":     shared.KindClassifier,
		"kv-affinity":         shared.KindScorer,
		"kv-cost":             shared.KindScorer,
		"least-loaded":        shared.KindPicker,
		"min-cost":            shared.KindPicker,
		"normalized-score":    shared.KindScorer,
		"power-of-two":        shared.KindPicker,
		"prompt-length-class": shared.KindClassifier,
		"random":              shared.KindPicker,
		"round-robin":         shared.KindPicker,
		"session-affinity":    shared.KindClassifier,
		"slo":                 shared.KindFilter,
	}
	got := map[string]shared.Kind{}
	for _, e := range Default().Entries() {
		got[e.Name] = e.Kind
		if e.Source != SourceBuiltin || e.OutOfProcess {
			t.Errorf("%s: Source = %q, OutOfProcess = %v; want %q, false", e.Name, e.Source, e.OutOfProcess, SourceBuiltin)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kinds (-want +got):\n%s", diff)
	}
}

// TestDefaultConstructs checks every built-in builds with its schema
// defaults (plus a limit for busy and buckets for prompt-length-class) into
// an instance of its kind; a classifier factory also builds a partition's
// classifier, which classifies a request.
func TestDefaultConstructs(t *testing.T) {
	extra := map[string]shared.Params{
		"busy":                {"max_active_requests": int64(8)},
		"normalized-score":    {"signal": "queue"},
		"prompt-length-class": {"buckets": "short:1024,long"},
	}
	for _, e := range Default().Entries() {
		t.Run(e.Name, func(t *testing.T) {
			c, err := e.New(shared.InstanceInfo{}, e.WithDefaults(extra[e.Name]))
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			var ok bool
			switch e.Kind {
			case shared.KindFilter:
				_, ok = c.(shared.Filter)
			case shared.KindScorer:
				_, ok = c.(shared.Scorer)
			case shared.KindPicker:
				_, ok = c.(shared.Picker)
			case shared.KindClassifier:
				var f shared.ClassifierFactory
				if f, ok = c.(shared.ClassifierFactory); ok {
					checkClassifier(t, f)
				}
			}
			if !ok {
				t.Errorf("%T does not implement the %s interface", c, e.Kind)
			}
			if in := c.Inputs(); !e.Inputs.Has(in) {
				t.Errorf("instance inputs %v not within type inputs %v", in, e.Inputs)
			}
		})
	}
}

func TestDefaultUnknownListsSorted(t *testing.T) {
	_, err := Default().Lookup("nope")
	var u *UnknownTypeError
	if !errors.As(err, &u) {
		t.Fatalf("Lookup(nope) error = %v, want *UnknownTypeError", err)
	}
	want := []string{"busy", "cache-aware", "header-priority", "kv-affinity", "kv-cost", "least-loaded", "min-cost",
		"normalized-score", "power-of-two",
		"prompt-length-class", "random", "round-robin", "session-affinity", "slo"}
	if diff := cmp.Diff(want, u.Available); diff != "" {
		t.Errorf("Available (-want +got):\n%s", diff)
	}
	const msg = `unknown type "nope"; available: busy, cache-aware, header-priority, kv-affinity, kv-cost, least-loaded, ` +
		`min-cost, normalized-score, power-of-two, prompt-length-class, random, round-robin, session-affinity, slo`
	if err.Error() != msg {
		t.Errorf("error = %q, want %q", err, msg)
	}

	_, err = Default().LookupKind("nope", shared.KindPicker)
	if !errors.As(err, &u) {
		t.Fatalf("LookupKind(nope) error = %v, want *UnknownTypeError", err)
	}
	wantPickers := []string{"cache-aware", "least-loaded", "min-cost", "power-of-two", "random", "round-robin"}
	if diff := cmp.Diff(wantPickers, u.Available); diff != "" {
		t.Errorf("picker Available (-want +got):\n%s", diff)
	}

	_, err = Default().LookupKind("nope", shared.KindClassifier)
	if !errors.As(err, &u) {
		t.Fatalf("LookupKind(nope, classifier) error = %v, want *UnknownTypeError", err)
	}
	wantClassifiers := []string{"header-priority", "prompt-length-class", "session-affinity"}
	if diff := cmp.Diff(wantClassifiers, u.Available); diff != "" {
		t.Errorf("classifier Available (-want +got):\n%s", diff)
	}
	const cmsg = `unknown classifier type "nope"; available: header-priority, prompt-length-class, session-affinity`
	if err.Error() != cmsg {
		t.Errorf("error = %q, want %q", err, cmsg)
	}
	var wk *WrongKindError
	if _, err := Default().LookupKind("header-priority", shared.KindPicker); !errors.As(err, &wk) {
		t.Errorf("header-priority as a picker: error = %v, want *WrongKindError", err)
	}
}

// checkClassifier builds f's classifier for one partition and classifies a
// request with a session and metadata.
func checkClassifier(t *testing.T, f shared.ClassifierFactory) {
	t.Helper()
	c, err := f.NewClassifier(shared.PartitionContext{
		Model: "m", Role: shared.RoleAggregated, BlockSize: 16,
		Workers:  func() []shared.WorkerInfo { return []shared.WorkerInfo{{ID: 1, TotalKVBlocks: 100}} },
		Progress: func(string) (int64, bool) { return 0, false },
	})
	if err != nil {
		t.Fatalf("NewClassifier: %v", err)
	}
	req := &shared.Request{ID: "r", Model: "m", Role: shared.RoleAggregated, PromptTokens: 10, BlockSize: 16,
		SessionID: "s", Metadata: map[string]string{"X-Priority": "2"}}
	if _, err := c.Classify(context.Background(), req); err != nil {
		t.Errorf("Classify: %v", err)
	}
}

func TestDefaultIsIndependent(t *testing.T) {
	a := Default()
	if err := a.Register("plugin x", shared.TypeInfo{
		Name: "extra", Kind: shared.KindPicker,
		New: func(shared.InstanceInfo, shared.Params) (shared.Component, error) {
			return builtin.NewRoundRobin(), nil
		},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := Default().Lookup("extra"); err == nil {
		t.Error("a type registered in one Default() leaked into the next")
	}
	var dup *DuplicateError
	if err := Default().Register("plugin x", builtin.RandomType()); !errors.As(err, &dup) {
		t.Errorf("re-registering random: error = %v, want *DuplicateError", err)
	}
}
